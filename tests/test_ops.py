"""The fused squared-norm op against numpy, its twin, and the loader's choices."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_adapt import ops
from keras_adapt.ops import _loader

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (64, 33), (300, 700), (3, 4, 5, 6)]
DTYPES = [tf.float32, tf.float16, tf.bfloat16]


def _numpy_truth(tensors):
    per = [float(np.sum(np.square(t.numpy().astype(np.float64)))) for t in tensors]
    return np.array(per), sum(per)


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 3.0
    return tf.cast(tf.constant(x), dtype)


def test_native_library_is_loaded():
    # make setup builds the op library; CI must measure the real op.
    assert ops.implementation() == "native", _loader._state["reason"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_matches_numpy_for_every_shape(dtype):
    tensors = [_random(s, dtype, i) for i, s in enumerate(SHAPES)]
    per, total = ops.squared_norms(tensors)
    want_per, want_total = _numpy_truth(tensors)
    assert per.dtype == tf.float32 and per.shape == (len(SHAPES),)
    assert total.dtype == tf.float32 and total.shape == ()
    np.testing.assert_allclose(per.numpy(), want_per, rtol=1e-6, atol=0)
    np.testing.assert_allclose(float(total), want_total, rtol=1e-6)


def test_mixed_dtypes_in_one_call():
    tensors = [_random((10, 10), d, i) for i, d in enumerate(DTYPES)]
    per, total = ops.squared_norms(tensors)
    want_per, want_total = _numpy_truth(tensors)
    np.testing.assert_allclose(per.numpy(), want_per, rtol=1e-6)
    np.testing.assert_allclose(float(total), want_total, rtol=1e-6)


def test_float16_values_beyond_float16_range_do_not_overflow():
    t = tf.fill([1000], tf.constant(300.0, tf.float16))  # 300^2 * 1000 > 65504
    per, total = ops.squared_norms([t])
    assert float(total) == pytest.approx(9.0e7, rel=1e-6)


def test_large_tensor_uses_threads_and_stays_exact():
    # > 2 shards of 65536 elements: exercises the parallel path
    t = _random((1_000_003,), tf.float32, 5)
    per, total = ops.squared_norms([t])
    _, want = _numpy_truth([t])
    assert float(total) == pytest.approx(want, rel=1e-6)
    # the same value again (fixed summation order, no race)
    assert float(ops.squared_norms([t])[1]) == float(total)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_twin_agrees_with_op(dtype):
    tensors = [_random(s, dtype, 10 + i) for i, s in enumerate(SHAPES)]
    per, total = ops.squared_norms(tensors)
    per_t, total_t = ops.squared_norms_twin(tensors)
    np.testing.assert_allclose(per_t.numpy(), per.numpy(), rtol=1e-5)
    np.testing.assert_allclose(float(total_t), float(total), rtol=1e-5)


def test_op_inside_tf_function_and_gradient_tape():
    @tf.function
    def f(a, b):
        return ops.squared_norms([a, b])

    per, total = f(tf.ones([3]), tf.fill([2, 2], 2.0))
    assert per.numpy().tolist() == [3.0, 16.0] and float(total) == 19.0


def test_bad_input_is_rejected_with_a_clear_error():
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        ops.squared_norms([tf.constant([1, 2])])
    with pytest.raises(ValueError, match="at least one tensor"):
        ops.squared_norms([])
    with pytest.raises(TypeError, match="wrap it in a list"):
        ops.squared_norms(tf.constant([1.0]))


def _run_python(code, **env):
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=300)


CHECK = (
    "import warnings, tensorflow as tf\n"
    "from keras_adapt import ops\n"
    "with warnings.catch_warnings(record=True) as w:\n"
    "    warnings.simplefilter('always')\n"
    "    impl = ops.implementation()\n"
    "    p, t = ops.squared_norms([tf.constant([3.0, 4.0])])\n"
    "    ops.squared_norms([tf.constant([1.0])])\n"
    "print(impl, float(t), sum('keras-adapt' in str(x.message) for x in w))\n"
)


def test_forcing_the_twin_by_environment_variable():
    proc = _run_python(CHECK, KERAS_ADAPT_OPS="twin")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["twin", "25.0", "0"]


def test_unloadable_library_falls_back_to_twin_with_one_warning(tmp_path):
    bad = tmp_path / "broken.so"
    bad.write_bytes(b"not a shared object")
    proc = _run_python(CHECK, KERAS_ADAPT_OPS_LIBRARY=str(bad))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["twin", "25.0", "1"]  # exactly one warning


def test_forcing_native_with_a_broken_library_raises(tmp_path):
    bad = tmp_path / "broken.so"
    bad.write_bytes(b"")
    proc = _run_python(CHECK, KERAS_ADAPT_OPS_LIBRARY=str(bad), KERAS_ADAPT_OPS="native")
    assert proc.returncode != 0
    assert "KERAS_ADAPT_OPS=native" in proc.stderr


def test_invalid_choice_names_the_variable_and_values():
    proc = _run_python(CHECK, KERAS_ADAPT_OPS="fast")
    assert proc.returncode != 0
    assert "KERAS_ADAPT_OPS='fast'" in proc.stderr and "auto, native, twin" in proc.stderr


def test_use_implementation_switches_for_the_block_only():
    before = ops.implementation()
    with ops.use_implementation("twin"):
        assert ops.implementation() == "twin"
        per, total = ops.squared_norms([tf.constant([1.0, 2.0])])
        assert float(total) == 5.0
    assert ops.implementation() == before
    with pytest.raises(ValueError, match="use 'native' or 'twin'"):
        with ops.use_implementation("gpu"):
            pass


GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


@pytest.mark.parametrize("names,scope,gpus,expected", [
    ([CPU, CPU], "", False, True),
    ([GPU], "", True, False),            # gradients on a GPU: the twin runs there
    ([CPU, GPU], "", True, False),       # any tensor off the CPU
    (["/device:TPU:0"], "", False, False),
    (["", ""], "", False, True),         # not placed yet, no GPU visible: CPU
    (["", ""], "", True, False),         # not placed yet, a GPU visible: TF places there
    (["", CPU], "/device:GPU:0", False, False),  # the tf.device scope decides
    ([""], "/device:CPU:0", True, True),
])
def test_auto_runs_the_cpu_kernel_only_on_cpu_tensors(monkeypatch, names, scope, gpus, expected):
    monkeypatch.setenv("KERAS_ADAPT_OPS", "auto")
    assert _loader.native_fits(names, scope, gpus_visible=gpus) is expected


def test_forced_native_runs_anywhere(monkeypatch):
    monkeypatch.setenv("KERAS_ADAPT_OPS", "native")
    assert _loader.native_fits([GPU], gpus_visible=True)


def _traced_op_types(device):
    @tf.function
    def f(a, b):
        if device is None:
            return ops.squared_norms([a * 2.0, b])
        with tf.device(device):
            return ops.squared_norms([a * 2.0, b])

    graph = f.get_concrete_function(tf.TensorSpec([3]), tf.TensorSpec([2, 2])).graph
    return {op.type for op in graph.get_operations()}


def test_traced_graph_uses_the_twin_under_a_gpu_device_scope():
    # Tracing needs no GPU: the choice is made from the placement requested.
    assert "KerasAdaptSquaredNorms" in _traced_op_types(None)  # this machine: CPU only
    assert "KerasAdaptSquaredNorms" in _traced_op_types("/device:CPU:0")
    on_gpu = _traced_op_types("/device:GPU:0")
    assert "KerasAdaptSquaredNorms" not in on_gpu and "Square" in on_gpu


def test_placement_of_eager_tensors_follows_their_device():
    with tf.device("/CPU:0"):
        t = tf.ones([4])
    assert t.device.endswith("CPU:0")
    assert ops.placement([t]) == "native"
    with ops.use_implementation("twin"):
        assert ops.placement([t]) == "twin"
