#!/usr/bin/env bash
# Builds one keras-adapt stack into a virtual environment:
#   tools/setup_stack.sh VENV REQUIREMENTS_FILE
# 1. the venv with TensorFlow and the test tools (requirements file and the
#    files it includes with -r),
# 2. Horovod 0.28.1 compiled against *that* TensorFlow from its source
#    distribution with tools/horovod-patches/*.patch applied (so it builds on
#    TensorFlow >= 2.19; see tools/horovod-patches/README.md), installed with
#    --no-build-isolation so the build sees the same headers and ABI,
# 3. keras-adapt itself, editable, which compiles csrc/ into the op library.
# Each step is skipped when already done, so a second run is fast. The
# TensorFlow version Horovod was built against is kept in VENV/.horovod-build;
# when the installed TensorFlow differs (the requirements moved it), Horovod
# and the op library are rebuilt.
set -euo pipefail
venv=$1
req=$2
python=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
HOROVOD_VERSION=0.28.1
patches=$(cd "$(dirname "$0")/horovod-patches" && pwd)

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
flock -u 9

tf_version=$("$py" -c "import tensorflow as tf; print(tf.__version__)")
hvd_stamp="$venv/.horovod-build"
# A venv from before the stamp existed: its Horovod was built against the
# TensorFlow installed then, which is the current one if TensorFlow has not
# been reinstalled since Horovod was (pip writes INSTALLER at install time).
if [ ! -f "$hvd_stamp" ] && "$py" - <<'PY' 2>/dev/null
import importlib.metadata as md, os, sys
def installed(dist):
    return max(os.path.getmtime(f.locate()) for f in md.distribution(dist).files if f.name == "INSTALLER")
def has(dist):
    try:
        md.distribution(dist)
        return True
    except md.PackageNotFoundError:
        return False
tf = max(installed(d) for d in ("tensorflow", "tensorflow-cpu") if has(d))
sys.exit(0 if installed("horovod") > tf else 1)
PY
then
  echo "tensorflow $tf_version" > "$hvd_stamp"
fi
built_for=$(sed -n 's/^tensorflow //p' "$hvd_stamp" 2>/dev/null || true)

rebuild=""
if ! "$py" -c "import horovod" >/dev/null 2>&1; then
  rebuild="not installed"
elif [ "$built_for" != "$tf_version" ]; then
  rebuild="built against TensorFlow ${built_for:-installed before the current one}, which is now $tf_version"
elif ! "$py" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  rebuild="horovod.tensorflow does not import"
fi

if [ -n "$rebuild" ]; then
  command -v cmake >/dev/null 2>&1 || "$py" -m pip install -q cmake
  with_mpi=0 mpi_flag=HOROVOD_WITHOUT_MPI=1
  if command -v mpicc >/dev/null 2>&1; then with_mpi=1 mpi_flag=HOROVOD_WITH_MPI=1; fi
  if [ "$rebuild" != "not installed" ]; then
    # The op library of this TensorFlow minor version may be from the old
    # TensorFlow too (its name carries only major_minor): build it again.
    log "Horovod: $rebuild; rebuilding it and the op library"
    rm -f keras_adapt/ops/_keras_adapt_ops_tf"$(echo "$tf_version" | cut -d. -f1-2 | tr . _)"*.so
  fi
  rm -f "$hvd_stamp"
  src=$(mktemp -d "${TMPDIR:-/tmp}/horovod-src.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  log "downloading the horovod==$HOROVOD_VERSION source distribution"
  # --no-cache-dir throughout: a wheel cached from another stack was built
  # against a different TensorFlow and must never be reused here.
  "$py" -m pip download -q --no-cache-dir --no-deps --no-binary :all: -d "$src" "horovod==$HOROVOD_VERSION"
  tar -xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
  for p in "$patches"/*.patch; do
    log "applying $(basename "$p")"
    if command -v patch >/dev/null 2>&1; then
      patch -d "$src/horovod-$HOROVOD_VERSION" -p1 --forward --quiet < "$p"
    else  # no `patch` installed: git applies a unified diff outside a repository too
      (cd "$src/horovod-$HOROVOD_VERSION" && git apply -p1) < "$p"
    fi
  done
  log "building horovod==$HOROVOD_VERSION against TensorFlow $tf_version (MPI=$with_mpi); this takes a few minutes"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
  HOROVOD_WITHOUT_MXNET=1 env "$mpi_flag" \
  MAKEFLAGS="-j$(nproc)" \
    "$py" -m pip install -q --no-build-isolation --no-cache-dir --force-reinstall --no-deps \
    "$src/horovod-$HOROVOD_VERSION"
  rm -rf "$src"
  echo "tensorflow $tf_version" > "$hvd_stamp"
  echo "patches $(cd "$patches" && ls *.patch | tr '\n' ' ')" >> "$hvd_stamp"
  log "horovodrun --check-build"
  "$venv/bin/horovodrun" --check-build
fi

# Both stacks compile csrc/ in this checkout: one at a time.
exec 8>"${TMPDIR:-/tmp}/keras-adapt-setup-ops.lock"
flock 8
log "installing keras-adapt (editable; compiles csrc/)"
"$py" -m pip install -q --no-build-isolation --no-deps -e .
"$py" -c "import keras_adapt.ops as o; print('[setup] op implementation:', o.implementation())"
