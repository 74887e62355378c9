#!/usr/bin/env bash
# Builds one keras-adapt stack into a virtual environment:
#   tools/setup_stack.sh VENV REQUIREMENTS_FILE
# 1. the venv with TensorFlow and the test tools (requirements file and the
#    files it includes with -r),
# 2. Horovod 0.28.1 compiled against *that* TensorFlow by `keras-adapt
#    build-horovod` (the command users run; see
#    keras_adapt/horovod_build/patches/README.md for the patches),
# 3. keras-adapt itself, editable, which compiles csrc/ into the op library.
# Each step is skipped when already done, so a second run is fast; when the
# installed TensorFlow changes (the requirements moved it), Horovod and the op
# library are rebuilt.
set -euo pipefail
venv=$1
req=$2
python=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
root=$(cd "$(dirname "$0")/.." && pwd)

log() { printf '\n[setup %s %s] %s\n' "$venv" "$(date +%T)" "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment"
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
export PATH="$(cd "$venv" && pwd)/bin:$PATH"   # VENV may be relative or absolute

# The requirements file and the files it includes (-r, relative to it).
req_files() {
  echo "$req"
  sed -n 's/^-r[[:space:]]*//p' "$req" | while read -r inc; do echo "$(dirname "$req")/$inc"; done
}
req_stamp="$venv/.requirements.sha"
req_sum=$(req_files | xargs cat | sha256sum | cut -d' ' -f1)
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$req_sum" ]; then
  log "installing $req"
  "$py" -m pip install -q --upgrade "pip>=23.2" "setuptools==69.5.1" wheel
  "$py" -m pip install -q -r "$req"
  echo "$req_sum" > "$req_stamp"
fi

# The Debian packages below are installed by one stack at a time: make setup
# builds the two stacks side by side, and dpkg takes one install at a time.
exec 9>"${TMPDIR:-/tmp}/keras-adapt-setup-debian.lock"
flock 9

# OpenMPI gives Horovod its MPI controller in addition to Gloo. Installed from
# Debian when we are root and it is missing; otherwise Gloo only.
if ! command -v mpicc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing OpenMPI from Debian (openmpi-bin libopenmpi-dev)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null \
      || log "OpenMPI could not be installed; Horovod will be built with Gloo only"
  else
    log "mpicc not found and not root: Horovod will be built with Gloo only"
  fi
fi

# Debian's chromium for the end-to-end test of the TensorBoard tab
# (tests/test_browser.py drives it with playwright). Installed when we are
# root and it is missing; otherwise that test skips and says why.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing chromium from Debian (browser test of the TensorBoard tab)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || log "chromium could not be installed; tests/test_browser.py will skip"
  else
    log "/usr/bin/chromium not found and not root: tests/test_browser.py will skip"
  fi
fi

# Debian's openssh-server for the emulated-hosts tests (tools/emulated_hosts.py
# starts one sshd per network namespace, so that horovodrun starts its workers
# over ssh exactly as on a cluster). Installed when we are root and it is
# missing; otherwise those tests skip and say why. Its service is not started.
if [ ! -x /usr/sbin/sshd ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing openssh-server from Debian (multi-host tests on emulated hosts)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; } \
      || log "openssh-server could not be installed; the emulated-hosts tests will skip"
  else
    log "/usr/sbin/sshd not found and not root: the emulated-hosts tests will skip"
  fi
fi

# Debian's Slurm (22.05: slurmctld, slurmd, the client commands) and munge for
# tests/test_slurm.py (tools/emulated_slurm.py runs the controller here and one
# slurmd per emulated host, with its own scratch configuration and munge key).
# Installed when we are root and it is missing; otherwise that test skips and
# says why. A service an init script started on installing is stopped again:
# the tests start their own daemons and stop them.
if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Slurm and munge from Debian (slurmctld slurmd slurm-client munge)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; } \
      || log "Slurm could not be installed; tests/test_slurm.py will skip its Slurm jobs"
    for service in slurmctld slurmd munge; do
      if command -v service >/dev/null 2>&1; then service "$service" stop >/dev/null 2>&1 || true; fi
    done
  else
    log "/usr/sbin/slurmctld, slurmd or munged not found and not root: tests/test_slurm.py will skip its Slurm jobs"
  fi
fi
flock -u 9

# Horovod, built by the command keras-adapt ships (`keras-adapt build-horovod`,
# run from this checkout before keras-adapt is installed): it downloads the
# sdist, applies keras_adapt/horovod_build/patches/, builds against this
# environment's TensorFlow (Gloo, MPI when mpicc exists, NCCL for a GPU
# TensorFlow with CUDA and NCCL), verifies and records the build in
# VENV/share/keras-adapt/horovod-build.json. It does nothing when that record
# matches the TensorFlow, the patches and the options.
log "Horovod (keras-adapt build-horovod)"
PYTHONPATH="$root" "$py" -m keras_adapt build-horovod

# The op library's name carries only TensorFlow's major.minor: after any
# change of TensorFlow, build it again.
tf_version=$("$py" -c "import tensorflow as tf; print(tf.__version__)")
if [ "$(cat "$venv/.ops-tensorflow" 2>/dev/null)" != "$tf_version" ]; then
  rm -f "$root"/keras_adapt/ops/_keras_adapt_ops_tf"$(echo "$tf_version" | cut -d. -f1-2 | tr . _)"*.so
fi

# Both stacks compile csrc/ in this checkout: one at a time.
exec 8>"${TMPDIR:-/tmp}/keras-adapt-setup-ops.lock"
flock 8
log "installing keras-adapt (editable; compiles csrc/)"
"$py" -m pip install -q --no-build-isolation --no-deps -e .
"$py" -c "import keras_adapt.ops as o; print('[setup] op implementation:', o.implementation())"
echo "$tf_version" > "$venv/.ops-tensorflow"
