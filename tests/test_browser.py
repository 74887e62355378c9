"""End to end: a real TensorBoard over real training runs, the Adapt tab in headless Chromium.

The run records several events per step (as the policies do: a batch-size
change and its lr change), from callbacks before and after
AdaptTensorBoard, and one before training starts; what the tab shows (table
rows, markers) and what the events route answers -- with TensorBoard's
default loader (its Rust data server) and with ``--load_fast=false`` --
are compared with the run's ``adapt_events.jsonl``. A second run switches
the synchronisation strategy (with ``sync_strategy`` events, and once by
hand without one): the "Sync strategy" chart's drawn steps are compared
with the ``adapt/sync_strategy`` series in its event files.

Needs Debian's ``chromium`` (``make setup`` installs it when run as root)
and the ``playwright`` package (requirements/primary-common.txt), driven with the
system browser; never ``playwright install``. Skips with the reason when
either is missing. Saves screenshots to ``test-artifacts/``.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

pytestmark = [pytest.mark.primary_only, pytest.mark.timeout(400)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.path.join(os.path.dirname(HERE), "test-artifacts")
HOSTILE = "<img src=x onerror=alert(1)>"
EPOCHS = 3
LR_AFTER = float(np.float32(0.02))  # 0.019999999552965164, as a policy computes it
TIMEOUT_MS = 60_000


def _requirements():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; it drives the "
                    "system chromium, no browser download)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (make setup does it as root)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(log_dir):
    """A short real training run with AdaptTensorBoard and several events per step."""
    import keras
    import keras_adapt
    from keras_adapt.record import events
    from keras_adapt.callbacks import (AdaptTensorBoard, GradientStatsMonitor, SystemMonitor,
                                       WorkerTimingMonitor)
    from keras_adapt.policies import GNSBatchSizePolicy

    def emit(model, kind, epoch, before, after):
        events.emit(kind, step=int(model.optimizer.iterations.numpy()), epoch=epoch,
                    policy="BrowserTestPolicy", reason=f"{kind} at epoch {epoch}",
                    before=before, after=after, log_dir=log_dir)

    class Decide(keras.callbacks.Callback):
        """Before AdaptTensorBoard: a resume event before training, then a batch-size
        change and its lr change at each epoch end (two events, one step)."""

        def on_train_begin(self, logs=None):
            emit(self.model, "resume", 0, {}, {"last_adapt": 0})

        def on_epoch_end(self, epoch, logs=None):
            emit(self.model, "batch_size", epoch, {"batch_size": 16 * 2 ** epoch},
                 {"batch_size": 16 * 2 ** (epoch + 1)})
            emit(self.model, "lr", epoch, {"lr": 0.01}, {"lr": LR_AFTER})

    class Late(keras.callbacks.Callback):
        """After AdaptTensorBoard: one more event at the step it has just written."""

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                emit(self.model, "lr", epoch, {"lr": LR_AFTER}, {"lr": 0.0125})

    rng = np.random.default_rng(0)
    x = rng.random((480, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    # A batch-size policy that holds the batch (no events of its own) and
    # counts progress against a base batch of 4: its samples and progress
    # part, and the tab draws both.
    counts = GNSBatchSizePolicy(min_batch=16, max_batch=16, base_batch=4, micro_batch_size=16,
                                scaling_rule=None, interval=3)
    model.fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0, callbacks=[
        Decide(), GradientStatsMonitor(interval=3), SystemMonitor(interval=3),
        WorkerTimingMonitor(interval=3), counts, AdaptTensorBoard(log_dir, update_freq=3),
        Late()])


# Before the update that takes the step count from s to s + 1: (strategy,
# parameters, the event's reason or None for a switch by hand, without event).
SYNC_SWITCHES = {3: ("local_sgd", {"period": 4}, "communication share 0.41 > 0.3"),
                 8: ("model_averaging", {"alpha": 0.5}, "noise scale 310 > 2 x 128"),
                 15: ("allreduce_sgd", {}, None),
                 19: ("local_sgd", {"period": 2}, "lr decayed 0.1 -> 0.01: post-local SGD")}


def _train_sync(log_dir):
    """A real run (168 samples, batches of 16: a remainder batch) that switches strategies."""
    import keras
    import keras_adapt
    from keras_adapt.record import events
    from keras_adapt.callbacks import AdaptTensorBoard
    from keras_adapt.sync import AllReduceSGD, LocalSGD, ModelAveraging

    class Switch(keras.callbacks.Callback):
        """Switches like a SyncStrategyPolicy (before AdaptTensorBoard), recording its events."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step not in SYNC_SWITCHES:
                return
            name, params, reason = SYNC_SWITCHES[step]
            sync = self.model.optimizer.adapt_state.sync
            before = {"sync_strategy": sync.strategy.name, **sync.strategy.params()}
            sync.set(name, **params)
            if reason is not None:
                events.emit("sync_strategy", step=step, epoch=self.epoch, policy="BrowserTestPolicy",
                            reason=reason, before=before,
                            after={"sync_strategy": sync.strategy.name, **sync.strategy.params()},
                            log_dir=log_dir)

    rng = np.random.default_rng(1)
    x = rng.random((168, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01), sync_strategy=[
        AllReduceSGD(), LocalSGD(period=4), ModelAveraging(alpha=0.5)]), "mse")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
        Switch(), AdaptTensorBoard(log_dir, update_freq=2, batch_size=16)])


