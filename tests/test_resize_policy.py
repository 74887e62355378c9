"""Resize policies: the rules on scripted inputs, and real fits writing the target file."""

import json
import math
import os

import keras
import numpy as np
import pytest

import keras_adapt
from keras_adapt import discover
from keras_adapt.actuators import GradientAccumulation, WorkerTarget
from keras_adapt.callbacks import WorkerTimingMonitor
from keras_adapt.formulas.throughput import ThroughputModel
from keras_adapt.policies import GNSWorkerScalingPolicy, ResizePolicy, ThroughputScalingPolicy
from keras_adapt.policies.worker_scaling import step_pays
from keras_adapt.record import events


def _model(lr=0.05, stats=False):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr),
                                                   gradient_stats=stats), "mse")
    return model


class Scripted:
    """A throughput source with the monitor's interface, fed by the test."""

    interval = 1

    def __init__(self):
        self.measurements = 0
        self._result = {}

    def push(self, throughput, step_time=0.01):
        self.measurements += 1
        self._result = {"throughput": throughput, "step_time": step_time}

    def result(self):
        return dict(self._result)

    def new_measurement(self, since):
        return None if self.measurements == since else (self.measurements, self.result())


class Membership:
    """Stands for the job's worker count in the bookkeeping tests (the real
    change of membership is what the elastic tests run)."""

    def __init__(self, n):
        self.n = n


def _with_workers(cls, membership):
    return type(cls.__name__, (cls,), {"workers": property(lambda self: membership.n)})


def _attach(policy):
    policy.set_model(_model(stats=policy.needs_statistics))
    return policy


# -- the throughput rule ---------------------------------------------------------

def test_step_pays_compares_gain_per_added_worker_with_efficiency_times_per_worker():
    # 1 -> 3 workers: (250 - 100) / 2 = 75 per added worker against 0.8 x 100.
    assert not step_pays(1, 3, 100.0, 250.0, 0.8)
    assert step_pays(1, 3, 100.0, 260.0, 0.8)   # exactly 80: pays
    assert step_pays(2, 3, 180.0, 252.0, 0.8)   # 72 >= 0.8 x 90


@pytest.mark.parametrize("table, workers, expected", [
    ({1: 100.0}, 1, 2),                         # 2 not measured: try it
    ({1: 100.0, 2: 185.0}, 2, 3),               # 1 -> 2 paid (85 >= 80); try 3
    ({1: 100.0, 2: 185.0}, 1, 2),               # measured to pay: go back up
    ({1: 100.0, 2: 175.0}, 2, 1),               # 75 < 80: remove it
    ({1: 100.0, 2: 175.0}, 1, None),            # and never try again from below
    ({1: 100.0, 2: 190.0, 3: 230.0}, 3, 2),     # 40 < 0.8 x 95
    ({1: 100.0, 2: 190.0, 3: 230.0}, 2, None),
    ({1: 100.0, 2: 190.0, 3: 270.0, 4: 350.0}, 4, None),   # at max_workers, all paid
    ({1: 100.0, 3: 240.0}, 3, 2),               # a jump: 70 per added worker < 80
    ({}, 5, 4), ({}, 1, None),                   # above the bound; nothing measured
])
def test_throughput_rule_on_measured_tables(tmp_path, table, workers, expected):
    policy = ThroughputScalingPolicy(1, 4, Scripted(), efficiency=0.8,
                                     target_file=str(tmp_path / "t"))
    policy.throughput = {n: [t] for n, t in table.items()}
    proposal = policy.choose(workers)
    assert (None if proposal is None else proposal[0]) == expected
    below = ThroughputScalingPolicy(2, 4, Scripted(), target_file=str(tmp_path / "t"))
    assert below.choose(1)[0] == 2


