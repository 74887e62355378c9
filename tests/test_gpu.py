"""On a GPU: the statistics stay on the device, and the noise scale is the CPU's.

The tests marked ``gpu`` need a GPU visible to TensorFlow and skip without
one (``tools/gpu_check.sh`` runs this file on a GPU machine with the GPU
stack, ``make setup-gpu``). Their CPU twins run everywhere: they read the
placement of the same ops back from TensorFlow's own log
(``tf.debugging.set_log_device_placement``) on the CPU, so the reading itself
is tested where no GPU is.

Every op that reads whole gradients for the statistics is created inside the
``squared_norms`` name scope (:func:`keras_adapt.ops.squared_norms`); the
compiled op has a CPU kernel only, so on a GPU the pure-TensorFlow twin must
run there instead, on the device that holds the gradients.
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TRAIN = r"""
import json, sys
import numpy as np
import tensorflow as tf

device, steps = sys.argv[1], int(sys.argv[2])
if device == "cpu":
    tf.config.set_visible_devices([], "GPU")
if len(sys.argv) > 3:
    tf.debugging.set_log_device_placement(True)
import keras
import keras_adapt
from keras_adapt.data import linear_regression

# lr = 0 holds the weights fixed: every step measures the gradient at the
# same point, so CPU and GPU runs see the same gradients up to rounding.
dim, batch = 16, 32
rng = np.random.default_rng(3)
w_true = rng.standard_normal(dim)
x, y = linear_regression(steps * batch, dim, w_true, seed=11)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.99,
                                       stats_interval=1)
model.compile(opt, "mse", jit_compile=False)
model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
result = {k: float(v) for k, v in opt.gradient_statistics.result().items()}
# Keras 3's variables hold the TensorFlow variable in .value
result["devices"] = sorted({getattr(v, "device", None) or v.value.device
                            for v in model.trainable_variables})
print("KERAS_ADAPT_RESULT " + json.dumps(result))
"""

#: ``... placer.cc:162] name: (OpType): /job:localhost/replica:0/task:0/device:GPU:0``:
#: one line per op placed in a function graph, as TensorFlow's placer logs it.
_PLACED = re.compile(r"(?:^|\] )([^\s:]+): \((\w+)\): (/job:\S+)$")


def _gpus():
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


needs_gpu = pytest.mark.skipif(not _gpus(), reason="no GPU visible to TensorFlow")


def _train(device, steps, log_placement=False):
    argv = [sys.executable, "-c", _TRAIN, device, str(steps)] + (["log"] if log_placement else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", PYTHONPATH=ROOT)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("KERAS_ADAPT_RESULT "))
    placed = [m.groups() for m in map(_PLACED.search, (proc.stdout + proc.stderr).splitlines())
              if m]
    return json.loads(line.split(" ", 1)[1]), placed


def _statistics_ops(placed):
    return [(name, kind, device) for name, kind, device in placed
            if "squared_norms/" in name and "device_probe" not in name]


def test_the_placement_of_the_statistics_is_read_from_tensorflow_on_the_cpu():
    result, placed = _train("cpu", 8, log_placement=True)
    stats = _statistics_ops(placed)
    assert placed and stats, "TensorFlow's placement log was not read"
    assert all(d.endswith("device:CPU:0") for _, _, d in stats), stats
    # on the CPU the compiled op, when it is built, is what reads the gradients
    from keras_adapt import ops

    kinds = {k for _, k, _ in stats}
    assert ("KerasAdaptSquaredNorms" in kinds) == (ops.implementation() == "native"), kinds
    assert all("CPU" in d for d in result["devices"])


@pytest.mark.gpu
@needs_gpu
def test_no_gradient_leaves_the_gpu_for_the_statistics():
    result, placed = _train("gpu", 8, log_placement=True)
    assert all("GPU" in d for d in result["devices"]), result["devices"]
    stats = _statistics_ops(placed)
    assert stats, "TensorFlow's placement log was not read"
    # the compiled op has a CPU kernel only: it must not be in the graph at all
    assert not [s for s in stats if s[1] == "KerasAdaptSquaredNorms"], stats
    squares = [s for s in stats if s[1] in ("Square", "Sum", "Cast", "Pack", "AddN")]
    assert squares and all(d.endswith("device:GPU:0") for _, _, d in squares), squares


@pytest.mark.gpu
@needs_gpu
def test_the_noise_scale_on_the_gpu_equals_the_cpus():
    cpu, _ = _train("cpu", 300)
    gpu, _ = _train("gpu", 300)
    assert cpu["updates"] == gpu["updates"] == 299
    for key in ("grad_sqr", "grad_var", "gns"):
        assert gpu[key] == pytest.approx(cpu[key], rel=1e-3), (key, cpu[key], gpu[key])
