"""Policies in one process: scripted GNS decisions, schedule,
LR following, events on disk, config and state round trips, bad arguments."""

import json
import os

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.policies import (
    AdaptationPolicy,
    GNSBatchSizePolicy,
    GoodputBatchSizePolicy,
    LRScalingPolicy,
    ScheduledBatchSizePolicy,
)
from keras_adapt.record import events


def _model(lr=0.1):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr)), "mse")
    return model


def _script_gns(model, gns, updates=1000, stats_interval=1):
    """Sets the in-graph statistics so that result() reports exactly ``gns``
    after ``updates`` measurements, one every ``stats_interval`` updates."""
    stats = model.optimizer.gradient_statistics
    correction = 1.0 - stats.ema_decay ** (updates * stats_interval)
    stats.assign_averages(updates=updates, covered_updates=updates * stats_interval,
                          ema_weight=correction, ema_grad_sqr=1.0 * correction,
                          ema_grad_var=gns * correction)


def _drive(policy, model, script):
    """Runs the policy's hooks as fit would, over ``[(update, gns), ...]``.

    Keras calls on_train_batch_begin before every micro-step; the policy
    counts the micro-step before it there. Here a micro-step "runs" by doing
    what the graph does: count it, and make an update every k-th one.
    Between script entries the noise scale keeps the entry's value.
    """
    policy.set_model(model)
    policy.on_train_begin()
    optimizer = model.optimizer
    micro, pending = 0, 0
    policy.on_train_batch_begin(micro)
    for step, gns in script:
        _script_gns(model, gns)
        while int(optimizer.iterations.numpy()) < step:
            acc = optimizer.adapt_state.accumulation
            pending += 1
            if acc is None or pending >= acc.steps_value:
                pending = 0
                optimizer.iterations.assign_add(1)
            micro += 1
            policy.on_train_batch_begin(micro)
    return [(e["step"], e["before"]["batch_size"], e["after"]["batch_size"])
            for e in policy.events if e["kind"] == "batch_size"]


def test_gns_policy_scripted_decisions_bounds_hysteresis_interval():
    model = _model()
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=256 * n, micro_batch_size=16,
                                hysteresis=0.5, min_change_interval=30, warmup_updates=0,
                                interval=10, gns_multiple=1.0)
    script = [
        (10, 20.0 * n),    # target 20n < 1.5 x 16n: inside the band, no change
        (20, 40.0 * n),    # 40n >= 24n: grow to 40n -> 48n (k = 3, the nearest)
        (30, 200.0 * n),   # only 10 updates since the change (< 30): wait
        (40, 200.0 * n),   # still 20 < 30
        (50, 200.0 * n),   # 30 since change: grow to 200n -> 208n (k = 13)
        (60, 5000.0 * n),  # 10 updates since the change: wait (and at 70: 20)
        (80, 5000.0 * n),  # capped at max_batch 256n
        (90, 1.0),         # falls, but allow_decrease is False
        (120, float("inf")),  # unresolved noise scale: ignored
    ]
    decisions = _drive(policy, model, script)
    assert decisions == [(20, 16 * n, 48 * n), (50, 48 * n, 208 * n), (80, 208 * n, 256 * n)]
    assert policy.batch.accumulation.steps == 16


def test_gns_policy_decreases_only_when_allowed_and_not_below_min():
    model = _model()
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=128 * n, micro_batch_size=16,
                                hysteresis=0.25, min_change_interval=0, warmup_updates=0,
                                allow_decrease=True, interval=10, gns_multiple=1.0)
    decisions = _drive(policy, model, [(10, 128.0 * n), (20, 110.0 * n), (30, 60.0 * n),
                                       (40, 1.0)])
    assert decisions == [(10, 16 * n, 128 * n), (30, 128 * n, 64 * n), (40, 64 * n, 16 * n)]


