"""AdaptTensorBoard in real ``model.fit`` runs, read back through TensorBoard's own reader."""

import json
import os

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.callbacks import AdaptTensorBoard, GradientStatsMonitor
from keras_adapt.record import events, metadata, reader

import tensorboard_loaders
from conftest import horovodrun, load_rank_results

T = metadata.SCALAR_TAGS


def read_run(log_dir, loader="python"):
    """(series, events) of the run in ``log_dir`` as the tab reads them with ``loader``."""
    parent, name = os.path.split(os.path.normpath(str(log_dir)))
    provider, stop = tensorboard_loaders.provider(loader, parent, expect_runs=[name])
    try:
        series = reader.read_series(provider, None, "", name)
        evs, skipped, newer = reader.read_events(provider, None, "", name)
    finally:
        stop()
    assert (skipped, newer) == (0, 0)
    return series, evs


def fields(event):
    return {k: event[k] for k in metadata.EVENT_FIELDS}


def values(series, tag):
    return {s: v for s, _, v in series[tag]}


def small_data(n=320, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, dim)).astype("float32")
    return x, (x @ np.arange(1, dim + 1, dtype="float32")).reshape(-1, 1)


class EmitEvents(keras.callbacks.Callback):
    """Emits ``kinds`` (several events at one step) at each epoch end, like a policy."""

    def __init__(self, log_dir, kinds, emitted):
        super().__init__()
        self.log_dir, self.kinds, self.emitted = log_dir, kinds, emitted

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        for kind in self.kinds:
            self.emitted.append(events.emit(
                kind, step=step, epoch=epoch, policy="TestPolicy",
                reason=f"<b>epoch {epoch}</b>", before={"n": epoch}, after={"n": epoch + 0.1},
                log_dir=self.log_dir))


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
@pytest.mark.parametrize("order", ["monitor_first", "adapt_first"])
def test_writes_series_step_times_and_events(tmp_path, order):
    log_dir = str(tmp_path / "run")
    x, y = small_data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    # every update measured: the series are compared with the statistics at each write
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01), stats_interval=1),
                  "mse")
    adapt, monitor = AdaptTensorBoard(log_dir, update_freq=4), GradientStatsMonitor(4)
    emitted = []
    # Events at one step from a callback before AdaptTensorBoard (written at
    # its epoch-end write) and from one after it (arriving after that step
    # was written).
    before = EmitEvents(log_dir, ("batch_size", "lr"), emitted)
    after = EmitEvents(log_dir, ("lr",), emitted)
    callbacks = [monitor, adapt] if order == "monitor_first" else [adapt, monitor]
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False,
                        callbacks=[before] + callbacks + [after])
    series, evs = read_run(log_dir)

    # every series but those of WorkerTimingMonitor, a batch-size policy,
    # the compression switch and PairAveraging (none in this run)
    assert set(series) == (set(T.values()) - {T["step_time"], T["comm_fraction"], T["samples"],
                                              T["progress"], T["compression"], T["staleness"]}
                           | {metadata.step_time_tag(0)})
    # Every update_freq steps and at each epoch end (10 steps per epoch).
    assert sorted(values(series, T["gns"])) == [4, 8, 10, 12, 16, 20]
    gns = values(series, T["gns"])
    assert gns[10] == pytest.approx(history.history["gns"][0], rel=1e-6)
    assert gns[20] == pytest.approx(history.history["gns"][1], rel=1e-6)
    assert values(series, T["grad_snr"])[20] == pytest.approx(history.history["grad_snr"][1], rel=1e-6)
    assert list(values(series, T["lr"]).values()) == pytest.approx([0.01] * 6)
    assert set(values(series, T["workers"]).values()) == {1.0}
    assert set(values(series, T["batch_size"]).values()) == {32.0}
    # A keras-adapt optimizer without declared strategies: AllReduceSGD at
    # the first step and at every write.
    assert values(series, T["sync_strategy"]) == {s: 0.0 for s in [0, 4, 8, 10, 12, 16, 20]}
    # Throughput is the global batch over the same measured step times.
    step_time = values(series, metadata.step_time_tag(0))
    for step, throughput in values(series, T["throughput"]).items():
        assert throughput > 0 and step_time[step] > 0
        assert throughput * step_time[step] == pytest.approx(32.0, rel=1e-5)

    assert [fields(e) for e in evs] == emitted
    assert [(e["step"], e["kind"]) for e in evs] == [
        (10, "batch_size"), (10, "lr"), (10, "lr"), (20, "batch_size"), (20, "lr"), (20, "lr")]
    # The JSONL file written by emit() on rank 0 holds the same records, and
    # TensorBoard's default loader (its data server) shows every one of them.
    assert events.read_events(log_dir) == emitted
    _, served = read_run(log_dir, "data_server")
    assert [fields(e) for e in served] == emitted


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_resumed_run_shows_the_whole_event_log(tmp_path):
    """A new writer on the same log_dir (a resumed job) keeps what the tab showed, and adds to it."""
    log_dir = str(tmp_path / "run")
    x, y = small_data()
    emitted = []

    def model():
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
        return m

    first = model()
    first.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        GradientStatsMonitor(4), AdaptTensorBoard(log_dir, update_freq=4),
        EmitEvents(log_dir, ("batch_size", "lr"), emitted)])
    # "Crash" after step 20; the resumed job restarts from a checkpoint of
    # step 10 with a new callback and re-decides at step 20; its policy
    # records a resume event at its first step.
    second = model()
    second.fit(x, y, batch_size=32, epochs=1, verbose=0)  # the restored 10 steps
    emitted.append(events.emit("resume", step=10, epoch=1, policy="TestPolicy",
                               reason="state restored", before={}, after={"last_adapt": 10},
                               log_dir=log_dir))
    second.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[
        GradientStatsMonitor(4), AdaptTensorBoard(log_dir, update_freq=4),
        EmitEvents(log_dir, ("batch_size",), emitted)])
    jsonl = events.read_events(log_dir)
    assert sorted(jsonl, key=lambda e: (e["step"], e["wall_time"])) == sorted(
        emitted, key=lambda e: (e["step"], e["wall_time"]))
    assert len(jsonl) == 6
    for loader in tensorboard_loaders.LOADERS:
        _, evs = read_run(log_dir, loader)
        assert [fields(e) for e in evs] == sorted(jsonl, key=lambda e: (e["step"], e["wall_time"])), loader


