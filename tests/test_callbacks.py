"""Callbacks in one process: log keys reach Keras' own loggers; argument checks."""

import csv
import glob
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt import _keras
from keras_adapt.callbacks import (
    LOG_KEYS,
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    MetricAverageCallback,
)
from keras_adapt.data import teacher_student

pytestmark = pytest.mark.filterwarnings("ignore:keras-adapt. one worker")


def _compiled(gradient_stats=True, **kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(3, activation="softmax")])
    # every update measured: these tests count what the monitor reads per step
    kwargs.setdefault("stats_interval", 1)
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1), gradient_stats=gradient_stats,
                                           **kwargs)
    model.compile(opt, "sparse_categorical_crossentropy")
    return model, opt


X, Y = teacher_student(640, dim=8, num_classes=3, seed=1)


def test_keys_reach_history_and_csv_logger(tmp_path):
    model, opt = _compiled()
    path = tmp_path / "h.csv"
    h = model.fit(X, Y, batch_size=32, epochs=3, verbose=0,
                  callbacks=[GradientStatsMonitor(interval=5), keras.callbacks.CSVLogger(str(path))])
    final = opt.gradient_statistics.result()
    for key in LOG_KEYS:
        assert len(h.history[key]) == 3 and all(np.isfinite(h.history[key]))
        assert h.history[key][-1] == pytest.approx(final[key], rel=1e-12)
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 3
    for key in LOG_KEYS:
        assert float(rows[-1][key]) == pytest.approx(final[key], rel=1e-6)


def _tb_scalars(logdir):
    from tensorboard.backend.event_processing import event_accumulator

    files = glob.glob(os.path.join(logdir, "train", "events.*"))
    assert files, f"no event file under {logdir}"
    acc = event_accumulator.EventAccumulator(os.path.dirname(files[0]), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out = {}
    for tag in [t for t in acc.Tags().get("tensors", []) if t.startswith("epoch_")]:
        out[tag] = [float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
    for tag in acc.Tags().get("scalars", []):
        out[tag] = [e.value for e in acc.Scalars(tag)]
    return out


def test_keys_reach_the_stock_tensorboard_callback(tmp_path):
    model, opt = _compiled()
    h = model.fit(X, Y, batch_size=32, epochs=2, verbose=0,
                  callbacks=[GradientStatsMonitor(interval=5),
                             keras.callbacks.TensorBoard(str(tmp_path))])
    scalars = _tb_scalars(str(tmp_path))
    for key in LOG_KEYS:
        assert f"epoch_{key}" in scalars, sorted(scalars)
        np.testing.assert_allclose(scalars[f"epoch_{key}"], h.history[key], rtol=1e-6)


@pytest.mark.skipif(not _keras.IS_KERAS3, reason="tf.keras 2 runs its progress bar before user callbacks")
def test_keys_reach_the_progress_bar(capsys):
    model, _ = _compiled()
    model.fit(X, Y, batch_size=32, epochs=1, verbose=2, callbacks=[GradientStatsMonitor(interval=5)])
    out = capsys.readouterr().out
    for key in LOG_KEYS:
        assert f"{key}: " in out, out


def test_statistics_are_read_only_every_interval_steps():
    model, opt = _compiled()
    stats = opt.gradient_statistics
    reads = []
    original = stats.result
    stats.result = lambda: reads.append(1) or original()
    batch_values = []
    cb = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batch_values.append(logs["gns"]))
    model.fit(X, Y, batch_size=32, epochs=1, verbose=0, callbacks=[GradientStatsMonitor(interval=5), cb])
    # 20 steps: the first batch, steps 5, 10, 15, 20, and the epoch end
    assert len(reads) == 6
    assert len(batch_values) == 20
    # between reads the logged value is repeated, not re-read
    assert batch_values[5] == batch_values[6] == batch_values[8]


def test_batch_size_is_recorded_from_the_data_including_the_last_partial_batch():
    model, opt = _compiled()
    model.fit(X[:100], Y[:100], batch_size=32, epochs=1, verbose=0, callbacks=[GradientStatsMonitor(1)])
    assert int(opt.gradient_statistics.batch_size.numpy()) == 100 - 3 * 32


def test_explicit_batch_size_needs_no_hook():
    model, opt = _compiled(batch_size=32)
    model.fit(X, Y, batch_size=32, epochs=1, verbose=0, callbacks=[GradientStatsMonitor(1)])
    assert "_keras_adapt_hook" not in model.__dict__
    assert opt.gradient_statistics.result()["updates"] == 19


def test_values_before_the_first_update_are_nan():
    model, _ = _compiled()
    first = []
    cb = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: first.append(dict(logs)))
    model.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0, callbacks=[GradientStatsMonitor(1), cb])
    # one worker: the first step has no predecessor to difference against
    assert math.isnan(first[0]["gns"]) and np.isfinite(first[1]["gns"])


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True, None])
def test_monitor_rejects_bad_interval(bad):
    with pytest.raises(ValueError, match=r"interval=.* is not valid; use a positive int"):
        GradientStatsMonitor(interval=bad)