def test_gns_policy_waits_for_warmup_updates():
    model = _model()
    policy = GNSBatchSizePolicy(min_batch=16, max_batch=1024, micro_batch_size=16,
                                warmup_updates=2000, min_change_interval=0, interval=10)
    assert _drive(policy, model, [(10, 500.0), (20, 500.0)]) == []


def test_gns_policy_warmup_counts_updates_not_measurements():
    # 150 measurements at stats_interval 10 cover 1500 updates: past a
    # warm-up of 1000 updates, though fewer than 1000 measurements were taken
    model = _model()
    stats = model.optimizer.gradient_statistics
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16, max_batch=1024, micro_batch_size=16,
                                warmup_updates=1000, min_change_interval=0, interval=10, gns_multiple=1.0)
    policy.set_model(model)
    _script_gns(model, 500.0, updates=150, stats_interval=10)
    assert stats.result()["covered_updates"] == 1500
    assert stats.result()["gns"] == pytest.approx(500.0)
    assert policy.should_change(10, 500.0, stats.result()["covered_updates"], 16) == 500.0
    _script_gns(model, 500.0, updates=90, stats_interval=10)
    assert policy.should_change(10, 500.0, stats.result()["covered_updates"], 16) is None


def test_gns_policy_moves_lr_with_the_rule_and_writes_events(tmp_path):
    model = _model(lr=0.1)
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=64 * n, micro_batch_size=16,
                                scaling_rule="sqrt", warmup_updates=0, min_change_interval=0,
                                interval=10, log_dir=str(tmp_path))
    _drive(policy, model, [(10, 64.0 * n)])
    kinds = [e["kind"] for e in policy.events]
    assert kinds == ["batch_size", "lr"]
    lr_event = policy.events[1]
    assert lr_event["after"]["lr_factor"] == pytest.approx(2.0)  # sqrt(64n / 16n)
    assert lr_event["after"]["lr"] == pytest.approx(0.2, rel=1e-6)
    with open(tmp_path / "adapt_events.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [e["kind"] for e in lines] == kinds
    for e in lines:
        assert list(e) == list(events.EVENT_FIELDS)
        assert e["policy"] == "GNSBatchSizePolicy" and e["step"] == 10 and e["rank"] == 0
    assert lines[0]["before"]["batch_size"] == 16 * n and lines[0]["after"]["batch_size"] == 64 * n


def test_gns_policy_defaults_follow_the_noise_scale_with_linear_lr():
    # The library's defaults (the time-to-accuracy benchmark runs with them):
    # gns_multiple 2, hysteresis 0.25, a change at most every 20 updates and
    # at most x2 each, 50 warm-up updates, no sample budget (100 updates
    # kept when one is given), the learning rate scaled linearly with the batch.
    model = _model(lr=0.1)
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(min_batch=16 * n, max_batch=256 * n, micro_batch_size=16,
                                warmup_updates=0)
    assert (policy.gns_multiple, policy.hysteresis, policy.min_change_interval,
            GNSBatchSizePolicy(16, 256).warmup_updates, policy.max_growth) == (2.0, 0.25, 20, 50, 2.0)
    assert (policy.sample_budget, policy.min_updates_left) == (None, 100)
    assert policy.get_config()["scaling_rule"] == {"name": "linear", "warmup_steps": 0}
    script = [
        (10, 9.5 * n),    # 2 x 9.5n = 19n < 1.25 x 16n = 20n: inside the band
        (20, 16.0 * n),   # grow to 2 x 16n = 32n (k = 2)
        (30, 64.0 * n),   # 10 updates since the change (< 20): wait
        (40, 64.0 * n),   # 20 since the change: the target 128n, at most x2: 64n (k = 4)
        (60, 64.0 * n),   # and on to 128n (k = 8)
        (80, 75.0 * n),   # 150n < 1.25 x 128n = 160n: inside the band
    ]
    assert _drive(policy, model, script) == [(20, 16 * n, 32 * n), (40, 32 * n, 64 * n),
                                             (60, 64 * n, 128 * n)]
    reasons = [e["reason"] for e in policy.events if e["kind"] == "batch_size"]
    assert ["at most x2 per change" in r for r in reasons] == [False, True, False]
    lrs = [(e["step"], e["after"]["lr_factor"], e["after"]["lr"])
           for e in policy.events if e["kind"] == "lr"]
    # linear: factor B / B0 = 2, 4, then 8 on the configured 0.1
    assert [(s, f) for s, f, _ in lrs] == [(20, 2.0), (40, 4.0), (60, 8.0)]
    assert [lr for _, _, lr in lrs] == pytest.approx([0.2, 0.4, 0.8], rel=1e-6)
    assert policy.lr_follower.lr.current_lr() == pytest.approx(0.8, rel=1e-6)


def test_gns_policy_sample_budget_caps_growth_and_shrinks_to_keep_updates_left():
    # A budget of 20000n samples, 100 updates to keep: at update 10 (160n
    # samples trained at 16n) the cap is (20000n - 160n) // 100 and the
    # batch grows only to it. From then on the cap falls with every update;
    # once it is a band (x1.25) below the batch, the batch shrinks to it,
    # and again, down to min_batch: the rest of the budget always holds
    # about 100 updates or more.
    model = _model()
    n = keras_adapt.size()
    budget, keep = 20_000 * n, 100
    policy = GNSBatchSizePolicy(min_batch=16 * n, max_batch=1024 * n, micro_batch_size=16,
                                warmup_updates=0, min_change_interval=0, interval=10,
                                max_growth=None, sample_budget=budget, min_updates_left=keep)
    decisions = _drive(policy, model, [(10, 500.0 * n), (400, 500.0 * n)])
    cap = (budget - 10 * 16 * n) // keep
    assert cap == 198 * n
    assert decisions[0] == (10, 16 * n, 192 * n)  # 198n through 16-sample micro-batches: k = 12
    events = [e for e in policy.events if e["kind"] == "batch_size"]
    assert f"{budget - 160 * n} samples left: at most {cap} for 100 updates" in events[0]["reason"]
    # Replay the samples: every later change is a shrink at the first
    # decision where the cap (samples left // 100) is a band below the batch.
    samples, batch, step, expected = 160 * n, 192 * n, 10, []
    while step < 400:
        samples += 10 * batch
        step += 10
        cap = (budget - samples) // keep
        if batch > 16 * n and cap * 1.25 <= batch:
            made = max(16 * n, 16 * n * max(1, round(cap / (16 * n))))
            if made != batch:  # a cap made as the same batch changes nothing
                expected.append((step, batch, made, budget - samples, cap))
                batch = made
    assert len(expected) >= 4 and expected[-1][2] == 16 * n   # down to min_batch
    assert decisions[1:] == [(s, before, after) for s, before, after, _, _ in expected]
    for event, (_, _, _, left, cap) in zip(events[1:], expected):
        assert event["reason"].startswith(f"budget: {left} samples left, at most {cap} for "
                                          "100 updates")
    assert policy.progress.samples == samples


def test_gns_policy_grows_at_most_max_growth_per_change():
    model = _model()
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(min_batch=16 * n, max_batch=1024 * n, micro_batch_size=16,
                                warmup_updates=0, min_change_interval=0, interval=10,
                                max_growth=3.0)
    # target 2 x 600n, clipped to 1024n: x3 per decision (16n -> 48n -> 144n
    # -> 432n), then the bound
    assert _drive(policy, model, [(40, 600.0 * n)]) == [
        (10, 16 * n, 48 * n), (20, 48 * n, 144 * n), (30, 144 * n, 432 * n),
        (40, 432 * n, 1024 * n)]


def test_gns_policy_without_a_budget_grows_to_max_batch():
    model = _model()
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=1024 * n, micro_batch_size=16,
                                warmup_updates=0, min_change_interval=0, interval=10)
    assert policy.budget_cap() == 1024 * n
    assert _drive(policy, model, [(10, 5000.0 * n)]) == [(10, 16 * n, 1024 * n)]
    assert policy.progress.samples == 10 * 16 * n


