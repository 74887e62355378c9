"""TrainingProgress and epochs that end on samples or statistical progress (one process).

The analytic cases hold the noise scale fixed: a callback placed before the
policy writes the same statistics before every step, so everything the
policy reads is exact, while fit, the data and the optimizer are real.
"""

import json
import warnings
from fractions import Fraction

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.callbacks import PreemptionCheckpoint
from keras_adapt.data import AdaptiveBatchDataset
from keras_adapt.formulas.scaling_rules import AdaScale, adascale_gain
from keras_adapt.policies import GNSBatchSizePolicy, TrainingProgress, statistical_efficiency
from test_policies import _script_gns


def _model(lr=0.05):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr), gradient_stats=True),
                  "mse")
    return model


def _data(n=4096):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype("float32")
    return x, (x.sum(1) + rng.standard_normal(n)).astype("float32")


class FixedNoiseScale(keras.callbacks.Callback):
    """Before every step (and at the start), sets the statistics to report
    exactly ``gns`` (|G|^2 = 1, tr(Sigma) = gns)."""

    def __init__(self, gns):
        super().__init__()
        self.gns = gns

    def on_train_begin(self, logs=None):
        _script_gns(self.model, self.gns)

    def on_train_batch_begin(self, batch, logs=None):
        _script_gns(self.model, self.gns)