#: The compression-switching run: {step: mode} set before that step, each
#: with a communication event.
COMPRESSION_SWITCHES = {5: "fp16", 13: "none"}


def _train_compression(log_dir):
    """A real run that switches the gradients' compression, recording its events."""
    import keras
    import keras_adapt
    from keras_adapt.actuators import GradientCompression
    from keras_adapt.callbacks import AdaptTensorBoard
    from keras_adapt.record import events

    class Switch(keras.callbacks.Callback):
        """Switches like a CommunicationPolicy (before AdaptTensorBoard), recording its events."""

        def on_train_batch_begin(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step in COMPRESSION_SWITCHES:
                before = self.compression.mode
                self.compression.set(COMPRESSION_SWITCHES[step])
                events.emit("communication", step=step, epoch=0, policy="BrowserTestPolicy",
                            reason=f"to {self.compression.mode}", before={"compression": before},
                            after={"compression": self.compression.mode}, log_dir=log_dir)

    rng = np.random.default_rng(4)
    x = rng.random((160, 8)).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    switch = Switch()
    switch.compression = GradientCompression(model)
    model.fit(x, x.sum(axis=1, keepdims=True), batch_size=8, epochs=1, verbose=0, callbacks=[
        switch, AdaptTensorBoard(log_dir, update_freq=2, batch_size=8)])


#: The "kinds" run: (step, kind) of its events, one of every declared kind
#: (two at one step) and one of a kind from a newer writer.
KIND_EVENTS = [(2, "resize"), (4, "straggler"), (4, "checkpoint"), (6, "preemption"),
               (8, "resume"), (10, "sync_strategy"), (12, "batch_size"), (14, "lr"),
               (16, "communication"), (18, "teleport")]


def _train_kinds(log_dir):
    """A real short run with AdaptTensorBoard and an event of every kind."""
    import keras
    import keras_adapt
    import tensorflow as tf
    from keras_adapt.record import events
    from keras_adapt.callbacks import AdaptTensorBoard
    from keras_adapt.record import metadata, summary

    class Emit(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            for at, kind in KIND_EVENTS:
                if at == step and kind in metadata.EVENT_KINDS:
                    events.emit(kind, step=step, epoch=0, policy="BrowserTestPolicy",
                                reason=f"a {kind} event", before={}, after={"n": step},
                                log_dir=log_dir)

    x = np.random.default_rng(2).random((160, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
              callbacks=[Emit(), AdaptTensorBoard(log_dir, update_freq=4)])
    (step, kind), = [e for e in KIND_EVENTS if e[1] not in metadata.EVENT_KINDS]
    newer = dict(metadata.make_event("resume", step, 0, "Future", "a kind from a newer writer",
                                     {}, {}), kind=kind)
    with tf.summary.create_file_writer(log_dir).as_default():
        summary.events([newer])


def _write_hostile_run(log_dir):
    import tensorflow as tf
    from keras_adapt.record import metadata, summary

    with tf.summary.create_file_writer(log_dir).as_default():
        for s in range(5):
            summary.scalar("gns", 10.0 + s, step=s)
        summary.events([metadata.make_event("resume", 2, 0, HOSTILE, HOSTILE, {}, {"x": HOSTILE})])


def _wait_for_tab(base, proc, timeout=90):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"tensorboard exited with {proc.returncode}:\n{out[-4000:]}")
        try:
            with urllib.request.urlopen(base + "/data/plugins_listing", timeout=5) as r:
                listing = json.loads(r.read())
            last = listing.get("adapt")
            if last and last.get("enabled"):
                with urllib.request.urlopen(base + "/data/plugin/adapt/runs", timeout=5) as r:
                    runs = json.loads(r.read())["runs"]
                if {r["run"] for r in runs} >= {"train", "sync", HOSTILE}:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the Adapt tab did not become enabled within {timeout}s (last: {last})")


def _start_tensorboard(logdir, *flags):
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "tensorboard.main"]
    cmd += [f"--logdir={logdir}", f"--port={port}", "--host=127.0.0.1", *flags]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_tab(base, proc)
    except BaseException:
        _stop(proc)
        raise
    return base, proc


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


@pytest.fixture()
def run_logdir(tmp_path):
    _requirements()
    logdir = tmp_path / "logs"
    _train(str(logdir / "train"))
    _train_sync(str(logdir / "sync"))
    _train_kinds(str(logdir / "kinds"))
    _train_compression(str(logdir / "comm"))
    _write_hostile_run(str(logdir / HOSTILE))
    return logdir


@pytest.fixture()
def tensorboard_url(run_logdir):
    """Plain ``tensorboard --logdir``: its default loader (the Rust data server)."""
    base, proc = _start_tensorboard(run_logdir)
    try:
        yield base
    finally:
        _stop(proc)


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _jsonl(logdir, run="train"):
    from keras_adapt.record import events

    return sorted(events.read_events(str(logdir / run)), key=lambda e: (e["step"], e["wall_time"]))


def _tfevents_scalars(run_dir, prefix="adapt/system/"):
    """Every scalar point under ``prefix`` in a run's event files, read with TensorFlow:
    {tag: [(step, value)]}."""
    import glob

    import tensorflow as tf

    out = {}
    for path in sorted(glob.glob(os.path.join(str(run_dir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.tag.startswith(prefix):
                    value = float(tf.make_ndarray(v.tensor))
                    out.setdefault(v.tag, []).append((event.step, value))
    return out


def _fields(event):
    from keras_adapt.record import metadata

    return {k: event[k] for k in metadata.EVENT_FIELDS}


def test_events_route_equals_the_jsonl_with_both_loaders(run_logdir, tensorboard_url):
    expected = _jsonl(run_logdir)
    steps = [e["step"] for e in expected]
    assert len(expected) == 1 + 2 * EPOCHS + 1 and len(set(steps)) < len(steps)
    served = _get(tensorboard_url + "/data/plugin/adapt/events?run=train")
    assert [_fields(e) for e in served["events"]] == expected
    assert served["skipped"] == 0 and served["newer"] == 0
    base, proc = _start_tensorboard(run_logdir, "--load_fast=false")
    try:
        python_loaded = _get(base + "/data/plugin/adapt/events?run=train")
    finally:
        _stop(proc)
    assert python_loaded["events"] == served["events"]
    # TensorBoard's own Scalars tab lists the adapt/* series.
    tags = _get(tensorboard_url + "/data/plugin/scalars/tags")["train"]
    assert {"adapt/gns", "adapt/batch_size", "adapt/lr", "adapt/workers"} <= set(tags)
    # SystemMonitor's host metrics: the route serves what the event files hold.
    written = _tfevents_scalars(run_logdir / "train")
    for metric in ("cpu_percent", "memory_percent", "net_in_mb_s", "net_out_mb_s"):
        tag = f"adapt/system/host_0/{metric}"
        assert tag in tags and len(written[tag]) >= EPOCHS, (tag, written.get(tag))
        got = _get(tensorboard_url + f"/data/plugin/adapt/scalars?run=train&tag={tag}")["series"][tag]
        assert [(p[0], round(p[2], 4)) for p in got] == [(s, round(v, 4)) for s, v in written[tag]]
    assert not any("gpu" in t for t in written)  # no GPU here: no GPU series
    # WorkerTimingMonitor's series (one worker: it waits for nobody).
    written = _tfevents_scalars(run_logdir / "train", ("adapt/compute_time/", "adapt/wait_time/",
                                                       "adapt/comm_fraction"))
    for tag in ("adapt/compute_time/rank_0", "adapt/wait_time/rank_0", "adapt/comm_fraction"):
        assert tag in tags and len(written[tag]) >= EPOCHS, (tag, written.get(tag))
        got = _get(tensorboard_url + f"/data/plugin/adapt/scalars?run=train&tag={tag}")["series"][tag]
        assert [p[0] for p in got] == [s for s, _ in written[tag]]
        assert [p[2] for p in got] == pytest.approx([v for _, v in written[tag]], rel=1e-6)
    assert all(v > 0 for _, v in written["adapt/compute_time/rank_0"])
    assert all(v == 0.0 for _, v in written["adapt/wait_time/rank_0"])
    # The strategy-switching run: its events, and its series as written.
    sync_events = _jsonl(run_logdir, "sync")
    assert [(e["step"], e["kind"]) for e in sync_events] == [
        (s, "sync_strategy") for s, (_, _, reason) in sorted(SYNC_SWITCHES.items()) if reason]
    assert [_fields(e) for e in _get(tensorboard_url + "/data/plugin/adapt/events?run=sync")[
        "events"]] == sync_events
    tag = "adapt/sync_strategy"
    got = _get(tensorboard_url + f"/data/plugin/adapt/scalars?run=sync&tag={tag}")["series"][tag]
    # (a value rewritten at a step replaces the earlier one there, TensorBoard's rule)
    assert [(p[0], p[2]) for p in got] == sorted(dict(_tfevents_scalars(run_logdir / "sync", tag)[tag]).items())


def _rgb(hex_colour):
    """``#1f77b4`` as the browser computes it: ``rgb(31, 119, 180)``."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _adapt_frame(page, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for frame in page.frames:
            if "plugin_entry.html" in frame.url and "name=adapt" in frame.url:
                return frame
        page.wait_for_timeout(250)
    pytest.fail(f"no Adapt iframe; frames: {[f.url for f in page.frames]}")


def _drawn_line(chart, name):
    """The points of series ``name`` of a line chart, read back from its
    SVG path (``M x,y`` then ``L x,y``) through the axes' tick labels:
    [(step, value)]."""
    import re

    d = chart.locator(f'path.adapt-series[data-series="{name}"]').get_attribute("d")
    vertices = [(float(x), float(y)) for x, y in re.findall(r"[ML]([-0-9.]+),([-0-9.]+)", d)]
    assert d.count("L") == len(vertices) - 1, d
    x_ticks = chart.locator('text.axis[text-anchor="middle"]')
    y_ticks = chart.locator('text.axis[text-anchor="end"]')
    fx = np.polyfit([float(x_ticks.nth(i).get_attribute("x")) for i in range(x_ticks.count())],
                    [float(x_ticks.nth(i).text_content()) for i in range(x_ticks.count())], 1)
    # A label's baseline sits 3 px below its row (drawChart).
    fy = np.polyfit([float(y_ticks.nth(i).get_attribute("y")) - 3 for i in range(y_ticks.count())],
                    [float(y_ticks.nth(i).text_content()) for i in range(y_ticks.count())], 1)
    return [(float(np.polyval(fx, px)), float(np.polyval(fy, py))) for px, py in vertices]


def _drawn_step_line(chart):
    """What a step-line chart drew, read back from its SVG: [(step, y label)].

    The path's vertices (``M x,y`` then ``H x V y`` per point) are mapped to
    steps through the x axis' tick labels and to names through the y axis'.
    """
    import re

    d = chart.locator("path.adapt-series").get_attribute("d")
    tokens = re.findall(r"([MHV])([-0-9.]+)(?:,([-0-9.]+))?", d)
    assert tokens and tokens[0][0] == "M", d
    x, y = float(tokens[0][1]), float(tokens[0][2])
    vertices = [(x, y)]
    for op, a, _ in tokens[1:]:
        if op == "H":
            x = float(a)
        else:
            assert op == "V", d
            y = float(a)
            vertices.append((x, y))
    x_ticks = chart.locator('text.axis[text-anchor="middle"]')
    xs = [(float(x_ticks.nth(i).get_attribute("x")), float(x_ticks.nth(i).text_content()))
          for i in range(x_ticks.count())]
    slope, offset = np.polyfit([px for px, _ in xs], [v for _, v in xs], 1)
    y_ticks = chart.locator('text.axis[text-anchor="end"]')
    # A label's baseline sits 3 px below its row (drawChart).
    rows = [(float(y_ticks.nth(i).get_attribute("y")) - 3, y_ticks.nth(i).text_content())
            for i in range(y_ticks.count())]
    drawn = []
    for px, py in vertices:
        step = slope * px + offset
        assert abs(step - round(step)) < 0.05, (px, step)
        dy, label = min((abs(py - ry), label) for ry, label in rows)
        assert dy < 0.5, (py, rows)
        drawn.append((int(round(step)), label))
    return drawn, [label for _, label in rows]


def _ranges(points):
    """[(first step, last step, name)] of consecutive points with the same name."""
    out = []
    for step, name in points:
        if out and out[-1][2] == name:
            out[-1] = (out[-1][0], step, name)
        else:
            out.append((step, step, name))
    return out


def _readable(values):
    """What the table shows for a sync_strategy event's before/after."""
    params = [f"{k}: {v if isinstance(v, int) else f'{v:.4g}'}"
              for k, v in values.items() if k != "sync_strategy"]
    return values["sync_strategy"] + (f" ({', '.join(params)})" if params else "")


def _compact(value):
    """What the page's compact() (JSON.stringify) gives for a before/after dict."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_adapt_tab_renders_charts_markers_and_events(run_logdir, tensorboard_url):
    from playwright.sync_api import sync_playwright

    os.makedirs(ARTIFACTS, exist_ok=True)
    expected = _jsonl(run_logdir)
    n = len(expected)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=TIMEOUT_MS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.set_default_timeout(TIMEOUT_MS)
            dialogs, outside = [], []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(
                (tensorboard_url, "data:", "blob:", "about:")) else None)

            page.goto(tensorboard_url + "/#adapt", wait_until="domcontentloaded")
            frame = _adapt_frame(page)
            frame.wait_for_selector("body[data-adapt-ready]")
            frame.select_option("#adapt-run", "train")
            frame.wait_for_selector('body[data-adapt-ready="train"]')

            # Charts: the noise-scale/batch chart has both series; every chart
            # has one marker per event of the JSONL, in its order.
            assert frame.locator('svg[data-chart="noise"] path.adapt-series').count() == 2
            for chart in ("noise", "lr", "workers", "throughput", "step_time"):
                assert frame.locator(f'svg[data-chart="{chart}"] path.adapt-series').count() >= 1, chart
                assert frame.locator(f'svg[data-chart="{chart}"] .adapt-marker').count() == n, chart
            # The System section: one chart per host metric the run recorded
            # (no GPU on this machine), one line per host.
            for metric in ("cpu_percent", "memory_percent", "net_in_mb_s", "net_out_mb_s"):
                chart = frame.locator(f'svg[data-chart="system_{metric}"]')
                assert chart.locator("path.adapt-series").count() == 1, metric
                assert chart.locator(".adapt-marker").count() == n, metric
            assert frame.locator('svg[data-chart^="system_gpu"]').count() == 0
            # Worker timing: compute and wait time per worker, communication fraction.
            for chart in ("compute_time", "wait_time", "comm_fraction"):
                card = frame.locator(f'svg[data-chart="{chart}"]')
                assert card.locator("path.adapt-series").count() == 1, chart
                assert card.locator(".adapt-marker").count() == n, chart
            markers = frame.locator('svg[data-chart="noise"] .adapt-marker')
            assert [(int(markers.nth(i).get_attribute("data-step")), markers.nth(i).get_attribute("data-kind"))
                    for i in range(n)] == [(e["step"], e["kind"]) for e in expected]

            # Training progress: the policy's samples and progress, each line
            # drawn at the steps and values of its series in the event files
            # (to the pixel: 0.5% of the chart's range).
            chart = frame.locator('svg[data-chart="progress"]')
            assert chart.locator(".adapt-marker").count() == n
            written = {tag: points for prefix in ("adapt/samples", "adapt/progress")
                       for tag, points in _tfevents_scalars(run_logdir / "train", prefix).items()}
            for name in ("samples", "progress"):
                drawn, series = _drawn_line(chart, name), written["adapt/" + name]
                assert len(drawn) == len(series) >= 30, name
                span = max(v for _, v in written["adapt/samples"])
                for (step, value), (want_step, want) in zip(drawn, series):
                    assert abs(step - want_step) < 0.5 and abs(value - want) < 0.005 * span, name
            samples, progress = written["adapt/samples"][-1][1], written["adapt/progress"][-1][1]
            assert samples == 16 * 30 * EPOCHS and 0 < progress < samples

            # Whole numbers of workers get whole-number ticks (one worker: 0, 1, 2).
            y_labels = frame.locator('svg[data-chart="workers"] text.axis[text-anchor="end"]')
            labels = [y_labels.nth(i).text_content() for i in range(y_labels.count())]
            assert "1" in labels and all(label.isdigit() for label in labels), labels

            # The table: one row per JSONL record, same fields; numbers rounded
            # for reading, the exact values in the cells' titles.
            rows = frame.locator("#adapt-events tbody tr")
            assert rows.count() == n
            for i, e in enumerate(expected):
                cells = rows.nth(i).locator("td")
                texts = [cells.nth(j).inner_text() for j in range(7)]
                assert texts[:5] == [str(e["step"]), str(e["epoch"]), e["kind"], e["policy"], e["reason"]]
                assert cells.nth(5).get_attribute("title") == _compact(e["before"])
                assert cells.nth(6).get_attribute("title") == _compact(e["after"])
                for cell, values in ((texts[5], e["before"]), (texts[6], e["after"])):
                    for key, value in values.items():
                        shown = str(value) if isinstance(value, int) else f"{value:.4g}"
                        assert f"{key}: {shown}" in cell, (cell, values)
            lr_cells = [rows.nth(i).locator("td").nth(6).inner_text()
                        for i, e in enumerate(expected) if e["kind"] == "lr"]
            assert "lr: 0.02" in lr_cells and not any("0.0199999" in c for c in lr_cells)
            assert "batch_size: 32" in rows.nth(1).locator("td").nth(6).inner_text()
            # A plain synchronous-SGD run records the series (all allreduce_sgd)
            # but gets no "Sync strategy" chart.
            tag = "adapt/sync_strategy"
            plain = _tfevents_scalars(run_logdir / "train", tag)[tag]
            assert plain and {v for _, v in plain} == {0.0}
            assert frame.locator('svg[data-chart="sync_strategy"]').count() == 0

            n_lr = sum(e["kind"] == "lr" for e in expected)
            frame.select_option("#adapt-kind-filter", "lr")
            assert rows.count() == n_lr and "lr at epoch 0" in rows.first.inner_text()
            frame.select_option("#adapt-kind-filter", "")
            assert rows.count() == n

            # Hover the markers of the step with three events: the tooltip lists them all.
            late_step = [e for e in expected if e["before"] == {"lr": LR_AFTER}][0]["step"]
            same = [e for e in expected if e["step"] == late_step]
            assert len(same) == 3
            frame.locator(f'svg[data-chart="lr"] .adapt-marker[data-step="{late_step}"] line').nth(1).hover(
                force=True)
            tip = frame.locator("#adapt-tooltip")
            tip.wait_for(state="visible")
            text = tip.inner_text()
            assert all(e["reason"] in text for e in same), text
            assert "after:  batch_size: 64" in text and "lr: 0.0125" in text

            page.screenshot(path=os.path.join(ARTIFACTS, "adapt_tab.png"), full_page=True)
            frame.locator("#adapt-events").screenshot(path=os.path.join(ARTIFACTS, "adapt_tab_events.png"))

            # The strategy-switching run: the chart draws the series as written
            # (which strategy over which steps), labelled with the names.
            frame.select_option("#adapt-run", "sync")
            frame.wait_for_selector('body[data-adapt-ready="sync"]')
            from keras_adapt.record import metadata

            written = [(s, metadata.SYNC_STRATEGIES[int(v)]) for s, v in sorted(
                dict(_tfevents_scalars(run_logdir / "sync", tag)[tag]).items())]
            chart = frame.locator('svg[data-chart="sync_strategy"]')
            drawn, labels = _drawn_step_line(chart)
            assert drawn == written
            # Each strategy from the step it was switched to (with or without
            # an event) to the last write before the next switch.
            assert _ranges(drawn) == [(0, 2, "allreduce_sgd"), (3, 6, "local_sgd"),
                                      (8, 14, "model_averaging"), (15, 18, "allreduce_sgd"),
                                      (19, 22, "local_sgd")]
            assert labels == ["allreduce_sgd", "model_averaging", "local_sgd"]  # by index
            sync_events = _jsonl(run_logdir, "sync")
            starts = {first: name for first, _, name in _ranges(drawn)}
            assert all(starts[e["step"]] == e["after"]["sync_strategy"] for e in sync_events)
            markers = chart.locator(".adapt-marker")
            assert [(int(markers.nth(i).get_attribute("data-step")), markers.nth(i).get_attribute(
                "data-kind")) for i in range(markers.count())] == [
                (e["step"], "sync_strategy") for e in sync_events]
            # Its events in the table: strategy and parameters, readable.
            assert rows.count() == len(sync_events) == 3
            for i, e in enumerate(sync_events):
                cells = rows.nth(i).locator("td")
                assert [cells.nth(j).inner_text() for j in range(5)] == [
                    str(e["step"]), str(e["epoch"]), "sync_strategy", e["policy"], e["reason"]]
                assert cells.nth(5).inner_text() == _readable(e["before"])
                assert cells.nth(6).inner_text() == _readable(e["after"])
                assert cells.nth(6).get_attribute("title") == _compact(e["after"])
            assert rows.nth(0).locator("td").nth(6).inner_text() == "local_sgd (period: 4, start_after: 0)"
            assert rows.nth(1).locator("td").nth(6).inner_text() == "model_averaging (alpha: 0.5)"
            page.screenshot(path=os.path.join(ARTIFACTS, "adapt_tab_sync_strategy.png"), full_page=True)

            # The compression-switching run: the chart draws adapt/compression
            # as written, labelled with the modes; its events are its markers
            # and rows, and each switch shows in the series from its step on.
            frame.select_option("#adapt-run", "comm")
            frame.wait_for_selector('body[data-adapt-ready="comm"]')
            ctag = "adapt/compression"
            written = [(s, metadata.COMPRESSIONS[int(v)]) for s, v in sorted(
                dict(_tfevents_scalars(run_logdir / "comm", ctag)[ctag]).items())]
            chart = frame.locator('svg[data-chart="compression"]')
            drawn, labels = _drawn_step_line(chart)
            assert drawn == written and labels == ["none", "fp16"]
            comm_events = _jsonl(run_logdir, "comm")
            assert [(e["step"], e["after"]["compression"]) for e in comm_events] == sorted(
                COMPRESSION_SWITCHES.items())
            for e in comm_events:
                assert [m for s, m in drawn if s < e["step"]][-1] == e["before"]["compression"]
                assert [m for s, m in drawn if s >= e["step"]][0] == e["after"]["compression"]
            markers = chart.locator(".adapt-marker")
            assert [(int(markers.nth(i).get_attribute("data-step")), markers.nth(i).get_attribute(
                "data-kind")) for i in range(markers.count())] == [
                (e["step"], "communication") for e in comm_events]
            assert rows.count() == len(comm_events)
            for i, e in enumerate(comm_events):
                cells = rows.nth(i).locator("td")
                assert [cells.nth(j).inner_text() for j in range(5)] == [
                    str(e["step"]), str(e["epoch"]), "communication", e["policy"], e["reason"]]
                assert cells.nth(5).inner_text() == f"compression: {e['before']['compression']}"
                assert cells.nth(6).inner_text() == f"compression: {e['after']['compression']}"
            page.screenshot(path=os.path.join(ARTIFACTS, "adapt_tab_compression.png"), full_page=True)

            # Every kind in its own colour, the one the runs route gives (the
            # schema's), on the markers, in the table and in the legend; a kind
            # from a newer writer in the unknown colour.
            listing = _get(tensorboard_url + "/data/plugin/adapt/runs")
            colour = dict(listing["kind_colors"])
            frame.select_option("#adapt-run", "kinds")
            frame.wait_for_selector('body[data-adapt-ready="kinds"]')
            markers = frame.locator('svg[data-chart="lr"] .adapt-marker')
            drawn = [(int(markers.nth(i).get_attribute("data-step")), markers.nth(i).get_attribute(
                "data-kind"), markers.nth(i).locator("line").first.get_attribute("stroke"))
                for i in range(markers.count())]
            assert drawn == [(s, k, colour.get(k, listing["unknown_color"])) for s, k in KIND_EVENTS]
            assert len({c for _, _, c in drawn}) == len(KIND_EVENTS)
            rows = frame.locator("#adapt-events tbody tr")
            assert rows.count() == len(KIND_EVENTS)
            for i, (_, kind) in enumerate(KIND_EVENTS):
                swatch = rows.nth(i).locator("td").nth(2).locator(".swatch")
                assert swatch.evaluate("e => getComputedStyle(e).backgroundColor") == _rgb(
                    colour.get(kind, listing["unknown_color"])), kind
            page.screenshot(path=os.path.join(ARTIFACTS, "adapt_tab_event_kinds.png"), full_page=True)

            # A hostile run name and event text render as text, never as markup.
            frame.select_option("#adapt-run", HOSTILE)
            frame.wait_for_selector("body[data-adapt-ready]")
            page.wait_for_function(
                "(name) => [...document.querySelectorAll('iframe')].some(f => "
                "f.contentDocument && f.contentDocument.body.getAttribute('data-adapt-ready') === name)",
                arg=HOSTILE)
            assert frame.locator("#adapt-events tbody tr").first.inner_text().count(HOSTILE) >= 2
            assert HOSTILE in frame.locator("#adapt-run").inner_text()
            assert frame.locator("img").count() == 0
            assert dialogs == []
            assert outside == [], f"requests left the machine: {outside}"
            page.screenshot(path=os.path.join(ARTIFACTS, "adapt_tab_hostile_run.png"), full_page=True)

            # TensorBoard's own Scalars tab draws the adapt/* series too.
            page.goto(tensorboard_url + "/#scalars", wait_until="domcontentloaded")
            for tag in ("adapt/gns", "adapt/batch_size", "adapt/lr"):
                page.get_by_text(tag, exact=True).first.wait_for(state="visible")
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(1500)  # the charts draw after their data arrives
            page.screenshot(path=os.path.join(ARTIFACTS, "scalars_tab.png"), full_page=True)
        finally:
            browser.close()
