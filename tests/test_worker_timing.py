"""WorkerTimingMonitor, the in-graph collective timing and the slow-rank hook."""

import json
import math
import os
import statistics

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.callbacks import WorkerTimingMonitor
from keras_adapt.monitors.worker_timing import SLOW_RANK_ENV, CollectiveTiming, slow_rank
from keras_adapt import report
from keras_adapt.record import metadata, reader
from keras_adapt.record.runs import load_runs

import tensorboard_loaders
from conftest import controllers, horovodrun, load_rank_results

STEPS, BATCH, INTERVAL = 60, 32, 5  # tests/workers/timing_checks.py: 2 epochs of 30 steps


def _launch(tmp_path, name, env=(), controller="gloo", extra=()):
    out, log_dir = tmp_path / f"out_{name}", tmp_path / f"run_{name}"
    out.mkdir()
    saved = {k: os.environ.get(k) for k, _ in env}
    os.environ.update(dict(env))
    try:
        horovodrun("timing_checks.py", ["--out", out, "--log_dir", log_dir, *extra], np=2,
                   controller=controller, timeout=300)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return load_rank_results(str(out), 2), log_dir


def _read_series(log_dir):
    parent, name = os.path.split(os.path.normpath(str(log_dir)))
    provider, stop = tensorboard_loaders.provider("python", parent, expect_runs=[name])
    try:
        return {tag: {s: v for s, _, v in points}
                for tag, points in reader.read_series(provider, None, "", name).items()}
    finally:
        stop()


def _median(results, key, rank):
    return statistics.median(r["result"][key][rank] for r in results)


def _check_run(results, slow_hook=False, collectives=STEPS):
    """What must hold in every 2-worker run; returns rank 0's measurements."""
    r0, r1 = results
    assert (r0["size"], r0["steps"], r1["steps"]) == (2, STEPS, STEPS)
    # No timestamp in the update unless a monitor (or the slow-rank hook) asked for them.
    assert (r0["timestamp_without"], r0["timestamp_with"]) == (slow_hook, True)
    # A model that trained without the monitor: nothing timed in that fit; its
    # train function is traced again with the monitor and its 4 updates are timed.
    assert r0["retraced_collectives"] == r1["retraced_collectives"] == [0, 4]
    # One timed collective (the grouped gradient allreduce) per update, on each rank.
    assert r0["collectives"] == r1["collectives"] == collectives
    # The same agreed values on both ranks, from the one allgather.
    assert [x["result"] for x in r0["results"]] == [x["result"] for x in r1["results"]]
    measured = r0["results"]
    # A measurement every INTERVAL steps, the first of each epoch's window excluded.
    assert len(measured) >= 9
    for x in measured:
        res, logs = x["result"], x["logs"]
        assert res["steps"] in (INTERVAL - 1, INTERVAL)
        assert len(res["compute_time"]) == len(res["wait_time"]) == 2
        fractions = []
        for rank in (0, 1):
            step = logs[metadata.worker_time_key("step_time", rank)]
            compute, wait = res["compute_time"][rank], res["wait_time"][rank]
            assert wait > 0.0 and compute > 0.0
            assert compute + wait == pytest.approx(step, rel=1e-9)
            assert logs[metadata.worker_time_key("compute_time", rank)] == compute
            assert logs[metadata.worker_time_key("wait_time", rank)] == wait
            fractions.append(wait / step)
        assert 0.0 <= res["comm_fraction"] <= 1.0
        assert res["comm_fraction"] == pytest.approx(np.mean(fractions), rel=1e-12)
        steps = [logs[metadata.worker_time_key("step_time", r)] for r in (0, 1)]
        assert res["step_time"] == pytest.approx(np.mean(steps), rel=1e-12)
        # GradientStatsMonitor recorded the batch of 32 on each of the 2 workers.
        assert res["throughput"] == pytest.approx(2 * BATCH / res["step_time"], rel=1e-9)
        assert logs["comm_fraction"] == res["comm_fraction"]
    for r in results:
        rank = r["rank"]
        # The intervals cover part of the steps, so part of the total wait
        # (read from the variable) and of the wall time of fit.
        timed_wait = sum(x["result"]["wait_time"][rank] * x["result"]["steps"] for x in measured)
        assert 0.0 < timed_wait <= r["wait_total"] + 1e-9
        timed = sum(x["logs"][metadata.worker_time_key("step_time", rank)] * x["result"]["steps"]
                    for x in measured)
        assert timed < r["elapsed"]
    return measured


