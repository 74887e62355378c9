#!/usr/bin/env bash
# Checks keras-adapt as a user installs it, not as an editable checkout:
#   tools/check_install.sh VENV
# 1. builds the sdist from this checkout,
# 2. builds a wheel from that sdist (compiling csrc/ against VENV's TensorFlow),
# 3. installs the wheel into a new environment that already has TensorFlow
#    and Horovod (VENV's site-packages, chained by a .pth file; VENV's
#    editable keras-adapt stays invisible there, because .pth files of a
#    chained directory are not run),
# 4. runs the install tests (every module of the checkout imports from the
#    wheel, the op library loads, TensorBoard finds the plugin and its frontend,
#    the command is installed) and one 2-worker job there (the distributed
#    checks under Gloo on localhost; `make test` runs the rest), from a
#    directory outside the checkout,
# 5. with --user-env: the path of a user with their own environment
#    (tests/test_user_install.py): a new environment with only the stack's
#    tensorflow-cpu from PyPI, the wheel, `keras-adapt build-horovod`, the
#    adaptive-batch example on 2 workers, and each extra in an environment of
#    its own with the feature it enables.
set -euo pipefail
venv=$(cd "$1" && pwd)
user_env=${2:-}
if [ -n "$user_env" ] && [ "$user_env" != "--user-env" ]; then
  echo "usage: tools/check_install.sh VENV [--user-env]" >&2; exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
py="$venv/bin/python"
work=$(mktemp -d "${TMPDIR:-/tmp}/keras-adapt-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

log() { printf '\n[check-install %s] %s\n' "$(basename "$venv")" "$*"; }

log "building the sdist"
# setup.py writes its egg-info next to itself: build from a copy of the
# checkout's files (tracked or new, never ignored ones such as built libraries).
mkdir -p "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard \
  | (cd "$root" && xargs -0 cp --parents -t "$work/src")
(cd "$work/src" && "$py" setup.py -q sdist -d "$work/dist" >/dev/null)
sdist=$(ls "$work"/dist/keras_adapt-*.tar.gz)

log "building a wheel from $(basename "$sdist")"
KERAS_ADAPT_REQUIRE_OPS=1 "$py" -m pip wheel -q --no-build-isolation --no-deps \
  -w "$work/dist" "$sdist"
wheel=$(ls "$work"/dist/keras_adapt-*.whl)

log "installing $(basename "$wheel") into a new environment with the stack's TensorFlow and Horovod"
"$py" -m venv "$work/env"
site=$("$work/env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/keras_adapt_stack.pth"
"$work/env/bin/python" -m pip install -q --no-deps --no-index "$wheel"
ln -s "$venv/bin/horovodrun" "$work/env/bin/horovodrun"

log "testing the installed package (outside the checkout)"
cd "$work"
KERAS_ADAPT_TEST_INSTALLED=1 KERAS_ADAPT_CHECKOUT="$root" \
  "$work/env/bin/python" -m pytest -p no:cacheprovider -q \
  "$root/tests/test_install.py" "$root/tests/test_distributed.py" \
  -k "not test_distributed or (gloo and not emulated)"   # one 2-worker job (Gloo, localhost)

if [ -n "$user_env" ]; then
  log "a user's environment: tensorflow-cpu alone, the wheel, keras-adapt build-horovod, the extras"
  KERAS_ADAPT_WHEEL="$wheel" "$py" -m pytest -p no:cacheprovider -q "$root/tests/test_user_install.py"
fi
