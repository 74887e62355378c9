#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and the GPU stack
# (`make setup-gpu`, or your own environment with tensorflow[and-cuda] and
# `keras-adapt build-horovod`):
#   tools/gpu_check.sh [PYTHON]        default: .venv-gpu/bin/python
# 1. TensorFlow sees a GPU, and Horovod was built with NCCL;
# 2. tests/test_gpu.py: no gradient leaves the GPU for the statistics (the
#    placement read from TensorFlow's log), and the noise scale on the GPU
#    equals the CPU one for the same model and data;
# 3. benchmarks/monitor_overhead.py on one GPU (table and JSON line).
# About 5 minutes; it stops at the first failure and at 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-.venv-gpu/bin/python}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
log() { printf '\n[gpu-check %s] %s\n' "$(date +%T)" "$*"; }
start=$(date +%s)

log "TensorFlow's GPUs and Horovod's build"
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$py" - <<'PY'
import sys
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("TensorFlow", tf.__version__, "GPUs:", [g.name for g in gpus],
      "CUDA", tf.sysconfig.get_build_info().get("cuda_version"))
if not gpus:
    sys.exit("no GPU visible to TensorFlow: tools/gpu_check.sh needs one (check the driver "
             "with nvidia-smi, and that TensorFlow is the GPU wheel: tensorflow[and-cuda])")
import horovod.tensorflow as hvd
if not hvd.nccl_built():
    sys.exit("Horovod was built without NCCL; run `keras-adapt build-horovod --force` in this "
             "environment (it builds NCCL when it finds CUDA and NCCL)")
print("Horovod NCCL:", hvd.nccl_built())
PY

log "tests/test_gpu.py"
timeout 420 "$py" -m pytest -p no:cacheprovider -v -rs tests/test_gpu.py

log "benchmarks/monitor_overhead.py on one GPU"
timeout $((600 - ($(date +%s) - start))) \
  "$py" benchmarks/monitor_overhead.py --np 1 --gpu --rounds 4 --steps 60

log "done in $(( $(date +%s) - start )) s"