def _check_series(log_dir, measured):
    """The series rank 0's AdaptTensorBoard wrote are the monitor's values."""
    series = _read_series(log_dir)
    tags = [metadata.worker_time_tag(t, r) for t in metadata.WORKER_TIMES for r in (0, 1)]
    tags += [metadata.SCALAR_TAGS[k] for k in ("step_time", "comm_fraction", "throughput")]
    for tag in tags:
        assert tag in series, tag
    assert metadata.worker_time_tag("wait_time", 2) not in series
    last = measured[-1]
    for rank in (0, 1):
        for which, values in (("compute_time", [x["result"]["compute_time"][rank] for x in measured]),
                              ("wait_time", [x["result"]["wait_time"][rank] for x in measured])):
            written = series[metadata.worker_time_tag(which, rank)]
            assert len(written) >= 8
            # every written point is one of the monitor's measurements (as
            # float32, TensorBoard's scalar type) ...
            for value in written.values():
                assert min(abs(value - v) for v in values) <= 1e-6 * abs(value), (which, value)
            # ... and the epoch-end write at the last step is the last one
            assert written[STEPS] == pytest.approx(values[-1], rel=1e-6)
    assert series[metadata.SCALAR_TAGS["comm_fraction"]][STEPS] == pytest.approx(
        last["result"]["comm_fraction"], rel=1e-6)
    # keras-adapt report draws those series in the run's worker-timing row.
    runs = load_runs(str(log_dir.parent), runs=[log_dir.name])
    assert report.has_timing_series(runs[0])
    fig = report.build_figure(runs)
    assert fig.get_size_inches()[1] == report.RUN_HEIGHT_IN + report.TIMING_ROW_IN
    axes = {ax.get_title(): ax for ax in fig.axes}
    for title, which in (("compute time per worker (s)", "compute_time"),
                         ("wait in collectives per worker (s)", "wait_time"),
                         ("step time per worker (s)", "step_time")):
        lines = {ln.get_label(): list(ln.get_ydata()) for ln in axes[title].get_lines()
                 if not ln.get_label().startswith("_")}
        assert lines == {f"rank {r}": list(series[metadata.worker_time_tag(which, r)].values())
                         for r in (0, 1)}, title
    return series


STRAGGLER = {"warmup_s": 0.3, "patience": 3, "threshold": 0.067, "noise_window": 3}


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """``plain_run(controller)``: one 2-worker run without delay or slow rank
    (StragglerPolicy watching), made once per controller and shared by the
    tests that compare a changed run with it."""
    done = {}

    def run(controller):
        if controller not in done:
            done[controller] = _launch(tmp_path_factory.mktemp(f"timing_{controller}"), "plain",
                                       controller=controller,
                                       extra=["--straggler", json.dumps(STRAGGLER)])
        return done[controller]

    return run


@pytest.mark.parametrize("controller", controllers())
def test_two_workers_wait_and_compute_time_and_a_collective_delay(tmp_path, controller,
                                                                  plain_run):
    plain, log_dir = plain_run(controller)
    measured = _check_run(plain)
    _check_series(log_dir, measured)

    # A 50 ms delay before each collective is time in the collective: every
    # worker's measured wait per step is at least that (a lower bound
    # whatever the machine's load), and so is its share of the step.
    delayed, _ = _launch(tmp_path, "delay", [("KERAS_ADAPT_COLLECTIVE_DELAY_MS", "50")],
                         controller=controller)
    slow_measured = _check_run(delayed)
    for x in slow_measured:
        res = x["result"]
        assert min(res["wait_time"]) >= 0.050
        steps = [x["logs"][metadata.worker_time_key("step_time", r)] for r in (0, 1)]
        assert res["comm_fraction"] >= np.mean([0.050 / s for s in steps]) - 1e-12
    median_plain = statistics.median(x["result"]["comm_fraction"] for x in measured)
    median_delay = statistics.median(x["result"]["comm_fraction"] for x in slow_measured)
    print(f"median comm_fraction: plain {median_plain:.3f}, 50 ms delay {median_delay:.3f}")