@pytest.mark.parametrize("sync_latency", [0.0002, 0.0005])
def test_an_unmeasured_count_is_predicted_by_the_throughput_model(tmp_path, sync_latency):
    """With a determined fit the next count is asked for only when its
    *predicted* step pays, computed here from the generating formula."""
    def step_time(b, n):
        return 0.002 + 1e-4 * b + sync_latency * (n - 1)

    model = ThroughputModel(warmup=0, min_observations=1)
    for b in (16, 32, 64, 128):
        for n in (1, 2, 3):
            model.observe(b, step_time(b, n), workers=n)
    policy = ThroughputScalingPolicy(1, 8, Scripted(), efficiency=0.8, throughput_model=model,
                                     target_file=str(tmp_path / "t"))
    truth = {n: n * 64 / step_time(64, n) for n in (1, 2, 3, 4)}
    policy.throughput = {n: [truth[n]] for n in (1, 2, 3)}
    policy.configuration = (64, 1)
    pays = truth[4] - truth[3] >= 0.8 * truth[3] / 3
    assert pays == (sync_latency == 0.0002)   # the two cases fall on either side
    proposal = policy.choose(3)
    if pays:
        assert proposal[0] == 4 and proposal[1].startswith("predicted: 3 -> 4 workers")
        assert f"adds {truth[4] - truth[3]:.4g} samples/s" in proposal[1]
    else:
        assert proposal is None
    # Without a configuration (nothing fed yet) it explores instead.
    policy.configuration = None
    assert policy.choose(3)[0] == 4


def test_a_refused_throughput_fit_is_not_used_for_the_next_count(tmp_path):
    """Step times that follow no configuration (+-1% around 10 ms): the fit
    does not beat the constant model, so the policy measures N + 1 instead
    of predicting it."""
    model = ThroughputModel(warmup=0, min_observations=1)
    for i, b in enumerate((16, 32, 64, 128)):
        for n in (1, 2, 3):
            model.observe(b, 0.010 * (1 + 0.01 * (-1) ** (i + n)), workers=n)
    fit = model.fit()
    assert not fit.usable and "does not beat the constant model" in fit.reason
    policy = ThroughputScalingPolicy(1, 8, Scripted(), efficiency=0.8, throughput_model=model,
                                     target_file=str(tmp_path / "t"))
    policy.throughput = {n: [n * 64 / 0.010] for n in (1, 2, 3)}
    policy.configuration = (64, 1)
    proposal = policy.choose(3)
    assert proposal[0] == 4 and proposal[1].startswith("4 workers not measured yet")


def test_throughput_bookkeeping_warmup_patience_pending(tmp_path):
    """Scripted measurements and membership: exact requests at exact measurements."""
    members = Membership(1)
    monitor = Scripted()
    target = str(tmp_path / "target")
    policy = _attach(_with_workers(ThroughputScalingPolicy, members)(
        1, 3, monitor, efficiency=0.8, warmup_measurements=1, patience=2,
        target_file=target, log_dir=str(tmp_path / "logs")))
    requests = []

    def measure(value):
        monitor.push(value)
        before = len(policy.events)
        policy.adapt(policy.step, {})
        requests.append([e["after"]["target_workers"] for e in policy.events[before:]])

    measure(50.0)      # warm-up: left out
    measure(100.0)     # 2 not measured: proposal 1 of 2
    measure(100.0)     # proposal 2 of 2: request 2
    measure(100.0)     # pending: not asked again
    assert requests == [[], [], [2], []]
    assert discover.read_target(target) == 2 and policy.pending == 2
    members.n = 2      # Horovod started the second worker
    measure(120.0)     # warm-up at 2 workers: left out
    measure(175.0)     # 75 per added worker < 80: proposal 1 of 2 to go back
    measure(176.0)     # median 175.5: still < 80, request 1
    assert requests[4:] == [[], [], [1]]
    assert discover.read_target(target) == 1
    last = policy.events[-1]
    assert last["before"] == {"workers": 2, "target_workers": 2, "throughput": 175.5,
                              "throughput_by_workers": {"1": 100.0, "2": 175.5}}
    assert last["after"]["target_workers"] == 1
    members.n = 1
    for _ in range(4):
        measure(100.0)  # 1 -> 2 measured not to pay: stays at 1
    assert requests[7:] == [[], [], [], []]
    assert [e["kind"] for e in events.read_events(str(tmp_path / "logs"))] == ["resize", "resize"]
    assert events.read_events(str(tmp_path / "logs")) == policy.events
    # The state survives a JSON round trip (what a checkpoint or elastic sync does).
    state = json.loads(json.dumps(policy.get_state()))
    fresh = ThroughputScalingPolicy(1, 3, Scripted(), target_file=target)
    fresh.restore(state)
    assert fresh.measured() == policy.measured() == {1: 100.0, 2: 175.5}