class EpochSteps(keras.callbacks.Callback):
    """Steps per epoch, and the policy's count before each step and at each epoch end."""

    def __init__(self, policy, what):
        super().__init__()
        self.policy, self.what = policy, what
        self.steps, self.before, self.at_end = [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.steps.append(0)
        self.before.append([])

    def on_train_batch_begin(self, batch, logs=None):
        self.steps[-1] += 1
        self.before[-1].append(self.policy.progress.count(self.what))

    def on_epoch_end(self, epoch, logs=None):
        self.at_end.append(self.policy.progress.count(self.what))


def _analytic_steps(boundaries, per_update, first=0, before=16):
    """Updates per epoch when the first ``first`` updates add ``before`` and
    the others ``per_update`` (exact): an epoch ends at the first update
    whose cumulative count reaches its boundary."""
    ends, count, n = [], Fraction(0), 0
    for boundary in boundaries:
        while count < boundary:
            n += 1
            count += before if n <= first else Fraction(per_update)
        ends.append(n)
    return [b - a for a, b in zip([0] + ends, ends)]


def test_gain_is_the_batch_times_pollux_efficiency_and_adascale_uses_it():
    for gns in (1.0, 48.0, 700.0):
        for base, batch in ((16, 16), (16, 64), (32, 1024)):
            stats = {"grad_sqr": 2.0, "grad_var": 2.0 * gns}
            scale = batch / base
            assert adascale_gain(scale, stats, base) == pytest.approx(
                scale * statistical_efficiency(batch, base, gns), rel=1e-12)
            assert AdaScale().factor(scale, stats, base) == adascale_gain(scale, stats, base)
    assert adascale_gain(4.0, {"grad_sqr": float("nan"), "grad_var": 1.0}, 16) == 1.0


def test_progress_counts_samples_and_progress_and_round_trips():
    p = TrainingProgress()
    p.set_gain(64, 16, {"grad_sqr": 1.0, "grad_var": 48.0})  # E(64) = 64 / 112
    assert p.gain == pytest.approx(16 / 7)
    assert p.count_after_update("progress", 64, 16) == pytest.approx(256 / 7)
    for _ in range(7):
        p.add_update(64, 16)
    assert (p.samples, p.progress) == (448, pytest.approx(256.0))
    q = TrainingProgress()
    q.restore(p.get_state())
    assert q.get_state() == p.get_state()


class OwnUpdateHook(GNSBatchSizePolicy):
    """Overrides on_update_end without calling super(): the count must not depend on it."""

    def on_update_end(self):
        self.hooked = getattr(self, "hooked", 0) + 1


@pytest.mark.parametrize("what, cls", [("progress", GNSBatchSizePolicy),
                                       ("samples", GNSBatchSizePolicy),
                                       ("progress", OwnUpdateHook)])
def test_epochs_end_at_the_analytic_update_for_a_known_noise_scale(what, cls):
    # B = 64 from B0 = 16 with noise scale 48: each update makes 64 x 64/112
    # = 256/7 samples' worth of progress, once the policy read the statistics
    # (after its first interval of 10 updates; before, the gain is 1: 16 per
    # update); an epoch is 1000 (a remainder: neither count divides it). The
    # epoch ends at the first update whose cumulative count reaches 1000 x
    # (epoch + 1).
    x, y = _data()
    model = _model()
    n = keras_adapt.size()
    policy = cls(min_batch=64 * n, max_batch=64 * n, base_batch=16 * n, micro_batch_size=64,
                 epoch_end=what, samples_per_epoch=1000 * n, interval=10)
    record = EpochSteps(policy, what)
    history = model.fit(x, y, batch_size=64, epochs=3, verbose=0,
                        callbacks=[FixedNoiseScale(48.0), policy, record])
    if what == "progress":
        expected = _analytic_steps([1000, 2000, 3000], Fraction(256, 7), first=10, before=16)
        assert expected == [33, 28, 27]
    else:
        expected = _analytic_steps([1000, 2000, 3000], 64)
        assert expected == [16, 16, 15]
    assert record.steps == expected
    assert len(history.history["loss"]) == 3  # every epoch ran, the last ended training
    assert policy.progress.samples == 64 * n * sum(expected)
    assert policy.progress.progress == pytest.approx(
        n * (16 * 10 + (sum(expected) - 10) * 256 / 7), rel=1e-12)
    for e, boundary in enumerate((1000 * n, 2000 * n, 3000 * n)):
        assert record.before[e][-1] < boundary <= record.at_end[e]
    if cls is OwnUpdateHook:
        assert policy.hooked == sum(expected)  # the override still runs once per update


class StepLogs(keras.callbacks.Callback):
    """``(updates, samples, progress)`` from every step's logs."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append((int(self.model.optimizer.iterations.numpy()), logs["samples"],
                          logs["progress"]))


def test_every_steps_logs_and_the_tensorboard_series_carry_the_counts_after_that_step(tmp_path):
    # The analytic case above (B = 64 from B0 = 16, noise scale 48): after
    # update u the counts are 64 u samples and 16 min(u, 10) + 256/7 (u - 10)
    # progress. Every step's logs carry them, and AdaptTensorBoard writes
    # them at step u (adapt/samples, adapt/progress), epoch ends included.
    import glob

    import tensorflow as tf

    from keras_adapt.callbacks import AdaptTensorBoard

    x, y = _data(1024)
    model = _model()
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(min_batch=64 * n, max_batch=64 * n, base_batch=16 * n,
                                micro_batch_size=64, interval=10)
    logs = StepLogs()
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[
        FixedNoiseScale(48.0), policy, logs, AdaptTensorBoard(str(tmp_path), update_freq=3)])

    def truth(u):
        return 64 * n * u, n * (16 * min(u, 10) + Fraction(256, 7) * max(0, u - 10))

    assert [u for u, _, _ in logs.rows] == list(range(1, 33))  # 16 steps an epoch
    for u, samples, progress in logs.rows:
        want_samples, want_progress = truth(u)
        assert samples == want_samples and progress == pytest.approx(float(want_progress),
                                                                     rel=1e-12), u
    written = {}
    for path in glob.glob(str(tmp_path / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.tag in ("adapt/samples", "adapt/progress"):
                    written.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    # every third step, and each epoch's end (16, 32)
    assert sorted(written["adapt/samples"]) == [3, 6, 9, 12, 15, 16, 18, 21, 24, 27, 30, 32]
    for u in written["adapt/samples"]:
        want_samples, want_progress = truth(u)
        assert written["adapt/samples"][u] == want_samples
        assert written["adapt/progress"][u] == pytest.approx(float(want_progress), rel=1e-6)
    history = model.history.history
    assert history["samples"] == [truth(16)[0], truth(32)[0]]


def test_progress_epochs_on_the_endless_stream_without_steps_per_epoch_and_graph_agrees():
    # The real case: a growing batch through an AdaptiveBatchDataset, real
    # statistics, fit given no steps_per_epoch. The host's progress equals
    # AdaScale's in-graph scale-invariant iterations x B0 (the same gains),
    # every epoch ends at the first update that crosses its boundary, and
    # the pass has a remainder (2002 samples, micro-batch 16).
    x, y = _data(2002)
    n = keras_adapt.size()
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=16, seed=1)
    model = _model(lr=0.01)
    policy = GNSBatchSizePolicy(min_batch=16 * n, max_batch=256 * n, dataset=ds,
                                scaling_rule="adascale", warmup_updates=10,
                                min_change_interval=10, interval=10, epoch_end="progress")
    record = EpochSteps(policy, "progress")
    model.fit(ds.dataset, epochs=3, verbose=0, callbacks=[policy, record])
    assert any(e["kind"] == "batch_size" for e in policy.events), "the batch never grew"
    per_pass = ds.samples_per_pass
    for e in range(3):
        assert record.before[e][-1] < (e + 1) * per_pass <= record.at_end[e]
    tau = float(model.optimizer.adapt_state.lr_control.progress.numpy())
    assert tau * policy.base_batch == pytest.approx(policy.progress.progress, rel=1e-9)
    assert policy.progress.samples == n * ds.samples
    # Larger batches make less progress per sample: more samples than passes.
    assert policy.progress.samples > 3 * per_pass


def test_a_resumed_run_ends_its_epochs_where_the_uninterrupted_one_did():
    x, y = _data()
    n = keras_adapt.size()

    def policy():
        return GNSBatchSizePolicy(min_batch=64 * n, max_batch=64 * n, base_batch=16 * n,
                                  micro_batch_size=64, epoch_end="progress",
                                  samples_per_epoch=1000 * n, interval=10)

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 40:  # inside epoch 1
                self.model.stop_training = True

    model = _model()
    first = policy()
    before = EpochSteps(first, "progress")
    model.fit(x, y, batch_size=64, epochs=3, verbose=0,
              callbacks=[FixedNoiseScale(48.0), first, before, StopAt()])
    assert before.steps == [33, 7]
    resumed = policy()
    resumed.restore_at_train_begin(json.loads(json.dumps(first.get_state())))  # as from disk
    after = EpochSteps(resumed, "progress")
    model.fit(x, y, batch_size=64, epochs=3, initial_epoch=1, verbose=0,
              callbacks=[FixedNoiseScale(48.0), resumed, after])
    # 33 + 7 + 21 = 61 and 88, as uninterrupted
    assert after.steps == [21, 27] and [33, 7 + 21, 27] == _analytic_steps(
        [1000, 2000, 3000], Fraction(256, 7), first=10, before=16)
    assert resumed.progress.samples == 64 * n * 88


def test_a_callback_after_the_policy_still_stops_training_at_an_epoch_end():
    x, y = _data()
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(min_batch=64 * n, max_batch=64 * n, micro_batch_size=64,
                                epoch_end="samples", samples_per_epoch=640 * n)

    class StopAfterFirstEpoch(keras.callbacks.Callback):  # as EarlyStopping would
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    history = _model().fit(x, y, batch_size=64, epochs=5, verbose=0,
                           callbacks=[policy, StopAfterFirstEpoch()])
    assert len(history.history["loss"]) == 1
    assert policy.progress.samples == 640 * n


def test_steps_per_epoch_that_cuts_an_epoch_short_warns():
    x, y = _data()
    n = keras_adapt.size()
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=16, seed=1)
    policy = GNSBatchSizePolicy(min_batch=16 * n, max_batch=16 * n, dataset=ds,
                                epoch_end="samples")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _model().fit(ds.dataset, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[policy])
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("epoch 0 ended at samples" in m and "give fit an endless stream and no steps_per_epoch" in m
               for m in messages), messages


@pytest.mark.parametrize("kwargs, match", [
    ({"epoch_end": "pass"}, "epoch_end='pass' is not valid"),
    ({"epoch_end": "progress"}, "pass samples_per_epoch=len"),
    ({"epoch_end": "samples", "samples_per_epoch": 0}, "samples_per_epoch=0"),
    ({"epoch_end": "progress", "samples_per_epoch": 100, "sample_budget": 1000},
     r"sample_budget=1000 caps the batch by samples.*Pass sample_budget=None"),
])
def test_bad_epoch_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GNSBatchSizePolicy(min_batch=16, max_batch=64, micro_batch_size=16, **kwargs)


def test_the_resuming_fits_refuse_what_cannot_resume_epochs_that_end_on_a_count(tmp_path):
    # Both resume such epochs (tests/test_preemption.py, tests/test_elastic.py)
    # on the policy's saved count: under elastic the state must commit it, and
    # the epochs have no steps_per_epoch; no fit takes two policies that end them.
    from keras_adapt import elastic

    policy = GNSBatchSizePolicy(min_batch=16, max_batch=64, micro_batch_size=16,
                                epoch_end="progress", samples_per_epoch=1000)
    model = _model()
    state = elastic.KerasState(model, policies=[policy])
    with pytest.raises(ValueError, match=r"steps_per_epoch=4 but GNSBatchSizePolicy\(epoch_end="
                                         r"'progress'\) ends the epochs on its count; pass "
                                         r"steps_per_epoch=None"):
        elastic.fit(state, lambda epoch, batch: None, epochs=1, steps_per_epoch=4,
                    callbacks=[policy])
    with pytest.raises(ValueError, match=r"which must be committed and restored with the model: "
                                         r"give it to the state too, KerasState\(model, ..., "
                                         r"policies=\[policy\]\)"):
        elastic.fit(elastic.KerasState(model), lambda epoch, batch: None, epochs=1,
                    callbacks=[policy])
    other = GNSBatchSizePolicy(min_batch=16, max_batch=64, micro_batch_size=16,
                               epoch_end="samples", samples_per_epoch=1000)
    x, y = _data(256)
    two = (r"2 callbacks end the epochs on their counts \(GNSBatchSizePolicy\(epoch_end="
           r"'progress'\), GNSBatchSizePolicy\(epoch_end='samples'\)\); give epoch_end to one")
    with pytest.raises(ValueError, match=two):
        PreemptionCheckpoint(tmp_path / "ck").fit(_model(), x, y, batch_size=16,
                                                  callbacks=[policy, other])
    with pytest.raises(ValueError, match=two):
        elastic.fit(state, lambda epoch, batch: None, epochs=1, callbacks=[policy, other])
    assert PreemptionCheckpoint(tmp_path / "ck").checkpoints() == []  # refused before training
    assert int(model.optimizer.iterations.numpy()) == 0