def test_gns_policy_without_a_rule_leaves_the_learning_rate():
    model = _model(lr=0.1)
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=64 * n, micro_batch_size=16,
                                scaling_rule=None, warmup_updates=0, interval=10)
    assert _drive(policy, model, [(10, 64.0 * n)]) == [(10, 16 * n, 64 * n)]
    assert [e["kind"] for e in policy.events] == ["batch_size"]
    assert policy.lr_follower is None
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.1)


def test_gns_policy_in_a_real_fit_grows_the_batch_through_accumulation():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 4)).astype("float32")
    y = (x.sum(1) + rng.standard_normal(4096)).astype("float32")  # noisy: large gns
    model = _model(lr=0.01)
    policy = GNSBatchSizePolicy(min_batch=8, max_batch=128, micro_batch_size=8,
                                warmup_updates=10, min_change_interval=10, interval=10)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    grown = [e for e in policy.events if e["kind"] == "batch_size"]
    assert grown and grown[-1]["after"]["batch_size"] > 8
    assert history.history["batch_size"][-1] == policy.batch.value
    # every change happened at an update boundary, at increasing steps
    steps = [e["step"] for e in grown]
    assert steps == sorted(steps)


def test_scheduled_policy_changes_at_epoch_begin():
    x = np.ones((64, 4), "float32")
    model = _model()
    n = keras_adapt.size()
    policy = ScheduledBatchSizePolicy({1: 16 * n, 2: 32 * n}, micro_batch_size=8)
    model.fit(x, x[:, :1], batch_size=8, epochs=3, verbose=0, callbacks=[policy])
    changes = [(e["epoch"], e["after"]["batch_size"]) for e in policy.events]
    assert changes == [(1, 16 * n), (2, 32 * n)]
    assert policy.batch.accumulation.steps == 4


