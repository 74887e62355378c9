"""DistributedOptimizer in one process: wrapping, statistics, skipping, arguments."""


import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt import _keras
from keras_adapt.callbacks import GradientStatsMonitor
from keras_adapt.data import linear_regression, linear_regression_gradient_stats
from keras_adapt.optimizer import DEFAULT_STATS_INTERVAL, is_distributed


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
                                           skip_nonfinite=True, stats_interval=1)
    copy = type(opt).from_config(opt.get_config())
    assert is_distributed(copy) and copy.adapt_state is not opt.adapt_state
    assert copy.gradient_statistics.ema_decay == pytest.approx(0.9)
    assert int(copy.gradient_statistics.interval.numpy()) == 1
    assert copy.adapt_state.skip_nonfinite is True  # not the default: carried over
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
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.995,
                                           stats_interval=1)
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



def test_mixed_precision_is_refused_by_the_callbacks_with_the_fix():
    # Under mixed_float16, compile wraps the optimizer in Keras's
    # LossScaleOptimizer; the callbacks that read keras-adapt's optimizer say
    # that this is not supported yet, before the first step.
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _mlp()
        model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
        assert "LossScale" in type(model.optimizer).__name__
        x, y = _data(64)
        with pytest.raises(ValueError, match=r"GradientStatsMonitor does not support mixed "
                           r"precision yet: .*set_global_policy\('float32'\)"):
            model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                      callbacks=[GradientStatsMonitor(interval=1)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert int(model.optimizer.iterations) == 0

def _ema(values, decay):
    """The bias-corrected EMA GradientStatistics keeps, in numpy."""
    ema = 0.0
    for v in values:
        ema = decay * ema + (1 - decay) * v
    return ema / (1 - decay ** len(values))


def _remainder_fit(model, x, y, epochs, decay=0.998, seed=0):
    """lr = 0 (weights fixed), batch 64 with a remainder batch, a fresh
    permutation in every epoch, every update measured (so every pair around
    the remainder counts)."""
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=decay,
                                           stats_interval=1)
    model.compile(opt, "mse")
    # The estimate assumes independent draws, so each epoch needs its own
    # order (Keras 3's shuffle under a global seed repeats the last batches
    # every epoch). A seeded tf.data shuffle gives a new permutation per epoch
    # and the same sequence on every run, so the test is deterministic (the
    # spread over seeds is about 2% on gns, well inside the 10% tolerance).
    data = tf.data.Dataset.from_tensor_slices((x, y))
    data = data.shuffle(len(x), seed=seed, reshuffle_each_iteration=True).batch(64)
    with pytest.warns(RuntimeWarning, match="one worker"):
        history = model.fit(data, epochs=epochs, verbose=0,
                            callbacks=[GradientStatsMonitor(interval=50)])
    return opt.gradient_statistics.result(), history.history


def _brute_force(per_sample):
    """|G|^2 and tr(Sigma) of a finite data set from its per-sample gradients
    (rows). tr(Sigma) with ddof=1: consecutive batches of one epoch are drawn
    without replacement, for which E|g1 - g2|^2 = tr(S_{n-1}) (1/b1 + 1/b2)."""
    per_sample = np.asarray(per_sample, np.float64)
    mean = per_sample.mean(axis=0)
    grad_sqr = float(mean @ mean)
    grad_var = float(per_sample.var(axis=0, ddof=1).sum())
    return {"grad_sqr": grad_sqr, "grad_var": grad_var, "gns": grad_var / grad_sqr}


