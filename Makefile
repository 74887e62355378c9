# keras-adapt: two stacks, each in its own virtual environment.
#   primary: .venv         TensorFlow 2.18.1 + Keras 3
#   legacy:  .venv-keras2  TensorFlow 2.15.1 + tf.keras 2.15
# Each gets Horovod 0.28.1 compiled against its own TensorFlow, then
# keras-adapt installed editable (which compiles csrc/ for that TensorFlow).

PYTHON ?= python3
VENV := .venv
VENV2 := .venv-keras2
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

OPS_SRC := $(wildcard csrc/*.cc) setup.py

.PHONY: setup setup-primary setup-legacy demo test test-primary test-legacy test-install bench clean

setup: setup-primary setup-legacy

setup-primary: $(VENV)/.ready
setup-legacy: $(VENV2)/.ready

$(VENV)/.ready: requirements/primary.txt tools/setup_stack.sh $(OPS_SRC)
	PYTHON=$(PYTHON) bash tools/setup_stack.sh $(VENV) requirements/primary.txt
	touch $@

$(VENV2)/.ready: requirements/legacy.txt tools/setup_stack.sh $(OPS_SRC)
	PYTHON=$(PYTHON) bash tools/setup_stack.sh $(VENV2) requirements/legacy.txt
	touch $@

# The main example on two local workers (Gloo).
demo: setup-primary
	$(VENV)/bin/python examples/run_demo.py

# The whole suite on the primary stack, then the op, optimizer, monitor and
# distributed tests on the legacy stack, then keras-adapt installed from its
# sdist-built wheel (not the editable checkout) on both stacks.
test: setup
	$(MAKE) test-primary test-legacy test-install

test-primary: setup-primary
	$(VENV)/bin/python -m pytest tests

test-legacy: setup-legacy
	$(VENV2)/bin/python -m pytest tests -m "not primary_only"

test-install: setup
	bash tools/check_install.sh $(VENV)
	bash tools/check_install.sh $(VENV2)

bench: setup
	$(VENV)/bin/python benchmarks/monitor_overhead.py
	$(VENV2)/bin/python benchmarks/monitor_overhead.py
	$(VENV)/bin/python benchmarks/time_to_accuracy.py
	$(VENV2)/bin/python benchmarks/time_to_accuracy.py

clean:
	rm -rf $(VENV) $(VENV2) build *.egg-info keras_adapt/ops/_keras_adapt_ops_*.so