def test_lr_scaling_policy_follows_batch_events_at_the_same_step():
    model = _model(lr=0.1)
    n = keras_adapt.size()
    gns_policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=64 * n, micro_batch_size=16,
                                    scaling_rule=None, warmup_updates=0, min_change_interval=0,
                                    interval=10)
    lr_policy = LRScalingPolicy("linear", base_batch=16 * n, micro_batch_size=16, interval=10)
    lr_policy.set_model(model)
    lr_policy.on_train_begin()
    _drive(gns_policy, model, [(10, 64.0 * n)])
    lr_policy.on_train_end()
    (lr_event,) = [e for e in lr_policy.events if e["kind"] == "lr"]
    assert lr_event["step"] == 10
    assert lr_policy.lr.factor == pytest.approx(4.0)
    assert lr_policy.lr.current_lr() == pytest.approx(0.4, rel=1e-6)


def test_config_round_trip():
    policies = [
        GNSBatchSizePolicy(32, 512, gns_multiple=2.0, hysteresis=0.1, scaling_rule="adascale",
                           micro_batch_size=32, interval=5, sample_budget=100_000,
                           min_updates_left=50),
        GoodputBatchSizePolicy(32, 512, hysteresis=0.2, micro_batch_size=32),
        ScheduledBatchSizePolicy({3: 128, 6: 512}, micro_batch_size=32),
        LRScalingPolicy("sqrt", base_batch=64),
    ]
    for p in policies:
        config = json.loads(json.dumps(p.get_config()))
        clone = type(p).from_config(config)
        assert clone.get_config() == p.get_config()