def _expected_flags(measured, warmup_s, patience, threshold, noise_window):
    """(recorded step, rank, ratio) of the flags the rule gives on these
    measurements, and the index of the first judged one: after the warm-up,
    ``noise_window`` measurements set the threshold and patience
    (``noise_rule``, tested on its own below), then a rank above the median
    by more than that threshold in that many consecutive measurements."""
    from keras_adapt.policies.straggler import noise_rule

    flags, timed, streak, window, judged, first = [], 0.0, {}, [], None, None
    for i, x in enumerate(measured):
        res = x["result"]
        warm = timed >= warmup_s
        timed += res["step_time"] * res["steps"]
        if not warm:
            if timed >= warmup_s and noise_window == 0:
                judged = noise_rule([], threshold, patience, 4.0)[1:]
            continue
        median = float(np.median(res["compute_time"]))
        if judged is None:
            window.append([c / median for c in res["compute_time"]])
            if len(window) == noise_window:
                judged = noise_rule(window, threshold, patience, 4.0)[1:]
            continue
        first = i if first is None else first
        t, p = judged
        slow = {r: c / median for r, c in enumerate(res["compute_time"]) if c > (1 + t) * median}
        streak = {r: streak.get(r, 0) + 1 for r in slow}
        flags += [(x["step"], r, slow[r]) for r in sorted(slow) if streak[r] == p]
    return flags, first


def _check_straggler_events(results, log_dir):
    measured = results[0]["results"]
    expected, first = _expected_flags(measured, **STRAGGLER)
    for r in results:
        got = [(e["step"] + 1, e["after"]["straggler_rank"], e["after"]["ratio"])
               for e in r["events"]]
        assert [g[:2] for g in got] == [e[:2] for e in expected]
        assert [g[2] for g in got] == pytest.approx([e[2] for e in expected], rel=1e-9)
        assert all(e["kind"] == "straggler" and e["policy"] == "StragglerPolicy"
                   for e in r["events"])
    # rank 0 writes the run's event log (none without an event)
    path = log_dir / metadata.EVENTS_FILENAME
    assert (len(path.read_text().splitlines()) if path.exists() else 0) == len(expected)
    return expected, first


def test_slow_rank_hook_makes_rank1_ten_times_slower_and_is_flagged(tmp_path, plain_run):
    extra = ["--straggler", json.dumps(STRAGGLER)]
    plain, plain_dir = plain_run("gloo")
    slow, slow_dir = _launch(tmp_path, "slow", [(SLOW_RANK_ENV, "1:10")], extra=extra)
    plain_measured, slow_measured = _check_run(plain), _check_run(slow, slow_hook=True)
    # The hook's sleep, read back: on rank 1 of the slowed job only.
    assert [r["slept"] for r in plain] == [0.0, 0.0]
    assert slow[0]["slept"] == 0.0 and slow[1]["slept"] > 0.0
    def compute_ratio(measured):
        return statistics.median(x["result"]["compute_time"][1] / x["result"]["compute_time"][0]
                                 for x in measured)
    plain_ratio, ratio = compute_ratio(plain_measured), compute_ratio(slow_measured)
    waits = {(run, rank): _median(measured, "wait_time", rank) for run, measured in (
        ("plain", plain_measured), ("slow", slow_measured)) for rank in (0, 1)}
    print(f"slow rank 1:10: median compute ratio {plain_ratio:.2f} -> {ratio:.2f}; waits {waits}")
    # Rank 1 sleeps nine times its own gap between collectives: a slow-down
    # that a loaded machine (which at worst shares a core of the other
    # rank's, halving its speed) cannot hide. The fast rank waits for the
    # slow one, longer than rank 1 does.
    assert waits["slow", 0] > waits["slow", 1], waits

    # StragglerPolicy: its decisions are the rule applied to the monitor's
    # (agreed) measurements, on both ranks, and written to the event log;
    # rank 1, never rank 0, is flagged, once it was slow in the patience's
    # measurements after the warm-up and the noise window.
    flags, first = _check_straggler_events(slow, slow_dir)
    assert flags and {f[1] for f in flags} == {1}
    steps = [x["step"] for x in slow_measured]
    assert first >= 1 + STRAGGLER["noise_window"]  # the warm-up held back at least one
    assert steps.index(flags[0][0]) >= first + STRAGGLER["patience"] - 1
    print(f"straggler flagged at step {flags[0][0] - 1}, ratio {flags[0][2]:.2f}")
    _check_straggler_events(plain, plain_dir)