def test_lr_schedule_and_given_batch_size_without_statistics(tmp_path):
    log_dir = str(tmp_path / "run")
    x, y = small_data(n=160)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=5, decay_rate=0.5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(schedule), "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[AdaptTensorBoard(log_dir, update_freq=5, batch_size=16, step_times=False)])
    series, evs = read_run(log_dir)
    assert T["gns"] not in series and not evs
    assert T["sync_strategy"] not in series  # not a keras-adapt optimizer: no strategy
    assert not any(t.startswith(metadata.STEP_TIME_TAG_PREFIX) for t in series)
    assert set(values(series, T["batch_size"]).values()) == {16.0}
    lr = values(series, T["lr"])
    assert sorted(lr) == [5, 10]
    for step, value in lr.items():
        # The schedule at the step being written (tf.keras 2 keeps the rate of
        # the last applied step, one step earlier).
        candidates = [float(schedule(step)), float(schedule(step - 1))]
        assert any(value == pytest.approx(c, rel=1e-5) for c in candidates), (step, value, candidates)


class SwitchStrategy(keras.callbacks.Callback):
    """Switches the synchronisation strategy by hand (no event) before given updates."""

    def __init__(self, switches):
        super().__init__()
        self.switches = switches

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step in self.switches:
            name, params = self.switches[step]
            self.model.optimizer.adapt_state.sync.set(name, **params)


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_sync_strategy_series_follows_switches_between_steps(tmp_path):
    """adapt/sync_strategy: the strategy in use at the first step, at each switch and at each write."""
    from keras_adapt.sync import AllReduceSGD, LocalSGD, ModelAveraging

    log_dir = str(tmp_path / "run")
    x, y = small_data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.01), sync_strategy=[
            AllReduceSGD(), LocalSGD(period=2), ModelAveraging(alpha=0.5)]), "mse")
    # Before the update that takes the step count from s to s + 1; the one
    # at 10 comes right after the epoch-end write at step 10.
    switches = {5: ("local_sgd", {"period": 2}), 10: ("model_averaging", {}),
                14: ("allreduce_sgd", {}), 18: ("local_sgd", {"period": 4})}
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False, callbacks=[
        SwitchStrategy(switches), AdaptTensorBoard(log_dir, update_freq=4, batch_size=32,
                                                   step_times=False)])
    assert model.optimizer.adapt_state.sync.strategy.name == "local_sgd"
    # Independently: the strategy set by the last switch at or before each
    # point's step (the switching callback runs before AdaptTensorBoard at a
    # batch start), at the first step, every write (every 4 steps and at each
    # epoch end, 10 steps) and every switch.
    expected = {}
    for step in sorted({0, 4, 8, 10, 12, 16, 20} | set(switches)):
        name = "allreduce_sgd"
        for s in sorted(switches):
            if s <= step:
                name = switches[s][0]
        expected[step] = float(metadata.SYNC_STRATEGIES.index(name))
    assert expected == {0: 0.0, 4: 0.0, 5: 2.0, 8: 2.0, 10: 1.0, 12: 1.0, 14: 0.0, 16: 0.0,
                        18: 2.0, 20: 2.0}
    for loader in tensorboard_loaders.LOADERS:
        series, _ = read_run(log_dir, loader)
        points = [(s, v) for s, _, v in series[T["sync_strategy"]]]
        # In step order; the last value at a step is the one that holds.
        assert [s for s, _ in points] == sorted(s for s, _ in points), loader
        assert dict(points) == expected, loader


