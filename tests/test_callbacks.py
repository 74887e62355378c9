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
