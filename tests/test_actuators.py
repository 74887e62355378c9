"""Actuators in one process: accumulation equals a k-times batch, no retrace,
the learning-rate factor and its ramp, the global batch decomposition."""

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt import _keras
from keras_adapt.actuators import GlobalBatchSize, GradientAccumulation, LearningRateScale
from keras_adapt.data import AdaptiveBatchDataset


class _TraceCounter(keras.layers.Layer):
    """Identity layer whose python body runs once per trace of the model."""

    traces = 0

    def call(self, x):
        _TraceCounter.traces += 1
        return x


def _data(n=256, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype("float32")
    y = (x @ rng.standard_normal((dim, 1)) + 0.1 * rng.standard_normal((n, 1))).astype("float32")
    return x, y


def _model(seed=1, counter=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((8,))]
    if counter:
        layers.append(_TraceCounter())
    layers += [keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    return keras.Sequential(layers)


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_accumulating_k_micro_steps_equals_one_step_on_k_times_the_batch(name):
    x, y = _data()
    k, micro = 4, 16

    def train(batch, steps):
        model = _model()
        model.compile(keras_adapt.DistributedOptimizer(OPTIMIZERS[name]()), "mse")
        if steps:
            GradientAccumulation(model, steps=steps)
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
        return model

    accumulated = train(micro, k)
    large = train(micro * k, None)
    assert int(accumulated.optimizer.iterations.numpy()) == int(large.optimizer.iterations.numpy()) == 8
    for a, b in zip(accumulated.weights, large.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, rtol=1e-5)
    # ...and the weights did move: the comparison is not between two no-ops.
    assert not np.allclose(accumulated.weights[0].numpy(), _model().weights[0].numpy())


def test_changing_k_mid_fit_takes_effect_at_the_next_update_without_retrace():
    x, y = _data(n=320)
    model = _model(counter=True)
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    acc = GradientAccumulation(model, steps=1)
    seen = []

    class SwitchK(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(int(self.model.optimizer.iterations.numpy()))
            if batch == 3:
                acc.set(4)  # after 4 updates of k=1
            if batch == 11:
                acc.set(2)  # after 2 updates of k=4

    _TraceCounter.traces = 0
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[SwitchK()])
    traces_first_fit = _TraceCounter.traces
    # k=1 for micro-steps 0-3, k=4 for 4-11, k=2 for 12-19.
    assert seen == [1, 2, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10]
    assert acc.steps == 2 and acc.pending_micro_steps == 0
    # One trace of the train function for the whole fit (Keras 3 traces the
    # model once more symbolically when building; count only what fit adds).
    _TraceCounter.traces = 0
    acc.set(3)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert _TraceCounter.traces == 0, "changing k retraced the train function"
    assert traces_first_fit <= 2


SGD_CLASSES = [keras.optimizers.SGD]
if not _keras.IS_KERAS3:
    SGD_CLASSES.append(keras.optimizers.legacy.SGD)  # tf.keras 2's OptimizerV2 path


@pytest.mark.parametrize("sgd", SGD_CLASSES, ids=lambda c: c.__module__)
def test_learning_rate_factor_scales_the_sgd_update_exactly(sgd):
    x, y = _data(n=32)

    def one_step(factor):
        model = _model()
        model.compile(keras_adapt.DistributedOptimizer(sgd(0.1)), "mse")
        lr = LearningRateScale(model)
        if factor is not None:
            lr.set(factor)
        w0 = model.weights[-2].numpy().copy()
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        return model.weights[-2].numpy() - w0, lr

    d1, _ = one_step(None)
    d3, lr = one_step(3.0)
    np.testing.assert_allclose(d3, 3.0 * d1, rtol=1e-5, atol=1e-7)
    assert lr.factor == pytest.approx(3.0)
    assert lr.current_lr() == pytest.approx(0.3)
    assert lr.base_lr() == pytest.approx(0.1)


def test_factor_on_the_host_is_the_graphs_float32_number():
    """factor_now (host, numpy) and factor_at (graph) share ramp_factor; both
    must give, bit for bit, the float32 number of the ramp as first written
    (tf.where and clip_by_value), on odd factors, ramps and late updates."""
    import tensorflow as tf
    from keras_adapt.optimizer import LearningRateControl

    def reference(it, start, target, begin, ramp):  # the rule before ramp_factor
        it, begin, ramp = (tf.constant(float(v), tf.float32) for v in (it, begin, ramp))
        frac = tf.where(ramp > 0, tf.clip_by_value((it - begin) / tf.maximum(ramp, 1.0), 0.0, 1.0),
                        tf.cast(it >= begin, tf.float32))
        start, target = tf.constant(start, tf.float32), tf.constant(target, tf.float32)
        return float((start + (target - start) * frac).numpy())

    control = LearningRateControl(use_progress=False)
    graph = tf.function(lambda i: control.factor_at(i))
    checked = 0
    for start, target, begin, ramp in [(1.0, 3.0, 0, 4), (0.1, 0.7, 5, 3), (2.7, 0.33, 1000, 7),
                                       (1.3, 1.9, 12345, 0), (0.77, 5.1, 7, 1)]:
        for name, value in zip(("start", "target", "begin", "ramp"), (start, target, begin, ramp)):
            getattr(control, name).assign(value)
        for it in sorted({0, 1, begin - 1, begin, begin + 1, begin + ramp // 2, begin + ramp,
                          begin + ramp + 1, 2 ** 20 + 3}):
            if it < 0:
                continue
            want = reference(it, start, target, begin, ramp)
            assert control.factor_now(it) == want, (start, target, begin, ramp, it)
            assert float(graph(tf.constant(it, tf.int64)).numpy()) == want
            checked += 1
    assert checked >= 30


def test_warmup_ramp_values_by_hand():
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    lr = LearningRateScale(model)
    lr.set(2.0)  # instant
    lr.set(6.0, warmup_steps=4)  # from 2 to 6 over 4 updates, starting at update 0
    state = model.optimizer.adapt_state.lr_control
    got = [float(state.factor_at(i).numpy()) for i in range(7)]
    assert got == pytest.approx([2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 6.0])
    # In training: after 2 updates the effective LR is 0.1 x 4.
    x, y = _data(n=64)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert lr.factor == pytest.approx(4.0)
    assert lr.current_lr() == pytest.approx(0.4, rel=1e-6)
    # Reading the optimizer's rate gives the base rate, on both stacks.
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.1, rel=1e-6)


def test_schedule_keeps_working_and_progress_drives_it_when_enabled():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(schedule)), "mse")
    lr = LearningRateScale(model, use_progress=True)
    lr.set(2.0)
    lr.gain = 0.5  # progress advances half a step per update
    x, y = _data(n=128)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # 4 updates
    assert lr.progress == pytest.approx(2.0)
    # schedule at progress 2 (0.1 x 0.5^2), times the factor 2
    assert lr.current_lr() == pytest.approx(0.05, rel=1e-5)