def test_monitor_needs_our_optimizer():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(), "mse")
    with pytest.raises(ValueError, match="keras_adapt.DistributedOptimizer"):
        model.fit(X[:32], Y[:32], verbose=0, callbacks=[GradientStatsMonitor()])


def test_monitor_needs_statistics_enabled():
    model, _ = _compiled(gradient_stats=False)
    with pytest.raises(ValueError, match="gradient_stats=False"):
        model.fit(X[:32], Y[:32], verbose=0, callbacks=[GradientStatsMonitor()])


@pytest.mark.parametrize("bad", [-1, 1.0, "0", True])
def test_broadcast_rejects_bad_root_rank(bad):
    with pytest.raises(ValueError, match="root_rank"):
        BroadcastGlobalVariablesCallback(root_rank=bad)


def test_broadcast_root_rank_beyond_world_size_is_refused_before_training():
    model, _ = _compiled()
    with pytest.raises(ValueError, match="root_rank=3 but only 1 workers"):
        model.fit(X[:32], Y[:32], verbose=0, callbacks=[BroadcastGlobalVariablesCallback(3)])


def test_single_process_callbacks_are_no_ops():
    logs = {"loss": 0.25, "accuracy": 0.5}
    MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == {"loss": 0.25, "accuracy": 0.5}
    model, _ = _compiled()
    before = [w.copy() for w in model.get_weights()]
    model.fit(X[:32], Y[:32], batch_size=32, verbose=0, callbacks=[BroadcastGlobalVariablesCallback(0)])
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


# -- Horovod-named callbacks and load_model (one process) ---------------------------


def _lr_model(lr=0.1, **kwargs):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr), **kwargs), "mse")
    return model


def _rates(model, callbacks, epochs, batches=5):
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(np.asarray(self.model.optimizer.learning_rate)))

    x, y = np.ones((4 * batches, 2), np.float32), np.ones((4 * batches, 1), np.float32)
    h = model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, callbacks=callbacks + [Record()])
    return seen, h.history["lr"]


def test_schedule_per_batch_with_a_function_multiplier():
    from keras_adapt.callbacks import LearningRateScheduleCallback

    cb = LearningRateScheduleCallback(initial_lr=0.2, multiplier=lambda e: 1.0 / (1.0 + e),
                                      start_epoch=1, end_epoch=3, staircase=False)
    seen, epoch_lr = _rates(_lr_model(0.2), [cb], epochs=4)
    expected = [0.2] * 5 + [0.2 / (1 + e + b / 5) for e in (1, 2) for b in range(5)]
    expected += [expected[-1]] * 5  # after end_epoch the last rate stays
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    np.testing.assert_allclose(epoch_lr, expected[4::5], rtol=1e-6)


def test_schedule_takes_initial_lr_from_the_optimizer_and_composes_with_the_factor():
    from keras_adapt.actuators import LearningRateScale
    from keras_adapt.callbacks import LearningRateScheduleCallback

    model = _lr_model(0.3)
    scale = LearningRateScale(model)
    scale.set(4.0)
    cb = LearningRateScheduleCallback(initial_lr=None, multiplier=0.1, start_epoch=0)
    _, epoch_lr = _rates(model, [cb], epochs=3)
    np.testing.assert_allclose(epoch_lr, [0.3 * 4 * 0.1 ** e for e in range(3)], rtol=1e-5)
    assert scale.base_lr() == pytest.approx(0.3 * 0.01, rel=1e-5)