def test_state_round_trip_resumes_batch_lr_and_progress(tmp_path):
    model = _model(lr=0.1)
    n = keras_adapt.size()
    policy = GNSBatchSizePolicy(max_growth=None, min_batch=16 * n, max_batch=128 * n, micro_batch_size=16,
                                scaling_rule="adascale", warmup_updates=0,
                                min_change_interval=0, interval=10)
    _drive(policy, model, [(10, 128.0 * n), (20, 128.0 * n)])
    policy.lr_follower.lr.progress = 123.5
    path = os.path.join(tmp_path, "policy.json")
    policy.save_state(path)
    saved = policy.get_state()

    fresh_model = _model(lr=0.1)
    resumed = GNSBatchSizePolicy.from_config(policy.get_config())
    resumed.load_state(path)
    resumed.set_model(fresh_model)
    resumed.on_train_begin()
    assert resumed.batch.value == saved["batch_size"] == 128 * n
    assert resumed.batch.accumulation.steps == 8
    assert resumed.lr_follower.lr.factor == pytest.approx(saved["lr_factor"])
    assert resumed.lr_follower.lr.progress == pytest.approx(123.5)
    assert resumed.progress.samples == saved["training_progress"]["samples"] \
        == 10 * 16 * n + 10 * 128 * n
    assert resumed.progress.progress == pytest.approx(policy.progress.progress)
    assert resumed.events[0]["kind"] == "resume"


class _Recorder(AdaptationPolicy):
    def on_attach(self, model):
        self.calls = []

    def adapt(self, step, values):
        self.calls.append((step, sorted(k for k in values if k in ("gns", "updates"))))


def test_base_policy_calls_adapt_every_interval_updates_with_statistics():
    x = np.ones((160, 4), "float32")
    model = _model()
    policy = _Recorder(interval=3)
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    assert [s for s, _ in policy.calls] == [3, 6, 9, 12, 15, 18]
    assert policy.calls[0][1] == ["gns", "updates"]
    # A second fit goes on counting (epochs 1 and 2, 20 updates each): its
    # calls fall where one fit of three epochs puts them, every 3 updates
    # from the last (18), not from its own start (20: 23, 26, ...).
    model.fit(x, x[:, :1], batch_size=8, initial_epoch=1, epochs=3, verbose=0,
              callbacks=[policy])
    assert [s for s, _ in policy.calls] == list(range(21, 60 + 1, 3))
    # A new model (its optimizer at update 0): a new run, counted afresh.
    _model().fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    assert [s for s, _ in policy.calls] == [3, 6, 9, 12, 15, 18]


@pytest.mark.parametrize("make, err, match", [
    (lambda: GNSBatchSizePolicy(512, 32), ValueError, "min_batch=512 is larger than max_batch=32"),
    (lambda: GNSBatchSizePolicy(0, 32), ValueError, "min_batch=0"),
    (lambda: GNSBatchSizePolicy(32, -4), ValueError, "max_batch=-4"),
    (lambda: GNSBatchSizePolicy(32, 64, gns_multiple=0), ValueError, "gns_multiple=0"),
    (lambda: GNSBatchSizePolicy(32, 64, hysteresis=-0.1), ValueError, "hysteresis=-0.1"),
    (lambda: GNSBatchSizePolicy(32, 64, scaling_rule="cubic"), ValueError, "unknown scaling rule"),
    (lambda: GNSBatchSizePolicy(32, 64, interval=0), ValueError, "interval=0"),
    (lambda: GNSBatchSizePolicy(32, 64, allow_decrease="yes"), TypeError, "allow_decrease"),
    (lambda: GNSBatchSizePolicy(32, 64, sample_budget=0), ValueError, "sample_budget=0"),
    (lambda: GNSBatchSizePolicy(32, 64, min_updates_left=0.5), ValueError, "min_updates_left=0.5"),
    (lambda: GNSBatchSizePolicy(32, 64, max_growth=0.5), ValueError, "max_growth=0.5"),
    (lambda: GoodputBatchSizePolicy(64, 32), ValueError, "larger than max_batch"),
    (lambda: GoodputBatchSizePolicy(32, 64, min_efficiency=0), ValueError, "min_efficiency=0"),
    (lambda: ScheduledBatchSizePolicy({}), ValueError, "non-empty dict"),
    (lambda: ScheduledBatchSizePolicy({2: 0}), ValueError, r"schedule\[2\]=0"),
    (lambda: LRScalingPolicy("warp"), ValueError, "unknown scaling rule 'warp'"),
    (lambda: LRScalingPolicy(base_workers=0), ValueError, "base_workers=0"),
    (lambda: LRScalingPolicy(verbose=2), ValueError, r"verbose=2 is not valid; use 0 \(silent\) or 1"),
])
def test_bad_arguments_fail_at_construction(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_policy_needs_the_distributed_optimizer_before_training():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match="DistributedOptimizer"):
        model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0,
                  callbacks=[GNSBatchSizePolicy(8, 64, micro_batch_size=8)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1), gradient_stats=False),
                  "mse")
    with pytest.raises(ValueError, match="gradient_stats=False"):
        model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0,
                  callbacks=[GNSBatchSizePolicy(8, 64, micro_batch_size=8)])
    # The errors come before any work: not one step was trained.
    assert int(model.optimizer.iterations.numpy()) == 0