@pytest.mark.primary_only  # the hook's factor; on tf.keras 2 the slowed-rank test above runs the hook
def test_slow_rank_hook_slows_by_its_factor_with_and_without_the_monitor(tmp_path):
    # Every forward pass sleeps at least 20 ms, so every gap between two
    # collectives does: rank 1 slowed 1.5x sleeps at least (1.5 - 1) x 20 ms
    # more per step, inside the step, whether or not a WorkerTimingMonitor
    # times the collectives. Read back from the hook, and seen on the host's
    # clock and in the monitor's compute times; lower bounds all, whatever
    # the machine's load. (The hook once slept at the start of the step:
    # its gap was the host work between steps only, far below 20 ms.)
    factor = 1.5
    out = tmp_path / "out"
    out.mkdir()
    horovodrun("slow_rank_checks.py", ["--out", out, "--factor", factor], np=2, timeout=300)
    results = load_rank_results(str(out), 2)
    blocks, block, sleep_s = 3, 12, results[0]["sleep_s"]
    for r in results:
        runs = {(run["timed"], run["slow"]): run for run in r["runs"]}
        for (timed, slow), run in runs.items():
            # each block's steps but its first two, on the host's clock
            assert [len(b) for b in run["steps"]] == [block - 2] * blocks
            # the hook sleeps on rank 1 only, and only in the slowed jobs; in
            # a fit every step's gap holds the 20 ms (the first step of each
            # fit follows a gap between fits, left out of the bound)
            if slow and r["rank"] == 1:
                assert run["slept"] >= (factor - 1) * sleep_s * blocks * (block - 1), run["slept"]
            else:
                assert run["slept"] == 0.0, (timed, slow, r["rank"])
            # a step holds the rank's forward pass, and on rank 1 its sleep
            least = factor * sleep_s if slow and r["rank"] == 1 else sleep_s
            assert min(t for b in run["steps"] for t in b) >= least, (timed, slow, r["rank"])
            # the monitor: compute time (step minus wait) holds them too
            if timed:
                assert run["measurements"]
                least = factor * sleep_s if slow else sleep_s
                for m in run["measurements"]:
                    assert m["compute_time"][1] >= least and m["compute_time"][0] >= sleep_s
    # Both ranks timed the same steps and agreed on the measurements.
    for a, b in zip(*(r["runs"] for r in results)):
        assert [len(x) for x in a["steps"]] == [len(x) for x in b["steps"]]
        assert a["measurements"] == b["measurements"]


# The averaging collective is timed by the same CollectiveTiming as the
# allreduce; on tf.keras 2 the two-worker test above times the monitor's binding.
@pytest.mark.primary_only
def test_local_sgd_model_averaging_is_timed(tmp_path):
    # LocalSGD(period=5) without statistics: the only collective is the
    # models' average every 5 updates, and it is what the monitor times.
    results, log_dir = _launch(tmp_path, "local", extra=["--local_sgd", "5"])
    # plus one average of weights and slots on entering the strategy (first update)
    measured = _check_run(results, collectives=STEPS // 5 + 1)
    # Both models are averaged at the same steps: one timed wait per interval of 5.
    assert all(x["result"]["steps"] in (4, 5) for x in measured)
    _check_series(log_dir, measured)


# -- one process -------------------------------------------------------------


def _model():
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    return model


def test_one_worker_waits_nothing_and_logs_between_measurements():
    model = _model()
    monitor = WorkerTimingMonitor(interval=4, batch_size=16)
    before = monitor.result()  # no measurement yet: what a policy can test
    assert before["steps"] == 0 and before["compute_time"] == [] and np.isnan(before["comm_fraction"])
    seen = []

    class Logs(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(dict(logs))

    x = np.random.rand(16 * 10, 3).astype("float32")
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0, callbacks=[monitor, Logs()])
    # No measurement until step 4 (the first step, with tracing, is not timed).
    assert ["comm_fraction" in s for s in seen] == [False] * 4 + [True] * 6
    r = monitor.result()
    assert r["steps"] == 4 and r["wait_time"] == [0.0] and r["comm_fraction"] == 0.0
    assert monitor.measurements == 2  # at steps 4 and 8 (10 steps)
    # What the policies ask: a measurement after the first `since` ones?
    assert monitor.new_measurement(since=0) == (2, r)
    assert monitor.new_measurement(since=1) == (2, r)
    assert monitor.new_measurement(since=2) is None
    assert r["compute_time"][0] == r["step_time"] > 0.0
    assert r["throughput"] == pytest.approx(16 / r["step_time"])
    assert seen[-1][metadata.worker_time_key("compute_time", 0)] == r["compute_time"][0]
    # A result is a copy: changing it changes nothing.
    r["wait_time"].append(1.0)
    assert monitor.result()["wait_time"] == [0.0]


def test_monitor_drops_a_train_function_traced_without_stamps(tmp_path):
    from keras_adapt.callbacks import AdaptTensorBoard

    model = _model()
    x = np.random.rand(64, 3).astype("float32")
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
    assert model.train_function is not None
    timing = model.optimizer.adapt_state.timing
    assert not timing.enabled
    monitor = WorkerTimingMonitor(interval=2)
    monitor.set_model(model)
    assert timing.enabled and timing.monitored and model.train_function is None
    log_dir = tmp_path / "run"
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0,
              callbacks=[monitor, AdaptTensorBoard(log_dir, update_freq=2)])
    assert monitor.result()["steps"] >= 1
    # After that fit AdaptTensorBoard gathers its own step times again.
    assert timing.enabled and not timing.monitored
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0,
              callbacks=[AdaptTensorBoard(log_dir, update_freq=2)])
    series = _read_series(log_dir)
    # 2nd fit (steps 5-8): the monitor's first measurement (at the start of
    # step 7) reaches the logs after the write at step 6, so only step 8 has it.
    assert sorted(series[metadata.worker_time_tag("compute_time", 0)]) == [8]
    # 3rd fit: AdaptTensorBoard's own step times again, at steps 10 and 12.
    assert sorted(series[metadata.step_time_tag(0)]) == [8, 10, 12]