@pytest.mark.skipif(_keras.IS_KERAS3, reason="momentum is a variable only in tf.keras 2 legacy optimizers")
def test_momentum_correction_for_one_batch_on_legacy_sgd():
    from keras_adapt.callbacks import LearningRateScheduleCallback

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.legacy.SGD(0.1, momentum=0.9)), "mse")
    momenta = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            momenta.append(float(keras.backend.get_value(self.model.optimizer.momentum)))

    cb = LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=0)
    model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=2, verbose=0,
              callbacks=[cb, Record()])
    # epoch 0: lr 0.1 -> 0.1 (ratio 1); epoch 1: 0.1 -> 0.05, momentum 0.9 x 0.5 for one batch
    np.testing.assert_allclose(momenta, [0.9, 0.9, 0.45, 0.9], rtol=1e-6)


def test_lr_callbacks_reject_bad_arguments():
    from keras_adapt.callbacks import LearningRateScheduleCallback, LearningRateWarmupCallback

    with pytest.raises(ValueError, match="end_epoch=2"):
        LearningRateScheduleCallback(0.1, 0.5, start_epoch=3, end_epoch=2)
    with pytest.raises(ValueError, match="multiplier=-1"):
        LearningRateScheduleCallback(0.1, -1)
    with pytest.raises(ValueError, match="warmup_epochs=0"):
        LearningRateWarmupCallback(0.1, warmup_epochs=0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(schedule)), "mse")
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        model.fit(np.ones((8, 2)), np.ones((8, 1)), verbose=0,
                  callbacks=[LearningRateScheduleCallback(0.1, 0.5)])


def test_best_model_checkpoint_saves_only_improvements(tmp_path):
    from keras_adapt.callbacks import BestModelCheckpoint

    path = str(tmp_path / "best.weights.h5")
    model = _lr_model(0.05)
    saved = []

    class Watch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            saved.append(os.path.getmtime(path) if os.path.exists(path) else None)

    logs_seq = iter([3.0, 2.0, 2.5, 1.0])

    class FakeLoss(keras.callbacks.Callback):  # a monitored value we control
        def on_epoch_end(self, epoch, logs=None):
            logs["score"] = next(logs_seq)

    cb = BestModelCheckpoint(path, monitor="score", mode="min", save_weights_only=True)
    model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=4, verbose=0,
              callbacks=[FakeLoss(), cb, Watch()])
    assert cb.save_best_only and cb.best == 1.0
    assert saved[0] is not None and saved[2] == saved[1]  # epoch 2 (2.5) did not save
    assert saved[3] >= saved[1]


@pytest.mark.parametrize("optimizer,ext", [("adam", "keras"), ("legacy_adam", "h5")])
def test_load_model_rewraps_the_optimizer_with_its_state(tmp_path, optimizer, ext):
    if optimizer == "legacy_adam" and _keras.IS_KERAS3:
        pytest.skip("keras.optimizers.legacy exists only in tf.keras 2")
    opt = keras.optimizers.legacy.Adam(0.01) if optimizer == "legacy_adam" else keras.optimizers.Adam(0.01)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(opt, "mse")
    x, y = np.random.default_rng(0).normal(size=(32, 3)), np.zeros((32, 2))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = str(tmp_path / f"m.{ext}")
    model.save(path)
    loaded = keras_adapt.load_model(path, gradient_stats=False)
    assert keras_adapt.optimizer.is_distributed(loaded.optimizer)
    assert loaded.optimizer.gradient_statistics is None  # the kwargs reach DistributedOptimizer
    assert int(np.asarray(loaded.optimizer.iterations)) == 8
    old = opt.variables() if callable(opt.variables) else opt.variables
    new = loaded.optimizer.variables() if callable(loaded.optimizer.variables) else loaded.optimizer.variables
    assert len(old) == len(new) > 2
    for a, b in zip(old, new):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # training resumes: one more step equals the original model's next step
    model.train_on_batch(x[:8], y[:8])
    loaded.train_on_batch(x[:8], y[:8])
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_horovod_module_refuses_what_is_not_offered():
    hvd = pytest.importorskip("keras_adapt.horovod")
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Adasum)
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), groups=2)
    with pytest.raises(ValueError, match="device"):
        hvd.callbacks.BroadcastGlobalVariablesCallback(0, device="/gpu:0")
    with pytest.raises(ValueError, match="filepath"):
        hvd.callbacks.BestModelCheckpoint()
    with pytest.raises(ValueError, match="backward_passes_per_step=0"):
        keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor=0"):
        keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), gradient_predivide_factor=0)
