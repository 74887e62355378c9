"""``keras-adapt report``: PNG of the expected size, HTML with the (escaped) events."""

import html
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_adapt import cli, report
from keras_adapt.record import metadata, summary
from keras_adapt.record.runs import RunData, load_runs

HOSTILE = "<img src=x onerror=alert(1)>"


def _write_run(path, n_events, reason="gns grew", steps=50):
    with tf.summary.create_file_writer(path).as_default():
        for s in range(steps):
            summary.scalar("gns", 50.0 + s, step=s)
            summary.scalar("batch_size", 32.0 if s < 25 else 64.0, step=s)
            summary.scalar("lr", 0.1 if s < 25 else 0.2, step=s)
            summary.scalar("workers", 2.0, step=s)
            summary.scalar("throughput", 900.0 + s, step=s)
            summary.step_time(0, 0.02, step=s)
            summary.step_time(1, 0.021, step=s)
        # Two events per step (as a batch-size change and its lr change).
        records = [metadata.make_event(
            metadata.EVENT_KINDS[i % len(metadata.EVENT_KINDS)], 5 + 10 * (i // 2), 0,
            "TestPolicy", reason, {"batch_size": 32}, {"batch_size": 64, "note": HOSTILE})
            for i in range(n_events)]
        for step in sorted({r["step"] for r in records}):
            summary.events([r for r in records if r["step"] == step])


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_logs")
    _write_run(str(root / "baseline"), n_events=2)
    _write_run(str(root / HOSTILE), n_events=3, reason=HOSTILE)
    # A run with only the JSONL log (e.g. TensorBoard output switched off),
    # with one damaged line.
    jsonl_dir = root / "jsonl_only"
    jsonl_dir.mkdir()
    with open(jsonl_dir / metadata.EVENTS_FILENAME, "w") as f:
        f.write(metadata.event_to_json(metadata.make_event(
            "batch_size", 7, 0, "P", "scale up", {"batch_size": 32}, {"batch_size": 64})) + "\n")
        f.write('{"step": 9, "kind": "checkp')  # truncated by a crash
    # Garbage next to the runs must not stop the report.
    (root / "broken").mkdir()
    (root / "broken" / "events.out.tfevents.0.x").write_bytes(b"\x00garbage" * 10)
    return str(root)


def test_png_has_the_expected_size(logdir, tmp_path):
    out = str(tmp_path / "report.png")
    assert cli.main(["report", logdir, "-o", out]) == 0
    runs = load_runs(logdir)
    assert [r.name for r in runs] == sorted(["baseline", HOSTILE, "jsonl_only"])
    width, height = report.png_size(out)
    assert (width, height) == (int(report.WIDTH_IN * report.DPI),
                               int(report.RUN_HEIGHT_IN * report.DPI) * 3)
    assert os.path.getsize(out) > 20_000  # charts, not a blank page


def test_events_of_one_step_all_reach_the_report(logdir):
    (run,) = load_runs(logdir, runs=[HOSTILE])
    assert [(e["step"], e["kind"]) for e in run.events] == [
        (5, "batch_size"), (5, "lr"), (15, metadata.EVENT_KINDS[2])]


def _tick_labels(axis):
    """The y tick labels drawn inside the visible range of ``axis`` (major and minor)."""
    lo, hi = axis.get_ylim()
    labels = []
    for tick in axis.yaxis.get_major_ticks() + axis.yaxis.get_minor_ticks():
        if lo <= tick.get_loc() <= hi and tick.label1.get_visible() and tick.label1.get_text():
            labels.append(tick.label1.get_text())
    return labels


@pytest.mark.parametrize("workers,batch", [(2.0, (32.0, 64.0)), (1.0, (256.0, 256.0))])
def test_integer_series_get_integer_ticks(workers, batch):
    """Workers (constant 2, or 1) and batch sizes are labelled as whole numbers, never 1.900."""
    steps = range(0, 40, 2)
    series = {
        metadata.SCALAR_TAGS["workers"]: [(s, 0.0, workers) for s in steps],
        metadata.SCALAR_TAGS["batch_size"]: [(s, 0.0, batch[s >= 20]) for s in steps],
        metadata.SCALAR_TAGS["gns"]: [(s, 0.0, 40.0 + 1.5 * s) for s in steps],
        metadata.SCALAR_TAGS["lr"]: [(s, 0.0, 0.019999999552965164) for s in steps],
    }
    fig = report.build_figure([RunData("r", series, [])])
    fig.canvas.draw()
    axes = {ax.get_title(): ax for ax in fig.axes}
    labels = _tick_labels(axes["workers"])
    assert labels and all(label.lstrip("-").isdigit() for label in labels), labels
    assert str(int(workers)) in labels
    noise = _tick_labels(axes["noise scale and global batch size"])
    assert noise and all(label.isdigit() for label in noise), noise  # log axis: 20, 50, 100, ...
    lo, hi = axes["noise scale and global batch size"].get_ylim()
    assert lo <= min(batch) and max(batch) <= hi


def test_html_contains_every_event_escaped(logdir, tmp_path):
    out = str(tmp_path / "report.html")
    assert cli.main(["report", logdir, "-o", out]) == 0
    with open(out, encoding="utf-8") as f:
        page = f.read()
    assert page.count('<tr class="event">') == 2 + 3 + 1
    assert HOSTILE not in page  # never as markup
    assert html.escape(HOSTILE) in page  # but as text: run name, reason, values
    assert f"run: {html.escape(HOSTILE)}" in page
    assert "data:image/png;base64," in page
    assert "scale up" in page  # from adapt_events.jsonl


def test_one_run_only_and_python_dash_m(logdir, tmp_path):
    out = str(tmp_path / "one.png")
    proc = subprocess.run(
        [sys.executable, "-m", "keras_adapt", "report", logdir, "-o", out, "--run", "baseline"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tensorboard --logdir" in proc.stdout
    assert report.png_size(out) == (1400, 650)


@pytest.mark.parametrize("args,message,code", [
    (["report", "{logdir}", "-o", "{tmp}/r.pdf"], "end it in .png or .html", 2),
    (["report", "{tmp}/missing", "-o", "{tmp}/r.png"], "is not a directory", 2),
    (["report", "{tmp}", "-o", "{tmp}/r.png"], "has adapt data", 1),
    (["report", "{logdir}", "-o", "{tmp}/r.png", "--max-points", "1"],
     "--max-points: '1' is not valid", 2),
])
def test_bad_input_is_explained(logdir, tmp_path, capsys, args, message, code):
    args = [a.format(logdir=logdir, tmp=tmp_path) for a in args]
    assert cli.main(args) == code
    assert message in capsys.readouterr().err


def test_kind_colours_come_from_the_schema_for_report_and_tab():
    """The report and the Adapt tab colour events from one table, the
    schema's (the tab gets it through the plugin's runs route; the browser
    test checks the markers drawn)."""
    from tensorboard_plugin_adapt import plugin

    assert list(metadata.EVENT_COLORS) == list(metadata.EVENT_KINDS)
    assert metadata.event_color("teleport") == metadata.UNKNOWN_EVENT_COLOR
    with open(os.path.join(plugin.STATIC_DIR, "index.js"), encoding="utf-8") as f:
        js = f.read()
    assert "kindColors = listing.kind_colors" in js and "KIND_COLORS" not in js


def test_a_run_with_host_metrics_gets_a_system_row_with_one_line_per_host_and_metric(tmp_path):
    # Two hosts' CPU, memory and network series, as SystemMonitor logs them
    # and AdaptTensorBoard writes them; the report draws exactly those points.
    series = {metadata.SCALAR_TAGS["gns"]: [(s, 0.0, 10.0 + s) for s in range(0, 30, 10)]}
    for host in (0, 1):
        for i, metric in enumerate(("cpu_percent", "memory_percent", "net_in_mb_s", "net_out_mb_s")):
            series[metadata.system_tag(host, metric)] = [
                (s, 0.0, float(10 * host + i + s / 10)) for s in range(0, 30, 10)]
    run = RunData("sys", series, [])
    assert report.has_system_series(run)
    fig = report.build_figure([run])
    axes = {ax.get_title(): ax for ax in fig.axes}
    for title, expected in (
            ("system: CPU and GPU use (%)", {"host 0 CPU": "cpu_percent", "host 1 CPU": "cpu_percent"}),
            ("system: memory use (%)", {"host 0": "memory_percent", "host 1": "memory_percent"}),
            ("system: network (MB/s)", {"host 0 in": "net_in_mb_s", "host 0 out": "net_out_mb_s",
                                        "host 1 in": "net_in_mb_s", "host 1 out": "net_out_mb_s"})):
        lines = {line.get_label(): line for line in axes[title].get_lines()
                 if not line.get_label().startswith("_")}
        assert set(lines) == set(expected), (title, set(lines))
        for label, metric in expected.items():
            host = int(label.split()[1])
            truth = series[metadata.system_tag(host, metric)]
            assert list(lines[label].get_ydata()) == [v for _, _, v in truth], label
    out = str(tmp_path / "sys.png")
    report.plot_runs([run, RunData("plain", {metadata.SCALAR_TAGS["gns"]: series[
        metadata.SCALAR_TAGS["gns"]]}, [])], out)
    assert report.png_size(out) == (int(report.WIDTH_IN * report.DPI), int(
        (2 * report.RUN_HEIGHT_IN + report.SYSTEM_ROW_IN) * report.DPI))


def _write_sync_run(path, switches, steps, sync_events):
    """A run whose adapt/sync_strategy series follows ``switches`` {step: name}."""
    index, points = 0, []
    with tf.summary.create_file_writer(path).as_default():
        for s in steps:
            if s in switches:
                index = metadata.SYNC_STRATEGIES.index(switches[s])
            summary.scalar("sync_strategy", float(index), step=s)
            summary.scalar("workers", 2.0, step=s)
            points.append((s, float(index)))
        for step in sorted({e["step"] for e in sync_events}):  # all records of a step at once
            summary.events([e for e in sync_events if e["step"] == step])
    return points


def test_sync_strategy_panel_draws_the_series_with_the_strategy_names(tmp_path):
    # Writes every 4 steps plus epoch ends (a remainder batch at 30, 61).
    steps = sorted(set(range(0, 64, 4)) | {30, 61})
    switch_events = [
        metadata.make_event("sync_strategy", 12, 0, "SyncStrategyPolicy", "comm share 0.4 > 0.3",
                            {"sync_strategy": "allreduce_sgd"},
                            {"sync_strategy": "local_sgd", "period": 8}),
        metadata.make_event("lr", 12, 0, "P", "decay", {"lr": 0.1}, {"lr": 0.01}),
        metadata.make_event("sync_strategy", 30, 0, "SyncStrategyPolicy", "noise scale grew",
                            {"sync_strategy": "local_sgd", "period": 8},
                            {"sync_strategy": "elastic_averaging", "period": 4, "rho": 0.5}),
    ]
    # A hand switch at 44 (no event) back to allreduce_sgd: the series is the truth.
    points = _write_sync_run(str(tmp_path / "sync"), {12: "local_sgd", 30: "elastic_averaging",
                                                      44: "allreduce_sgd"}, steps, switch_events)
    _write_sync_run(str(tmp_path / "plain"), {}, steps, [])
    runs = {r.name: r for r in load_runs(str(tmp_path))}
    assert report.has_sync_strategy_panel(runs["sync"])
    assert not report.has_sync_strategy_panel(runs["plain"])

    fig = report.build_figure([runs["sync"], runs["plain"]])
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_title() == "sync strategy"]
    assert len(panels) == 1  # the plain S-SGD run has none
    (ax,) = panels
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "strategy"]
    assert list(line.get_xdata()) == [s for s, _ in points]
    assert list(line.get_ydata()) == [v for _, v in points]
    assert line.get_drawstyle() == "steps-post"
    used = sorted({int(v) for _, v in points})
    assert used == [0, 2, 4]
    assert list(ax.get_yticks()) == used
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "allreduce_sgd", "local_sgd", "elastic_averaging"]
    markers = [ln for ln in ax.get_lines() if ln.get_label() != "strategy"]
    assert sorted(ln.get_xdata()[0] for ln in markers) == [12, 12, 30]
    # The events legend moved to the block's corner; the plain run keeps its legend panel.
    assert [t.get_text() for t in fig.subfigs[0].legends[0].get_texts()] == [
        "lr (1)", "sync_strategy (2)"]
    assert any(ax.texts and ax.texts[0].get_text() == "no adaptation events" for ax in fig.axes)
    # The HTML table reads the strategies with their parameters, as the tab does.
    page = open(report.write_report(str(tmp_path), str(tmp_path / "r.html"), runs=["sync"]),
                encoding="utf-8").read()
    cells = re.findall(r'<td class="mono" title="([^"]*)">([^<]*)</td>', page)
    assert [text for _, text in cells] == [
        "allreduce_sgd", "local_sgd (period: 8)", "lr: 0.1", "lr: 0.01",
        "local_sgd (period: 8)", "elastic_averaging (period: 4, rho: 0.5)"]
    assert [json.loads(html.unescape(title)) for title, _ in cells] == [
        v for e in switch_events for v in (e["before"], e["after"])]
    out = str(tmp_path / "sync.png")
    report.plot_runs([runs["sync"], runs["plain"]], out)
    assert report.png_size(out) == (int(report.WIDTH_IN * report.DPI),
                                    int(2 * report.RUN_HEIGHT_IN * report.DPI))


def test_sync_strategy_panel_rule():
    """A sync_strategy event alone makes a run qualify; events without the series do not."""
    T = metadata.SCALAR_TAGS
    plain = {T["sync_strategy"]: [(s, 0.0, 0.0) for s in range(5)]}
    event = metadata.make_event("sync_strategy", 2, 0, "P", "r", {"sync_strategy": "allreduce_sgd"},
                                {"sync_strategy": "allreduce_sgd"})
    assert report.has_sync_strategy_panel(RunData("e", plain, [event]))
    assert not report.has_sync_strategy_panel(RunData("p", plain, []))
    assert not report.has_sync_strategy_panel(RunData("n", {}, [event]))
    fig = report.build_figure([RunData("e", plain, [event])])
    fig.canvas.draw()
    (ax,) = [ax for ax in fig.axes if ax.get_title() == "sync strategy"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["allreduce_sgd"]