def test_collective_timing_brackets_the_collective():
    import tensorflow as tf

    timing = CollectiveTiming()
    timing.enable()

    @tf.function
    def run():
        def collective(ts):
            # 30 ms in the "collective"
            done = tf.py_function(lambda: __import__("time").sleep(0.03) or 0, [], tf.int32)
            with tf.control_dependencies([done]):
                return [t * 2.0 for t in ts]
        return timing.bracket(collective, [tf.constant([1.0, 2.0])], size=2)

    for _ in range(3):
        assert run()[0].numpy().tolist() == [2.0, 4.0]
    wait, count = timing.read()
    assert count == 3 and wait >= 0.09  # at least the 3 x 30 ms the collective slept


def test_bracket_in_a_cond_branch_waits_for_its_inputs(monkeypatch):
    # The update reduces inside a tf.cond branch, where a control dependency
    # on a tensor of the enclosing graph is dropped: the first stamp (and the
    # slow-rank sleep) once ran at the start of the step, so the "wait" held
    # the whole computation and the hook stretched almost nothing.
    import time

    import tensorflow as tf

    monkeypatch.setenv(SLOW_RANK_ENV, "0:2")
    timing = CollectiveTiming()
    timing.enable()

    def compute():
        time.sleep(0.3)  # 300 ms of "computation" that the gradient needs
        return np.float32(1.0)

    @tf.function
    def step(pred):
        grad = tf.py_function(compute, [], tf.float32)
        branch = lambda: timing.bracket(lambda ts: [t * 2.0 for t in ts], [grad], size=2)
        return tf.cond(pred, branch, branch)

    seconds, waits = [], []
    for _ in range(4):
        start, before = time.perf_counter(), timing.read()[0]
        assert float(step(tf.constant(True))[0]) == 2.0
        seconds.append(time.perf_counter() - start)
        waits.append(timing.read()[0] - before)
    assert timing.read()[1] == 4
    # the collective alone: no step's wait holds the 300 ms of computation
    # (with the first stamp at the start of the step, each one did)
    assert all(w < 0.3 for w in waits), waits
    # from the 2nd step on, rank 0 sleeps (2 - 1) x its 300+ ms between collectives
    assert all(s >= 0.6 for s in seconds[1:]), seconds


def test_bad_arguments_are_named(monkeypatch):
    with pytest.raises(ValueError, match="interval=0"):
        WorkerTimingMonitor(interval=0)
    with pytest.raises(ValueError, match="batch_size=-2"):
        WorkerTimingMonitor(batch_size=-2)
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match="keras_adapt.DistributedOptimizer"):
        WorkerTimingMonitor().set_model(model)
    for bad in ("1", "1:x", "-1:3", "1:0.5", "1:nan"):
        monkeypatch.setenv(SLOW_RANK_ENV, bad)
        with pytest.raises(ValueError, match=f"{SLOW_RANK_ENV}='{bad}' is not valid"):
            slow_rank()
    monkeypatch.setenv(SLOW_RANK_ENV, " 0:1.3 ")
    assert slow_rank() == (0, 1.3)