def test_base_and_current_lr_of_a_schedule_at_the_update_count():
    # Without progress a schedule is read at the update count, on both stacks
    # (tf.keras 2 keeps the schedule object itself in learning_rate).
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(schedule)), "mse")
    lr = LearningRateScale(model)
    lr.set(2.0)
    x, y = _data(n=96)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # 3 updates
    assert lr.base_lr() == pytest.approx(0.1 * 0.5 ** 3, rel=1e-6)
    assert lr.current_lr() == pytest.approx(2 * 0.1 * 0.5 ** 3, rel=1e-6)


def test_global_batch_decomposition_with_and_without_dataset():
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    batch = GlobalBatchSize(model, micro_batch_size=16)
    assert batch.value == 16 * keras_adapt.size()
    assert batch.set(64) == 64 and batch.accumulation.steps == 4
    assert batch.set(70) == 64  # nearest multiple of the micro-batch
    x, y = _data(n=1000)
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=16, num_workers=1, rank=0)
    model2 = _model()
    model2.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    batch2 = GlobalBatchSize(model2, dataset=ds, max_micro_batch_size=100)
    assert batch2.set(80) == 80 and (ds.micro_batch_size, batch2.accumulation.steps) == (80, 1)
    assert batch2.set(300) == 300 and (ds.micro_batch_size, batch2.accumulation.steps) == (100, 3)
    assert batch2.set(250) == 249 and (ds.micro_batch_size, batch2.accumulation.steps) == (83, 3)
    assert GlobalBatchSize.of(model2) is batch2