def test_request_bookkeeping(tmp_path):
    members = Membership(2)
    target = str(tmp_path / "target")
    policy = _attach(_with_workers(ResizePolicy, members)(1, 4, target_file=target,
                                                          min_change_interval=0))
    assert policy.request_workers(2, "already there") is None
    assert not os.path.exists(target)
    first = policy.request_workers(3, "grow")
    assert (first["kind"], first["before"], first["after"]) == (
        "resize", {"workers": 2, "target_workers": 2}, {"workers": 2, "target_workers": 3})
    assert policy.request_workers(3, "again") is None
    cancel = policy.request_workers(2, "changed my mind")   # pending 3: ask for 2 again
    assert cancel["before"]["target_workers"] == 3 and discover.read_target(target) == 2
    assert policy.pending is None
    with pytest.raises(ValueError, match=r"workers=5 is not valid; .* 1 to 4 workers"):
        policy.request_workers(5, "too many")
    spaced = _attach(_with_workers(ResizePolicy, members)(1, 4, target_file=target,
                                                          min_change_interval=10))
    spaced.request_workers(3, "grow")
    assert spaced.request_workers(4, "too soon") is None   # same update, interval 10


def test_bad_arguments_name_the_value_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(discover.ENV_TARGET_FILE, raising=False)
    with pytest.raises(ValueError, match="KERAS_ADAPT_TARGET_FILE"):
        ResizePolicy(1, 2)
    monkeypatch.setenv(discover.ENV_TARGET_FILE, str(tmp_path / "from_env"))
    assert ResizePolicy(1, 2).target.target_file == str(tmp_path / "from_env")
    with pytest.raises(ValueError, match="min_workers=3 is larger than max_workers=2"):
        ResizePolicy(3, 2)
    with pytest.raises(ValueError, match="min_workers=0 is not valid"):
        ResizePolicy(0, 2)
    with pytest.raises(ValueError, match=r"efficiency=1.5 is not valid; use a fraction in \(0, 1"):
        ThroughputScalingPolicy(1, 2, Scripted(), efficiency=1.5)
    with pytest.raises(TypeError, match="pass the WorkerTimingMonitor"):
        ThroughputScalingPolicy(1, 2, object())
    with pytest.raises(ValueError, match="hysteresis=-1 is not valid"):
        GNSWorkerScalingPolicy(1, 2, hysteresis=-1)
    with pytest.raises(ValueError, match="workers=0 is not valid"):
        WorkerTarget(str(tmp_path / "t")).request(0)


# -- the noise-scale rule ----------------------------------------------------------

@pytest.mark.parametrize("workers, gns, expected", [
    (2, 300.0, 5),        # 4.69 workers of 64 needed >= 2 x 1.25
    (2, 150.0, None),     # 2.34 < 2.5: inside the band
    (2, 161.0, 3),        # 2.52 >= 2.5
    (1, 1e6, 8),          # clipped to max_workers
    (4, 100.0, 2),        # 1.56 x 1.25 <= 3: shrink
    (4, 230.0, None),     # 3.59 x 1.25 > 3
    (1, 10.0, None),      # already at min_workers
    (2, math.inf, None), (2, math.nan, None),
])
def test_gns_rule(tmp_path, workers, gns, expected):
    policy = GNSWorkerScalingPolicy(1, 8, per_worker_batch=64, hysteresis=0.25,
                                    target_file=str(tmp_path / "t"))
    proposal = policy.choose(workers, gns)
    assert (None if proposal is None else proposal[0]) == expected
    grow_only = GNSWorkerScalingPolicy(1, 8, per_worker_batch=64, allow_decrease=False,
                                       target_file=str(tmp_path / "t"))
    assert grow_only.choose(4, 100.0) is None