def test_worker_time_tags_round_trip():
    for which in metadata.WORKER_TIMES:
        tag = metadata.worker_time_tag(which, 12)
        assert metadata.parse_worker_time_tag(tag) == (which, 12)
        assert metadata.parse_worker_time_tag(metadata.worker_time_key(which, 3)) == (which, 3)
    assert metadata.step_time_tag(4) == metadata.worker_time_tag("step_time", 4)
    for other in ("adapt/step_time", "adapt/gpu_time/rank_1", "adapt/wait_time/rank_x",
                  "adapt/system/host_0/cpu_percent"):
        assert metadata.parse_worker_time_tag(other) is None
    with pytest.raises(ValueError, match="gpu_time"):
        metadata.worker_time_key("gpu_time", 0)


def test_sync_strategy_policy_reads_the_monitor_before_and_after_its_first_measurement():
    # SyncStrategyPolicy reads result()["comm_fraction"] from its first step
    # on, before the monitor measured anything.
    from keras_adapt.policies import SyncStrategyPolicy
    from keras_adapt.sync import AllReduceSGD, LocalSGD

    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05), gradient_stats=True,
                                           sync_strategy=[AllReduceSGD(), LocalSGD(period=4)])
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(opt, "mse")
    monitor = WorkerTimingMonitor(interval=3)
    policy = SyncStrategyPolicy(local=LocalSGD(period=4), timing=monitor, interval=3,
                                warmup_updates=0, patience=1, min_switch_interval=0)
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
    model.fit(x, x.sum(1), batch_size=8, epochs=1, verbose=0, callbacks=[monitor, policy])
    assert monitor.measurements == 3 and monitor.result()["comm_fraction"] == 0.0


def test_straggler_policy_arguments_and_rule():
    from keras_adapt.policies import StragglerPolicy
    from keras_adapt.policies.straggler import slow_ranks

    monitor = WorkerTimingMonitor(interval=7)
    assert StragglerPolicy(monitor).interval == 7  # checks at the monitor's pace
    with pytest.raises(TypeError, match="WorkerTimingMonitor"):
        StragglerPolicy(None)
    for kwargs, match in (({"warmup_s": -1}, "warmup_s=-1"), ({"threshold": 0}, "threshold=0"),
                          ({"threshold": float("nan")}, "threshold=nan"),
                          ({"patience": 0}, "patience=0"),
                          ({"noise_window": -1}, r"noise_window=-1 is not valid; use an int >= 0"),
                          ({"noise_window": 2.5}, "noise_window=2.5"),
                          ({"noise_multiple": 0}, r"noise_multiple=0 is not valid; use a multiple"),
                          ({"noise_multiple": "4"}, "noise_multiple='4'")):
        with pytest.raises(ValueError, match=match):
            StragglerPolicy(monitor, **kwargs)
    # median of 4 workers is 0.0105: 0.0113 is 7.6 % above (flagged), 0.0112 6.7 % (not)
    assert slow_ranks([0.010, 0.011, 0.0113, 0.0100], 0.067) == {2: pytest.approx(0.0113 / 0.0105)}
    assert slow_ranks([0.010, 0.011, 0.0112, 0.0100], 0.067) == {}
    assert slow_ranks([0.0, 0.0], 0.067) == {}


def test_noise_rule_against_hand_computed_thresholds():
    from keras_adapt.policies.straggler import MAD_TO_SIGMA, noise_rule

    # Three workers, rank 2 slow from the start: its own median (1.2) is its
    # baseline, so it does not widen the spread. Deviations from the own
    # medians (1, 1, 1.2): rank 0 and 1 all 0; rank 2 0.02, 0, 0.02, 0.04:
    # the median of the 12 deviations is 0, the floor holds.
    window = [[1.0, 1.0, 1.22], [1.0, 1.0, 1.2], [1.0, 1.0, 1.18], [1.0, 1.0, 1.24]]
    assert noise_rule(window, 0.067, 3, 4.0) == (0.0, 0.067, 3)
    # Two workers, noisy: ratios 1 -+ d with d = 0, .05, .1, .05, .15, .05 (by
    # measurement). Own medians: 1 -+ .05 (medians of 6: (.05 + .05) / 2);
    # deviations .05, 0, .05, 0, .1, 0 on each rank: median .025.
    d = [0.0, 0.05, 0.1, 0.05, 0.15, 0.05]
    noise, threshold, patience = noise_rule([[1 - v, 1 + v] for v in d], 0.067, 3, 4.0)
    assert noise == pytest.approx(MAD_TO_SIGMA * 0.025)
    assert threshold == pytest.approx(4 * MAD_TO_SIGMA * 0.025)  # 0.148 > 0.067
    # one measurement (d = .15) 0.1 above its own median: not beyond 0.148
    assert patience == 3
    # A burst of 3 measurements 0.4 above the median in a quiet window: the
    # patience outlasts it (the spread, median of mostly zeros, stays 0).
    burst = [[1.0, 1.0, 1.0]] * 4 + [[1.0, 1.0, 1.4]] * 3 + [[1.0, 1.0, 1.0]] * 3
    assert noise_rule(burst, 0.067, 2, 4.0) == (0.0, 0.067, 4)
    assert noise_rule([], 0.1, 2, 4.0) == (0.0, 0.1, 2)


