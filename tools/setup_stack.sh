#!/usr/bin/env bash
# Builds one keras-adapt stack into a virtual environment:
#   tools/setup_stack.sh VENV REQUIREMENTS_FILE
# 1. the venv with TensorFlow and the test tools (requirements file),
# 2. Horovod 0.28.1 compiled from source against *that* TensorFlow
#    (--no-build-isolation so the build sees the same headers and ABI),
# 3. keras-adapt itself, editable, which compiles csrc/ into the op library.
# Each step is skipped when already done, so a second run is fast.
set -euo pipefail
venv=$1
req=$2
python=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
HOROVOD_VERSION=0.28.1

log() { printf '\n[setup %s] %s\n' "$venv" "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment"
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
export PATH="$PWD/$venv/bin:$PATH"

req_stamp="$venv/.requirements.sha"
req_sum=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$req_sum" ]; then
  log "installing $req"
  "$py" -m pip install -q --upgrade "pip>=23.2" "setuptools==69.5.1" wheel
  "$py" -m pip install -q -r "$req"
  echo "$req_sum" > "$req_stamp"
fi

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

if ! "$py" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  command -v cmake >/dev/null 2>&1 || "$py" -m pip install -q cmake
  with_mpi=0 mpi_flag=HOROVOD_WITHOUT_MPI=1
  if command -v mpicc >/dev/null 2>&1; then with_mpi=1 mpi_flag=HOROVOD_WITH_MPI=1; fi
  log "building horovod==$HOROVOD_VERSION from source (MPI=$with_mpi); this takes a few minutes"
  # --no-cache-dir: a wheel cached from the other stack was built against a
  # different TensorFlow and must never be reused here.
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
  HOROVOD_WITHOUT_MXNET=1 env "$mpi_flag" \
  MAKEFLAGS="-j$(nproc)" \
    "$py" -m pip install -q --no-build-isolation --no-cache-dir "horovod==$HOROVOD_VERSION"
  log "horovodrun --check-build"
  "$venv/bin/horovodrun" --check-build
fi

log "installing keras-adapt (editable; compiles csrc/)"
"$py" -m pip install -q --no-build-isolation --no-deps -e .
"$py" -c "import keras_adapt.ops as o; print('[setup] op implementation:', o.implementation())"