def _made(batch, target, low, high):
    b, k = batch.plan(target, low, high)
    return batch.workers * b * k


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_bounded_plan_stays_within_the_bounds_whenever_a_batch_there_can_be_made(workers):
    # Independent truth: every global batch the actuator can make, listed.
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    fixed = GlobalBatchSize(model, micro_batch_size=16)
    fixed.workers = workers
    x, y = _data(n=1000)
    model2 = _model()
    model2.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=16, num_workers=1, rank=0)
    resizable = GlobalBatchSize(model2, dataset=ds, max_micro_batch_size=24)
    resizable.workers = workers
    for batch, makeable in (
            (fixed, {workers * 16 * k for k in range(1, 300)}),
            (resizable, {workers * b * k for b in range(1, 25) for k in range(1, 300)})):
        for low in range(1, 130, 7):
            for high in range(low, 260, 11):
                inside = sorted(m for m in makeable if low <= m <= high)
                assert batch.within(low, high) == bool(inside), (low, high)
                for target in (low, (low + high) // 2, high):
                    made = _made(batch, target, low, high)
                    if inside:
                        assert low <= made <= high, (batch.dataset, low, high, target, made)
                    else:  # nothing inside: as without bounds
                        assert made == _made(batch, target, None, None)
                    if batch is fixed and inside:  # nearest, ties up
                        best = min(inside, key=lambda m: (abs(m - target), -m))
                        assert made == best, (low, high, target, made, best)
    # Without bounds nothing changed: 16 x 6.5 -> 7 micro-steps
    assert fixed.plan(104 * workers) == (16, 7)


def test_actuators_refuse_a_plain_optimizer_and_bad_values():
    model = _model()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match="DistributedOptimizer"):
        GradientAccumulation(model)
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    with pytest.raises(ValueError, match="steps=0"):
        GradientAccumulation(model, steps=0)
    lr = LearningRateScale(model)
    with pytest.raises(ValueError, match="factor=-1"):
        lr.set(-1.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        lr.set(2.0, warmup_steps=-3)
    with pytest.raises(RuntimeError, match="micro_batch_size"):
        GlobalBatchSize(model).plan(64)


@pytest.mark.parametrize("actuator", [GradientAccumulation, LearningRateScale])
def test_an_actuator_made_once_fit_runs_names_on_attach(actuator):
    # Made in on_train_begin, fit has built its train function already:
    # without the check both stacks end in "TypeError: 'NoneType' object is
    # not callable" at the first step.
    from keras_adapt.policies import AdaptationPolicy

    class Late(AdaptationPolicy):
        def on_train_begin(self, logs=None):
            actuator(self.model)
            super().on_train_begin(logs)

    class Early(AdaptationPolicy):
        def on_attach(self, model):
            self.made = actuator(model)

    x, y = _data(32)
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    with pytest.raises(RuntimeError, match=rf"{actuator.__name__} changes the train step, but it "
                                           r"was set up in Late.on_train_begin while model.fit "
                                           r"runs.*policy's on_attach\(model\)"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[Late()])
    assert int(model.optimizer.iterations.numpy()) == 0
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    model.fit(x, y, batch_size=8, verbose=0)  # a train function of the first fit, kept
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[Early()])  # on_attach: traced anew
    assert int(model.optimizer.iterations.numpy()) == 8


def test_lr_callbacks_change_the_base_rate_under_the_factor_without_compounding():
    # ReduceLROnPlateau reads the rate, scales it and writes it back: it
    # reads and writes the base rate, on both stacks, so the base halves at
    # each plateau and the factor stays.
    model = _model()
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    lr = LearningRateScale(model)
    lr.set(4.0)
    opt = model.optimizer
    seen = float(np.asarray(opt.learning_rate))
    assert seen == pytest.approx(0.1)
    opt.learning_rate = seen * 0.5
    assert lr.base_lr() == pytest.approx(0.05) and lr.current_lr() == pytest.approx(0.2)
    x, y = _data(n=64)
    model.fit(x, y, batch_size=32, epochs=3, verbose=0,  # epoch 1 sets the best
              callbacks=[keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0,
                                                           min_delta=1e9)])
    assert lr.base_lr() == pytest.approx(0.0125, rel=1e-5)
    assert lr.current_lr() == pytest.approx(0.05, rel=1e-5)
    assert lr.factor == pytest.approx(4.0)