def test_batches_stay_within_bounds_that_are_no_multiple_of_the_micro_batch():
    # Micro-batch 32 on one worker: 112 would round to 128 and 100 to 96.
    model = _model()
    goodput = GoodputBatchSizePolicy(32, 112, micro_batch_size=32, warmup_updates=0)
    goodput.set_model(model)
    goodput.on_train_begin()
    assert goodput.candidates() == [32, 64, 96]
    assert goodput.configuration(112) == (32, 3, 1)
    assert goodput.change_batch(1000, "up") == 96
    assert goodput.choose(96, gns=1e6).reason == "96 is the largest candidate (max_batch=112)"
    gns = GNSBatchSizePolicy(100, 400, micro_batch_size=32, warmup_updates=0)
    model = _model()
    gns.set_model(model)
    gns.on_train_begin()   # starts at 32 < min_batch: moves to 128, not 96
    assert gns.batch.value == 128
    assert [e["after"]["batch_size"] for e in gns.events if e["kind"] == "batch_size"] == [128]


def test_bounds_no_batch_can_lie_in_are_refused_before_the_first_step():
    model = _model()
    with pytest.raises(ValueError, match=r"min_batch=40 and max_batch=60 .* micro-batch 32 .*"
                                         r"the nearest are 32 and 64: widen the bounds"):
        model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=32, verbose=0,
                  callbacks=[GNSBatchSizePolicy(40, 60, micro_batch_size=32)])
    assert int(model.optimizer.iterations.numpy()) == 0
    # With the micro-batch read from the data: at the first decision
    model = _model()
    with pytest.raises(ValueError, match=r"min_batch=40 and max_batch=60 .* micro-batch 32 "):
        model.fit(np.ones((640, 4)), np.ones((640, 1)), batch_size=32, verbose=0,
                  callbacks=[GNSBatchSizePolicy(40, 60, interval=5)])
    assert int(model.optimizer.iterations.numpy()) == 5


def test_bounds_a_resize_makes_unreachable_are_warned_and_the_nearest_batch_trains():
    model = _model()
    policy = GNSBatchSizePolicy(32, 64, micro_batch_size=32)
    policy.set_model(model)
    policy.on_train_begin()
    assert policy.batch.value == 32
    model.optimizer.iterations.assign(40)   # trained, committed
    policy.batch.workers = 3   # as an elastic resize does: 3 x 32 > max_batch
    with pytest.warns(RuntimeWarning, match=r"max_batch=64 can be made by 3 worker\(s\) .*"
                                            r"the nearest is 96: .*; training at 96"):
        policy.on_train_begin()
    assert policy.batch.value == 96
    # A worker that joins gets the committed state, and warns alike
    # (raising there would stop that rank only).
    joiner, model = GNSBatchSizePolicy(32, 64, micro_batch_size=32), _model()
    model.optimizer.iterations.assign(40)
    joiner.set_model(model)
    joiner.batch.workers = 3
    joiner.restore(policy.get_state())
    with pytest.warns(RuntimeWarning, match="training at 96"):
        joiner.on_train_begin()
    assert joiner.batch.value == 96