class ScriptedMonitor(WorkerTimingMonitor):
    """A WorkerTimingMonitor whose measurements the test gives: a synthetic
    timing source, so the policy's decisions are known in advance."""

    def __init__(self):
        super().__init__(interval=1)
        self.pending = None

    def give(self, compute_time, step_time=0.1, steps=10):
        self.pending = {"step_time": step_time, "comm_fraction": 0.0, "throughput": math.nan,
                        "compute_time": list(compute_time), "wait_time": [0.0] * len(compute_time),
                        "steps": steps}

    def new_measurement(self, since):
        if self.pending is None:
            return None
        result, self.pending = self.pending, None
        self.measurements += 1
        return self.measurements, result


def _scripted_policy(**kwargs):
    from keras_adapt.policies import StragglerPolicy

    monitor = ScriptedMonitor()
    policy = StragglerPolicy(monitor, **kwargs)
    policy.set_model(_model())
    policy.on_adapt_begin({})

    def measure(compute_time):
        """One measurement (1 s of timed training) at the next update."""
        policy.model.optimizer.iterations.assign_add(10)
        monitor.give(compute_time)
        policy.adapt(policy.step, {})
        return [(e["step"], e["after"]["straggler_rank"]) for e in policy.events]

    return policy, measure


def test_straggler_threshold_and_patience_come_from_the_measured_noise():
    from keras_adapt.policies.straggler import MAD_TO_SIGMA

    # Warm-up 1 s (the first measurement), then a noise window of 6 on a noisy
    # machine: ratios 1 -+ d, d as in the hand-computed case above.
    policy, measure = _scripted_policy(warmup_s=1.0, threshold=0.067, patience=2,
                                       noise_window=6, noise_multiple=4.0)
    assert measure([0.1, 0.1]) == [] and policy.judged_threshold is None
    for v in (0.0, 0.05, 0.1, 0.05, 0.15, 0.05):
        assert measure([0.1 * (1 - v), 0.1 * (1 + v)]) == []
    t = 4 * MAD_TO_SIGMA * 0.025
    assert policy.noise == pytest.approx(MAD_TO_SIGMA * 0.025)
    assert policy.judged_threshold == pytest.approx(t) and policy.judged_patience == 2
    assert policy.warmup_end_step == 70  # the 7th measurement completed the window
    # Ratio 1.12 (above the 6.7 % floor, within this machine's noise): never
    # flagged, however long; the fixed rule of the floor would flag it.
    for _ in range(5):
        assert measure([0.1, 0.1 * 1.12 / 0.88]) == []
    # Beyond the threshold (ratio 1.2 of two workers: 1.5x slower) twice in a
    # row: flagged at the second, once.
    assert measure([0.1, 0.15]) == []
    assert measure([0.1, 0.15]) == [(140, 1)]
    assert measure([0.1, 0.15]) == [(140, 1)]
    event = policy.events[0]
    assert event["after"]["ratio"] == pytest.approx(1.2)
    assert f"(threshold {1 + t:.3g}x)" in event["reason"] and "for 2 measurements" in event["reason"]
    # The same measurements with no noise window: the floor and patience as given.
    fixed, measure = _scripted_policy(warmup_s=1.0, threshold=0.067, patience=2, noise_window=0)
    assert measure([0.1, 0.1]) == [] and fixed.warmup_end_step == 10
    assert (fixed.noise, fixed.judged_threshold, fixed.judged_patience) == (0.0, 0.067, 2)
    assert measure([0.1, 0.1 * 1.12 / 0.88]) == []
    assert measure([0.1, 0.1 * 1.12 / 0.88]) == [(30, 1)]


