"""DistributedOptimizer in one process: wrapping, statistics, skipping, arguments."""


import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt import _keras
from keras_adapt.callbacks import GradientStatsMonitor
from keras_adapt.data import linear_regression, linear_regression_gradient_stats
from keras_adapt.optimizer import is_distributed


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(1)])


def _data(n=256, seed=0):
    return linear_regression(n, 8, np.linspace(-1, 1, 8), seed=seed)


def test_wrapped_optimizer_keeps_class_name_and_config():
    base = keras.optimizers.Adam(learning_rate=3e-3, beta_1=0.8)
    opt = keras_adapt.DistributedOptimizer(base)
    assert type(opt).__name__ == "Adam" and isinstance(opt, keras.optimizers.Adam)
    assert is_distributed(opt) and not is_distributed(base)
    assert opt.get_config()["beta_1"] == pytest.approx(0.8)
    assert float(np.asarray(opt.learning_rate)) == pytest.approx(3e-3)


def test_copy_from_config_is_a_complete_distributed_optimizer():
    # Keras copies optimizers this way (clone_model, saving); the copy must
    # train, with the same keras-adapt settings and a state of its own.
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05), ema_decay=0.9,
                                           skip_nonfinite=False)
    copy = type(opt).from_config(opt.get_config())
    assert is_distributed(copy) and copy.adapt_state is not opt.adapt_state
    assert copy.gradient_statistics.ema_decay == pytest.approx(0.9)
    assert copy.adapt_state.skip_nonfinite is False
    assert "ema_decay" not in copy.get_config()  # a saved model records a plain SGD
    x, y = _data()
    model = _mlp()
    model.compile(copy, "mse")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[GradientStatsMonitor(4)])
    assert int(copy.iterations.numpy()) == 8
    assert copy.gradient_statistics.result()["updates"] == 7  # one worker: pairs of steps
    assert int(opt.iterations.numpy()) == 0  # the original is untouched


def test_optimizer_by_name():
    opt = keras_adapt.DistributedOptimizer("adam")
    assert isinstance(opt, keras.optimizers.Adam) and is_distributed(opt)


def test_single_worker_noise_scale_from_consecutive_steps():
    # lr = 0 holds the weights fixed, so consecutive gradients are independent
    # draws at the same point and the differencing estimate is unbiased.
    dim, batch, steps = 16, 32, 800
    rng = np.random.default_rng(3)
    w_true = rng.standard_normal(dim)
    w0 = w_true + rng.standard_normal(dim) / np.sqrt(dim)
    x, y = linear_regression(steps * batch, dim, w_true, seed=11)
    model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([w0.reshape(dim, 1).astype(np.float32)])
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.995)
    model.compile(opt, "mse")
    with pytest.warns(RuntimeWarning, match="one worker"):
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[GradientStatsMonitor(interval=100)])
    r = opt.gradient_statistics.result()
    truth = linear_regression_gradient_stats(w0, w_true)
    assert r["updates"] == steps - 1  # the first step has no predecessor
    assert r["batch_size"] == batch  # one worker: B = b
    for key in ("grad_sqr", "grad_var", "gns"):
        assert r[key] == pytest.approx(truth[key], rel=0.10), key


def _train(gradient_stats, epochs=2, nan_batch=None):
    x, y = _data()
    if nan_batch is not None:
        x[nan_batch * 32 + 1, 0] = np.nan
    model = _mlp()
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                           gradient_stats=gradient_stats)
    model.compile(opt, "mse")
    losses = []
    cb = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
    cbs = [cb] + ([GradientStatsMonitor(interval=1)] if gradient_stats else [])
    model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0, callbacks=cbs)
    return model, opt, losses


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_monitoring_on_and_off_give_the_same_trajectory():
    m_on, _, l_on = _train(True)
    m_off, opt_off, l_off = _train(False)
    assert opt_off.gradient_statistics is None
    np.testing.assert_allclose(l_on, l_off, rtol=1e-6)
    for a, b in zip(m_on.get_weights(), m_off.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert l_on[-1] < l_on[0]


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_nan_gradient_is_skipped_counted_and_training_continues():
    model, opt, _ = _train(True, epochs=1, nan_batch=3)
    stats = opt.gradient_statistics.result()
    assert int(opt.skipped_steps.numpy()) == 1
    assert stats["nonfinite"] == 1
    assert int(opt.iterations.numpy()) == 256 // 32 - 1
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_learning_rate_schedule_keeps_working():
    # The wrapper must not change what the optimizer does with its schedule:
    # with one worker, wrapped and plain Adam follow the same trajectory.
    def run(wrap):
        schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)
        opt = keras.optimizers.Adam(schedule)
        if wrap:
            opt = keras_adapt.DistributedOptimizer(opt, gradient_stats=False)
        model = _mlp()
        model.compile(opt, "mse")
        x, y = _data(128)
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        assert int(np.asarray(opt.iterations)) == 8
        return model.get_weights()

    for a, b in zip(run(True), run(False)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_train_function_is_not_retraced():
    model = _mlp()
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01))
    traces = []
    original = opt.apply if _keras.IS_KERAS3 else opt.apply_gradients

    def counting(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    if _keras.IS_KERAS3:
        opt.apply = counting
    else:
        opt.apply_gradients = counting
    model.compile(opt, "mse")
    x, y = _data(320)
    monitor = GradientStatsMonitor(2)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor])
    first = len(traces)  # tf.function traces twice when its first call creates variables
    assert 1 <= first <= 2
    model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[monitor])
    assert int(opt.iterations.numpy()) == 40
    assert len(traces) == first  # 30 more steps, no retrace


@pytest.mark.skipif(_keras.IS_KERAS3, reason="keras.optimizers.legacy exists only in tf.keras 2")
@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_legacy_keras2_optimizer_is_supported():
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.legacy.SGD(0.05, momentum=0.9))
    model = _mlp()
    model.compile(opt, "mse")
    x, y = _data()
    h = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[GradientStatsMonitor(1)])
    assert h.history["loss"][-1] < h.history["loss"][0]
    assert opt.gradient_statistics.result()["updates"] == 15


@pytest.mark.parametrize("bad", [object(), 3, None, keras.layers.Dense(1)], ids=repr)
def test_non_optimizer_is_a_type_error_naming_the_argument(bad):
    with pytest.raises(TypeError, match="optimizer must be a Keras optimizer"):
        keras_adapt.DistributedOptimizer(bad)


def test_unknown_optimizer_name():
    with pytest.raises(ValueError, match="optimizer='sgdd' is not a known"):
        keras_adapt.DistributedOptimizer("sgdd")


def test_wrapping_twice_is_refused():
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD())
    with pytest.raises(ValueError, match="already a keras_adapt.DistributedOptimizer"):
        keras_adapt.DistributedOptimizer(opt)


@pytest.mark.parametrize("kwargs,err,match", [
    ({"gradient_stats": "yes"}, TypeError, "gradient_stats must be True or False"),
    ({"skip_nonfinite": 1}, TypeError, "skip_nonfinite must be True or False"),
    ({"ema_decay": 1.0}, ValueError, "ema_decay=1.0"),
    ({"batch_size": 0}, ValueError, "batch_size=0"),
])
def test_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), **kwargs)


def test_jit_compile_is_refused_with_a_clear_error():
    model = _mlp()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse",
                  jit_compile=True)
    x, y = _data(64)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