# -- real fits --------------------------------------------------------------------

class Logs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.throughput = []

    def on_train_batch_end(self, batch, logs=None):
        self.throughput.append(logs.get("throughput"))


def test_fit_writes_the_target_the_measured_throughput_asks_for(tmp_path):
    """One worker, real timing: the first measurement is a warm-up, two
    more propose 2 workers (not measured yet), so the request is made at
    update 15 and the event holds the median of the measurements the logs showed."""
    model = _model()
    monitor = WorkerTimingMonitor(interval=5, batch_size=16)
    target = str(tmp_path / "target")
    logdir = str(tmp_path / "logs")
    policy = ThroughputScalingPolicy(1, 2, monitor, warmup_measurements=1, patience=2,
                                     target_file=target, log_dir=logdir)
    logs = Logs()
    x = np.random.default_rng(0).normal(size=(16 * 30, 8))
    model.fit(x, x.sum(1), batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[monitor, policy, logs])
    assert discover.read_target(target) == 2
    assert [e["kind"] for e in policy.events] == ["resize"]
    event = policy.events[0]
    assert event["step"] == 15
    assert (event["before"]["target_workers"], event["after"]["target_workers"]) == (1, 2)
    # The logs after batches 5-9, 10-14 and 15-19 carry measurements 1, 2, 3.
    m1, m2, m3 = logs.throughput[5], logs.throughput[10], logs.throughput[15]
    assert logs.throughput[5:10] == [m1] * 5 and len({m1, m2, m3}) == 3
    assert event["after"]["throughput"] == pytest.approx(np.median([m2, m3]), rel=1e-12)
    assert event["after"]["throughput_by_workers"] == {"1": event["after"]["throughput"]}
    assert events.read_events(logdir) == policy.events