def test_single_worker_remainder_batch_linear_regression_against_brute_force():
    # Shuffled batches of 64 over 20 full batches and one of 5 per epoch:
    # the pairs (64, 5) and (5, 64) must not bias the estimate (a single
    # batch size for both made grad_var about 30% high here).
    dim, full, rest = 8, 20, 5
    n = full * 64 + rest
    rng = np.random.default_rng(5)
    w_true = rng.standard_normal(dim)
    delta = rng.standard_normal(dim)
    w0 = w_true + np.sqrt(2.0) * delta / np.linalg.norm(delta)
    x, y = linear_regression(n, dim, w_true, seed=21)
    model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([w0.reshape(dim, 1).astype(np.float32)])
    epochs = 60
    r, history = _remainder_fit(model, x, y, epochs)
    xd = x.astype(np.float64)
    residual = xd @ w0 - y.ravel().astype(np.float64)
    truth = _brute_force(2.0 * xd * residual[:, None])  # d/dw of (x.w - y)^2
    steps = epochs * (full + 1)
    assert r["updates"] == steps - 1  # every update but the first is a pair
    for key in ("grad_sqr", "grad_var", "gns"):
        assert r[key] == pytest.approx(truth[key], rel=0.10), (key, r[key], truth[key])
    # grad_snr uses the batch the statistics describe: the moving average of
    # the updates' batches (20 of 64 and one of 5 per epoch), not the last 5.
    batches = ([64] * full + [rest]) * epochs
    assert r["batch_size"] == rest  # the last update's own batch
    assert r["snr_batch_size"] == pytest.approx(_ema(batches[1:], 0.998), rel=1e-6)
    assert 60 < r["snr_batch_size"] < 63
    assert history["grad_snr"][-1] == pytest.approx(r["snr_batch_size"] / r["gns"], rel=1e-9)


def test_single_worker_remainder_batch_mlp_against_per_sample_gradients():
    # A small nonlinear model at fixed weights; the truth is computed from
    # every sample's own gradient (tf.GradientTape jacobian).
    dim, full, rest = 8, 20, 5
    n = full * 64 + rest
    rng = np.random.default_rng(8)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = (np.sin(x[:, :1] * 2.0) + x[:, 1:2] ** 2 + 0.3 * rng.standard_normal((n, 1))).astype(np.float32)
    model = _mlp(seed=4)
    with tf.GradientTape() as tape:
        losses = tf.square(model(x)[:, 0] - y[:, 0])
    jac = tape.jacobian(losses, model.trainable_variables)
    truth = _brute_force(np.concatenate([np.reshape(j, (n, -1)) for j in jac], axis=1))
    r, _ = _remainder_fit(model, x, y, epochs=60)
    for key in ("grad_sqr", "grad_var", "gns"):
        assert r[key] == pytest.approx(truth[key], rel=0.10), (key, r[key], truth[key])


def _fixed_linear(dim, seed=3):
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(dim)
    w0 = w_true + rng.standard_normal(dim) / np.sqrt(dim)
    model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([w0.reshape(dim, 1).astype(np.float32)])
    return model, w_true, w0


def _counting_traces(opt):
    traces = []
    name = "apply" if _keras.IS_KERAS3 else "apply_gradients"
    original = getattr(opt, name)

    def counting(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    setattr(opt, name, counting)
    return traces


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_stats_interval_one_worker_pairs_and_set_interval_without_retrace():
    dim, batch, steps, every = 16, 32, 801, 4
    model, w_true, w0 = _fixed_linear(dim)
    x, y = linear_regression(steps * batch, dim, w_true, seed=11)
    # the decay is per update: 0.995 per update is 0.98 per measurement here
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.995,
                                           stats_interval=every)
    traces = _counting_traces(opt)
    model.compile(opt, "mse")
    monitor = GradientStatsMonitor(interval=100)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    r = opt.gradient_statistics.result()
    # updates 4, 8, ..., 800 are measured, each paired with the one before;
    # update 0 is measured too but has no predecessor
    assert r["updates"] == (steps - 1) // every
    assert r["covered_updates"] == every * r["updates"]
    truth = linear_regression_gradient_stats(w0, w_true)
    for key in ("grad_sqr", "grad_var", "gns"):
        assert r[key] == pytest.approx(truth[key], rel=0.10), key
    traced = len(traces)
    opt.gradient_statistics.set_interval(1)
    model.fit(x[: 40 * batch], y[: 40 * batch], batch_size=batch, epochs=1, shuffle=False,
              verbose=0, callbacks=[monitor])
    # every one of the 40 updates is measured now; the first pairs with
    # update 800, which was not kept (update 801 was not to be measured)
    assert opt.gradient_statistics.result()["updates"] == r["updates"] + 39
    assert len(traces) == traced  # no retrace


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_stats_interval_with_accumulation_measures_whole_updates():
    from keras_adapt.actuators import GradientAccumulation

    dim, batch, k, every, updates = 16, 32, 3, 5, 600
    model, w_true, w0 = _fixed_linear(dim, seed=4)
    x, y = linear_regression(updates * k * batch, dim, w_true, seed=12)
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.996,
                                           stats_interval=every)  # 0.98 per measurement
    model.compile(opt, "mse")
    GradientAccumulation(model, steps=k)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientStatsMonitor(interval=100)])
    r = opt.gradient_statistics.result()
    assert int(opt.iterations.numpy()) == updates
    assert r["updates"] == updates // every  # updates 0, 5, ...: k = 3 micro-gradients each
    assert r["batch_size"] == k * batch
    truth = linear_regression_gradient_stats(w0, w_true)
    for key in ("grad_sqr", "grad_var", "gns"):
        assert r[key] == pytest.approx(truth[key], rel=0.10), key


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, None])
def test_bad_stats_interval_names_the_argument(bad):
    with pytest.raises(ValueError, match=f"stats_interval={bad!r} is not valid"):
        keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), stats_interval=bad)


