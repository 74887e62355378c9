"""End to end: a real TensorBoard over a real training run, the Adapt tab in headless Chromium.

Needs Debian's ``chromium`` (``make setup`` installs it when run as root)
and the ``playwright`` package (requirements/primary.txt), driven with the
system browser; never ``playwright install``. Skips with the reason when
either is missing. Saves a screenshot to ``test-artifacts/adapt_tab.png``.
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
EVENT_KINDS = ("batch_size", "lr", "resize")  # one per epoch of the training run
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
    """A short real training run with AdaptTensorBoard and one event per epoch."""
    import keras
    import keras_adapt
    from keras_adapt import events
    from keras_adapt.callbacks import AdaptTensorBoard, GradientStatsMonitor

    class Emit(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            events.emit(EVENT_KINDS[epoch], step=int(self.model.optimizer.iterations.numpy()),
                        epoch=epoch, policy="BrowserTestPolicy", reason=f"reason {epoch}",
                        before={"value": epoch}, after={"value": epoch + 1}, log_dir=log_dir)

    rng = np.random.default_rng(0)
    x = rng.random((480, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    model.fit(x, y, batch_size=16, epochs=len(EVENT_KINDS), verbose=0, callbacks=[
        GradientStatsMonitor(interval=3), AdaptTensorBoard(log_dir, update_freq=3), Emit()])


def _write_hostile_run(log_dir):
    import tensorflow as tf
    from tensorboard_plugin_adapt import metadata, summary

    with tf.summary.create_file_writer(log_dir).as_default():
        for s in range(5):
            summary.scalar("gns", 10.0 + s, step=s)
        summary.event(metadata.make_event("checkpoint", 2, 0, HOSTILE, HOSTILE, {}, {"x": HOSTILE}))


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
                if {r["run"] for r in runs} >= {"train", HOSTILE}:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the Adapt tab did not become enabled within {timeout}s (last: {last})")


@pytest.fixture()
def tensorboard_url(tmp_path):
    _requirements()
    logdir = tmp_path / "logs"
    _train(str(logdir / "train"))
    _write_hostile_run(str(logdir / HOSTILE))
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "tensorboard.main"]
    cmd += [f"--logdir={logdir}", f"--port={port}", "--host=127.0.0.1"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_tab(base, proc)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def _adapt_frame(page, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for frame in page.frames:
            if "plugin_entry.html" in frame.url and "name=adapt" in frame.url:
                return frame
        page.wait_for_timeout(250)
    pytest.fail(f"no Adapt iframe; frames: {[f.url for f in page.frames]}")


def test_adapt_tab_renders_charts_markers_and_events(tensorboard_url):
    from playwright.sync_api import sync_playwright

    os.makedirs(ARTIFACTS, exist_ok=True)
    n = len(EVENT_KINDS)
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
            # has one marker per event.
            assert frame.locator('svg[data-chart="noise"] path.adapt-series').count() == 2
            for chart in ("noise", "lr", "workers", "throughput", "step_time"):
                assert frame.locator(f'svg[data-chart="{chart}"] path.adapt-series').count() >= 1, chart
                assert frame.locator(f'svg[data-chart="{chart}"] .adapt-marker').count() == n, chart
            kinds = [frame.locator('svg[data-chart="noise"] .adapt-marker').nth(i).get_attribute("data-kind")
                     for i in range(n)]
            assert kinds == list(EVENT_KINDS)

            rows = frame.locator("#adapt-events tbody tr")
            assert rows.count() == n
            frame.select_option("#adapt-kind-filter", "lr")
            assert rows.count() == 1 and "reason 1" in rows.first.inner_text()
            frame.select_option("#adapt-kind-filter", "")
            assert rows.count() == n

            # Hover a marker: reason and before/after in the tooltip.
            frame.locator('svg[data-chart="lr"] .adapt-marker line').nth(3).hover(force=True)
            tip = frame.locator("#adapt-tooltip")
            tip.wait_for(state="visible")
            assert "reason 1" in tip.inner_text() and '"value":2' in tip.inner_text()

            page.screenshot(path=os.path.join(ARTIFACTS, "adapt_tab.png"), full_page=True)

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
        finally:
            browser.close()