class StatsAtAdapt(keras.callbacks.Callback):
    """Reads the statistics where the policy does, after it, every 5 updates."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self._last = 0

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step != self._last and step % 5 == 0:
            self._last = step
            r = self.model.optimizer.gradient_statistics.result()
            self.seen.append((step, r["gns"], r["covered_updates"], r["batch_size"],
                              r["updates"]))


def test_fit_asks_for_the_workers_the_noise_scale_needs(tmp_path):
    """One worker accumulating 4 micro-batches of 8 (the statistics need two
    gradients or more): the noise scale grows as the fit converges and the
    policy asks for ceil(gns / 32) workers after two agreeing measurements
    (the statistics measure every 10 updates, the policy checks every 5)."""
    model = _model(lr=0.05, stats=True)
    GradientAccumulation(model, steps=4)
    target = str(tmp_path / "target")
    policy = GNSWorkerScalingPolicy(1, 6, hysteresis=0.25, patience=2, warmup_updates=10,
                                    interval=5, target_file=target, log_dir=str(tmp_path / "l"))
    stats = StatsAtAdapt()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8 * 4 * 100, 8))
    y = x @ np.linspace(-1, 1, 8) + rng.normal(scale=2.0, size=len(x))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[policy, stats])
    # The rule, applied independently to what the statistics said.
    expected, streak, asked, measured = [], None, 1, None
    for step, gns, covered, global_batch, updates in stats.seen:
        assert global_batch == 32
        if updates == measured:
            continue   # patience counts new measurements only
        measured = updates
        proposal = None
        if covered >= 10 and math.isfinite(gns):
            raw = gns / 32
            needed = min(max(math.ceil(raw - 1e-9), 1), 6)
            if needed > 1 and raw >= 1.25:
                proposal = needed
        if proposal is None or proposal == 1:
            streak = None
            continue
        streak = (proposal, streak[1] + 1 if streak and streak[0] == proposal else 1)
        if streak[1] >= 2 and proposal != asked:
            expected.append((step, proposal))
            asked, streak = proposal, None
    # It grew from about 40 to about 300 (measured): several requests, up to the bound.
    assert len(expected) >= 2 and expected[-1][1] == 6, (expected, stats.seen)
    got = [(e["step"], e["after"]["target_workers"]) for e in policy.events]
    assert got == expected
    assert discover.read_target(target) == expected[-1][1]
    for e in policy.events:
        gns = {s: g for s, g, *_ in stats.seen}[e["step"]]
        assert e["after"]["gns"] == pytest.approx(gns, rel=1e-12)
        assert e["after"]["per_worker_batch"] == 32.0
    assert events.read_events(str(tmp_path / "l")) == policy.events


def test_a_new_worker_with_restored_state_decides_as_the_others(tmp_path):
    """After an elastic reset the continuing worker keeps its policy object and
    a new worker builds a fresh one and restores the state: fed the same
    measurements from the restart on, both make the same requests."""
    members = Membership(1)
    cls = _with_workers(ThroughputScalingPolicy, members)
    old_monitor, new_monitor = Scripted(), Scripted()
    old = _attach(cls(1, 3, old_monitor, warmup_measurements=1, patience=2,
                      target_file=str(tmp_path / "t_old")))
    old.on_adapt_begin({})
    for value in (90.0, 100.0, 100.0):   # warm-up, then a request for 2
        old_monitor.push(value)
        old.adapt(old.step, {})
    assert [e["after"]["target_workers"] for e in old.events] == [2]
    members.n = 2   # the reset: the new worker joins with the state
    new = _attach(cls(1, 3, new_monitor, warmup_measurements=1, patience=2,
                      target_file=str(tmp_path / "t_new")))
    new.restore(json.loads(json.dumps(old.get_state())))
    for policy in (old, new):
        policy.on_adapt_begin({})
    for value in (150.0, 170.0, 171.0, 172.0):   # 70 per added worker < 80: back to 1
        for monitor, policy in ((old_monitor, old), (new_monitor, new)):
            monitor.push(value)
            policy.adapt(policy.step, {})
    assert [e["after"]["target_workers"] for e in old.events[1:]] == [1]
    assert [(e["step"], e["before"], e["after"]) for e in new.events] == \
        [(e["step"], e["before"], e["after"]) for e in old.events[1:]]


def test_gns_policy_of_a_new_worker_counts_the_same_measurements(tmp_path):
    """The statistics' measurement present when training restarts counts for
    neither the continuing worker nor the new one, so patience runs alike."""
    members = Membership(2)
    cls = _with_workers(GNSWorkerScalingPolicy, members)
    kwargs = dict(per_worker_batch=16, patience=2, warmup_updates=0,
                  target_file=str(tmp_path / "t"))
    old = _attach(cls(1, 8, **kwargs))
    old.on_adapt_begin({"updates": 0})
    stats = {"covered_updates": 100}
    old.adapt(0, {**stats, "updates": 1, "gns": 20.0})   # 1.25 workers: nothing
    old.adapt(0, {**stats, "updates": 2, "gns": 90.0})   # 5.6: proposal 6, 1 of 2
    new = _attach(cls(1, 8, **kwargs))
    new.restore(json.loads(json.dumps(old.get_state())))
    for policy in (old, new):
        policy.on_adapt_begin({"updates": 2})   # the reset, at measurement 2
    counts = []
    for updates in (2, 3, 4):
        for policy in (old, new):
            policy.adapt(0, {**stats, "updates": updates, "gns": 90.0})
        counts.append((updates, len(old.events), len(new.events)))
    # Old: 2 was already counted, 3 is the 2nd in a row. New: 2 is not
    # counted (it was there at the restart), but the restored proposal isn't
    # either: both reset their streak at the restart, so both request at 4.
    assert counts == [(2, 0, 0), (3, 0, 0), (4, 1, 1)]
    assert [e["after"]["target_workers"] for e in old.events] == [6]
    assert [(e["before"], e["after"]) for e in new.events] == \
        [(e["before"], e["after"]) for e in old.events]
    assert old.events[0]["after"]["gns"] == 90.0