def _train(gradient_stats, epochs=2, nan_batch=None, stats_interval=1, skip_nonfinite=None):
    x, y = _data()
    if nan_batch is not None:
        x[nan_batch * 32 + 1, 0] = np.nan
    model = _mlp()
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                           gradient_stats=gradient_stats,
                                           stats_interval=stats_interval,
                                           **({} if skip_nonfinite is None
                                              else {"skip_nonfinite": skip_nonfinite}))
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
    model, opt, _ = _train(True, epochs=1, nan_batch=3, skip_nonfinite=True)
    stats = opt.gradient_statistics.result()
    assert int(opt.skipped_steps.numpy()) == 1
    assert stats["nonfinite"] == 1
    assert int(opt.iterations.numpy()) == 256 // 32 - 1
    assert all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_without_skip_nonfinite_a_nan_gradient_is_applied_as_in_horovod_but_not_measured():
    # skip_nonfinite=False (the default): the update goes through (the weights turn NaN, as
    # with hvd.DistributedOptimizer), the measurement of that update is
    # refused and counted, and nothing is counted as skipped.
    model, opt, _ = _train(True, epochs=1, nan_batch=3)
    assert opt.adapt_state.skip_nonfinite is False
    assert int(opt.skipped_steps.numpy()) == 0
    assert int(opt.iterations.numpy()) == 256 // 32
    assert opt.gradient_statistics.result()["nonfinite"] >= 1
    assert not all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_nan_gradient_on_an_unmeasured_update_is_skipped_too():
    # at stats_interval=10 update 3 is not measured; the non-finite check
    # runs on every update all the same
    model, opt, _ = _train(True, epochs=1, nan_batch=3, stats_interval=10, skip_nonfinite=True)
    assert int(opt.skipped_steps.numpy()) == 1
    assert opt.gradient_statistics.result()["nonfinite"] == 0  # no measurement saw it
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
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.legacy.SGD(0.05, momentum=0.9),
                                           stats_interval=1)
    model = _mlp()
    model.compile(opt, "mse")
    x, y = _data()
    h = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[GradientStatsMonitor(1)])
    assert h.history["loss"][-1] < h.history["loss"][0]
    assert opt.gradient_statistics.result()["updates"] == 15


@pytest.mark.parametrize("bad", [object(), 3, None, keras.layers.Dense(1)],
                         ids=lambda bad: type(bad).__name__)  # the same on every xdist worker
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
    ({"gradient_stats": "yes"}, TypeError, "gradient_stats='yes' is not valid; use True or False"),
    ({"skip_nonfinite": 1}, TypeError, "skip_nonfinite=1 is not valid; use True or False"),
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


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_stats_interval_counts_updates_not_micro_steps_with_backward_passes():
    # backward_passes_per_step=2 advances iterations on every micro-step, so
    # every completing micro-step has an odd iteration count; the interval
    # must count updates (adapt_state.updates), or an even interval (the
    # default 10) would never measure.
    x, y = _data()
    model = _mlp()
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01), backward_passes_per_step=2)
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientStatsMonitor(interval=4)])
    micro_steps = len(x) // 8
    updates = micro_steps // 2
    assert int(opt.iterations.numpy()) == micro_steps
    assert int(opt.adapt_state.updates.numpy()) == updates
    result = opt.gradient_statistics.result()
    # updates 0, 10, 20, ...; each measured from 2 micro-gradients (one worker, k = 2)
    assert result["updates"] == -(-updates // DEFAULT_STATS_INTERVAL)
    assert result["covered_updates"] == result["updates"] * DEFAULT_STATS_INTERVAL
    assert np.isfinite(result["gns"])