def test_a_state_restored_before_the_model_is_attached_applies_when_it_is():
    """A worker joining an elastic job gets the committed state in the sync
    before its first fit, when Keras has not attached the policy yet (it has
    no actuators): the state is kept, reported as its state, and applied
    when the policy is attached."""
    trained, model = GNSBatchSizePolicy(32, 256, micro_batch_size=32, scaling_rule="linear"), _model()
    trained.set_model(model)
    trained.on_train_begin()
    model.optimizer.iterations.assign(40)
    trained.change_batch(64, "grown")
    state = json.loads(json.dumps(trained.get_state()))
    assert (state["batch_size"], state["base_batch"], state["lr_factor"]) == (64, 32, 2.0)
    joiner = GNSBatchSizePolicy(32, 256, micro_batch_size=32, scaling_rule="linear")
    joiner.restore(state)                  # the sync: no model yet
    assert joiner.get_state() == state     # a commit now keeps what it will apply
    other = _model()
    other.optimizer.iterations.assign(40)
    joiner.set_model(other)                # fit attaches it
    assert (joiner.batch.value, joiner.base_batch, joiner.batch.micro_batch_size) == (64, 32, 32)
    assert joiner.batch.accumulation.steps == 2
    assert joiner.lr_follower.lr.factor == pytest.approx(2.0)
    assert joiner.get_state()["last_adapt"] == state["last_adapt"]


def test_lr_scaling_policy_state_before_the_model_is_attached():
    # KerasState takes its policies before fit and snapshots their state;
    # a joining worker's sync restores one before fit attaches it.
    policy, model = LRScalingPolicy("linear", base_batch=16, micro_batch_size=32), _model()
    policy.set_model(model)
    policy.on_train_begin()
    assert policy.lr.factor == pytest.approx(2.0)
    state = json.loads(json.dumps(policy.get_state()))
    joiner = LRScalingPolicy("linear", base_batch=16, micro_batch_size=32)
    assert joiner.get_state() == {"last_adapt": None, "base_batch": 16}
    joiner.restore(state)
    assert joiner.get_state() == state
    joiner.set_model(_model())
    assert joiner.lr.target == pytest.approx(2.0) and joiner.get_state() == state


def test_the_custom_policy_in_the_docs_runs():
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "policies.md")) as f:
        text = f.read()
    block = re.search(r"```python\n(from keras_adapt.actuators import GlobalBatchSize.*?)```",
                      text, re.S).group(1)
    assert len(block.strip().splitlines()) < 30
    namespace = {}
    exec(block, namespace)  # noqa: S102 - our own documentation
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 4)).astype("float32")
    y = (x.sum(1) + 2 * rng.standard_normal(2048)).astype("float32")
    model = _model(lr=0.01)
    policy = namespace["HalfNoiseScale"](interval=10)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[policy])
    changes = [e["after"]["batch_size"] for e in policy.events if e["kind"] == "batch_size"]
    assert changes, "the noisy task must make the policy grow the batch"
    assert all(b >= 64 and b % 64 == 0 for b in changes), changes
    assert policy.batch.value == changes[-1]
    # AdaScale's gain r > 1 once the batch is larger than the base, so the
    # progress runs ahead of the update count.
    assert policy.lr.progress > int(model.optimizer.iterations.numpy())


def test_policy_is_async_safe_and_decides_between_steps():
    # No per-step host sync on the policy's account (Keras 3 keeps its
    # async dispatch), and decisions still land between two steps.
    policy = GNSBatchSizePolicy(8, 64, micro_batch_size=8)
    assert policy.async_safe is True


def test_steps_per_execution_above_one_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse",
                  steps_per_execution=4)
    with pytest.raises(ValueError, match="steps_per_execution=4"):
        model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, verbose=0,
                  callbacks=[GNSBatchSizePolicy(8, 64, micro_batch_size=8)])