def test_unknown_batch_size_warns_and_skips_those_series(tmp_path):
    log_dir = str(tmp_path / "run")
    x, y = small_data(n=64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.warns(RuntimeWarning, match="batch_size=<per-worker batch size>"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[AdaptTensorBoard(log_dir, update_freq=2)])
    series, _ = read_run(log_dir)
    assert T["batch_size"] not in series and T["throughput"] not in series
    assert {T["lr"], T["workers"]} <= set(series)


@pytest.mark.parametrize("kwargs,match", [
    ({"log_dir": ""}, "log_dir=''"),
    ({"log_dir": None}, "log_dir=None"),
    ({"log_dir": "r", "update_freq": 0}, "update_freq=0"),
    ({"log_dir": "r", "update_freq": 2.5}, "update_freq=2.5"),
    ({"log_dir": "r", "update_freq": True}, "update_freq=True"),
    ({"log_dir": "r", "batch_size": -4}, "batch_size=-4"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptTensorBoard(**kwargs)
    with pytest.raises(TypeError, match="step_times"):
        AdaptTensorBoard("r", step_times="yes")


def test_two_workers_shared_series_from_rank0_step_times_from_both(tmp_path):
    log_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    horovodrun("adapt_tensorboard_worker.py", ["--out", out, "--log_dir", log_dir], np=2)
    results = load_rank_results(str(out), 2)
    assert [r["size"] for r in results] == [2, 2]

    files = [f for f in os.listdir(log_dir) if "tfevents" in f]
    assert len(files) == 1, f"only rank 0 may write event files, found {files}"
    series, evs = read_run(str(log_dir))
    steps = results[0]["steps"]  # 24 batches of 16 per rank and epoch, 2 epochs
    assert steps == 48
    expected_steps = [6, 12, 18, 24, 30, 36, 42, 48]
    for rank in (0, 1):
        st = values(series, metadata.step_time_tag(rank))
        assert sorted(st) == expected_steps and all(v > 0 for v in st.values())
    assert metadata.step_time_tag(2) not in series
    assert set(values(series, T["workers"]).values()) == {2.0}
    assert set(values(series, T["batch_size"]).values()) == {32.0}  # 2 x 16
    gns = values(series, T["gns"])
    assert gns[24] == pytest.approx(results[0]["gns"][0], rel=1e-6)
    assert results[0]["gns"] == results[1]["gns"]
    # SystemMonitor: one host, sampled by its local rank 0 and gathered, so
    # both ranks log the same values; rank 0's file holds them as series.
    system = results[0]["system"]
    assert system == results[1]["system"]
    host0 = {metadata.system_key(0, m) for m in ("cpu_percent", "memory_percent",
                                                 "net_in_mb_s", "net_out_mb_s")}
    assert set(system) == host0  # no second host, no GPU
    assert all(0.0 <= v <= 100.0 for k in host0 if "percent" in k for v in system[k])
    for key in host0:
        written = values(series, metadata.TAG_PREFIX + key)
        assert sorted(written) == expected_steps, key
        # what AdaptTensorBoard wrote at the epoch's last step is that epoch's logged value
        assert written[24] == pytest.approx(system[key][0], rel=1e-6)
    # Both ranks switched strategy at the same steps; rank 0's series shows
    # the strategy in use at the first step, at each switch and each write.
    switches = {int(k): v for k, v in results[0]["switches"].items()}
    assert switches == {10: "local_sgd", 31: "allreduce_sgd"}
    expected = {}
    for step in [0] + expected_steps + sorted(switches):
        earlier = [s for s in switches if s <= step]
        expected[step] = float(metadata.SYNC_STRATEGIES.index(
            switches[max(earlier)] if earlier else "allreduce_sgd"))
    assert values(series, T["sync_strategy"]) == expected
    assert {s for s, v in expected.items() if v == 2.0} == {10, 12, 18, 24, 30}
    # Each rank emitted the same events (two at each epoch end); they are
    # recorded once, all of them, with both of TensorBoard's loaders.
    assert [(e["kind"], e["step"], e["rank"]) for e in evs] == [
        ("batch_size", 24, 0), ("lr", 24, 0), ("batch_size", 48, 0), ("lr", 48, 0)]
    _, served = read_run(str(log_dir), "data_server")
    assert served == evs
    with open(log_dir / metadata.EVENTS_FILENAME) as f:
        assert [fields(json.loads(line)) for line in f] == [fields(e) for e in evs]


class SwitchAtUpdate(keras.callbacks.Callback):
    """Switches the strategy by hand at the first batch start at or after
    given optimizer steps; notes the step each switch took effect."""

    def __init__(self, switches):
        super().__init__()
        self.switches = dict(switches)
        self.at_update = {}

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        due = [s for s in self.switches if s <= step]
        if due:
            name = self.switches.pop(min(due))
            self.model.optimizer.adapt_state.sync.set(name)
            self.at_update[step] = name


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_sync_strategy_series_dates_switches_by_step_with_several_steps_per_call(tmp_path):
    """steps_per_execution=3: the callbacks run once per 3 steps, and a
    switch is dated at the optimizer step it takes effect, not by counting
    batch calls."""
    from keras_adapt.sync import AllReduceSGD, LocalSGD

    log_dir = str(tmp_path / "run")
    x, y = small_data(n=960)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.01), sync_strategy=[AllReduceSGD(), LocalSGD(period=2)]),
        "mse", steps_per_execution=3)
    switch = SwitchAtUpdate({7: "local_sgd", 16: "allreduce_sgd"})
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=[
        switch, AdaptTensorBoard(log_dir, update_freq=2, batch_size=32, step_times=False)])
    assert switch.at_update == {9: "local_sgd", 18: "allreduce_sgd"}  # calls at 0, 3, 6, ...

    def truth(step):
        name = "allreduce_sgd"
        for at in sorted(switch.at_update):
            if at <= step:
                name = switch.at_update[at]
        return float(metadata.SYNC_STRATEGIES.index(name))

    series, _ = read_run(log_dir)
    points = dict((s, v) for s, _, v in series[T["sync_strategy"]])
    assert {9, 18} <= set(points)
    assert points == {s: truth(s) for s in points}


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
def test_batch_size_and_throughput_count_samples_per_update_under_accumulation(tmp_path):
    """Two micro-steps of 16 per update: the global batch is 32 per update,
    and a timed step (a micro-step) processes 16 samples, so throughput x
    the mean step time is 16."""
    log_dir = str(tmp_path / "run")
    x, y = small_data(n=640)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.01), gradient_stats=False, backward_passes_per_step=2), "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[AdaptTensorBoard(log_dir, update_freq=8, batch_size=16)])
    series, _ = read_run(log_dir)
    assert set(values(series, T["batch_size"]).values()) == {32.0}
    throughput = values(series, T["throughput"])
    step = values(series, metadata.step_time_tag(0))
    assert sorted(throughput) == sorted(step) and len(step) >= 4
    for s in step:
        assert throughput[s] * step[s] == pytest.approx(16.0, rel=1e-5)