def test_straggler_patience_outlasts_a_burst_seen_while_healthy():
    # Three workers; in the quiet noise window, rank 0 is 40 % slower for
    # two measurements in a row: the patience becomes 3, and a burst as long
    # as that one is not a straggler; one measurement longer is.
    policy, measure = _scripted_policy(warmup_s=0.0, patience=2, noise_window=6)
    for c in ([0.1] * 3, [0.14, 0.1, 0.1], [0.14, 0.1, 0.1], [0.1] * 3, [0.1] * 3, [0.1] * 3):
        assert measure(c) == []
    assert (policy.noise, policy.judged_threshold, policy.judged_patience) == (0.0, 0.067, 3)
    assert policy.warmup_end_step == 60
    for c in ([0.14, 0.1, 0.1], [0.14, 0.1, 0.1], [0.1] * 3, [0.1, 0.1, 0.14], [0.1, 0.1, 0.14]):
        assert measure(c) == []
    assert measure([0.1, 0.1, 0.14]) == [(120, 2)]


def test_straggler_exclude_arguments(tmp_path, monkeypatch):
    from keras_adapt.policies import StragglerPolicy

    monitor = WorkerTimingMonitor(interval=5)
    monkeypatch.delenv("KERAS_ADAPT_EXCLUDE_FILE", raising=False)
    with pytest.raises(ValueError, match="KERAS_ADAPT_EXCLUDE_FILE") as info:
        StragglerPolicy(monitor, action="exclude")
    assert "--exclude-file" in str(info.value)
    path = tmp_path / "excluded"
    for kwargs in ({"exclude_file": str(path)}, {"min_workers": 2}):
        with pytest.raises(ValueError, match="only used with action='exclude'"):
            StragglerPolicy(monitor, **kwargs)
    with pytest.raises(ValueError, match="min_workers=0"):
        StragglerPolicy(monitor, action="exclude", exclude_file=str(path), min_workers=0)
    # A malformed file fails when the policy is made, naming file, line and fix.
    path.write_text("node-a\nnode-b:2\n")
    with pytest.raises(ValueError, match=r"excluded line 2: 'node-b:2' is not a host name"):
        StragglerPolicy(monitor, action="exclude", exclude_file=str(path))
    path.write_text("# left out\nnode-a\n")
    monkeypatch.setenv("KERAS_ADAPT_EXCLUDE_FILE", str(path))
    policy = StragglerPolicy(monitor, action="exclude")   # the file from the environment
    assert (policy.exclusion.exclude_file, policy.min_workers) == (str(path), 1)
    assert policy.exclusion.excluded == []   # this job excluded nothing yet
    # One process: nothing is ever flagged, and no elastic job is needed.
    model = _model()
    x = np.random.rand(16 * 12, 3).astype("float32")
    model.fit(x, x[:, :1], batch_size=16, verbose=0,
              callbacks=[monitor, StragglerPolicy(monitor, warmup_s=0.0, patience=1,
                                                  action="exclude")])
    assert monitor.measurements == 2 and path.read_text() == "# left out\nnode-a\n"


def test_a_worker_knows_its_host_only_in_an_elastic_job(monkeypatch):
    from keras_adapt.actuators import HostExclusion

    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    monkeypatch.setenv("HOROVOD_HOSTNAME", "node-a")
    with pytest.raises(ValueError, match="needs a Horovod Elastic job") as info:
        HostExclusion.this_host()
    assert "HOROVOD_ELASTIC=None" in str(info.value) and "--host-discovery-script" in str(info.value)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    assert HostExclusion.this_host() == "node-a"
    monkeypatch.delenv("HOROVOD_HOSTNAME")
    with pytest.raises(ValueError, match="HOROVOD_HOSTNAME=None"):
        HostExclusion.this_host()


def test_exclusion_rule_counts_the_workers_of_each_host():
    from keras_adapt.policies.straggler import exclusion_decision

    hosts = ["a", "b", "b", "c"]   # by rank: host b runs ranks 1 and 2
    assert exclusion_decision(hosts, 0, [], 1) == (True, 3, "3 of 4 workers left")
    # excluding b stops both its workers
    assert exclusion_decision(hosts, 2, [], 2) == (True, 2, "2 of 4 workers left")
    assert exclusion_decision(hosts, 2, [], 3) == (
        False, 2, "that would leave 2 of 4 workers, fewer than min_workers=3")
    # a host already leaving counts as gone, and is not excluded twice
    assert exclusion_decision(hosts, 3, ["b"], 1) == (True, 1, "1 of 4 workers left")
    assert exclusion_decision(hosts, 1, ["b"], 1) == (False, None, "it was already excluded")
    # never the last host, whatever min_workers allows
    assert exclusion_decision(hosts, 3, ["a", "b"], 1)[:2] == (False, 0)
    assert exclusion_decision(["a", "a"], 0, [], 1)[:2] == (False, 0)
