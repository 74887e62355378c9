"""The "adapt" TensorBoard plugin over real event files, served by TensorBoard's WSGI app.

Event files are written with ``keras_adapt.record.summary``, read back
through BOTH of TensorBoard's loaders -- its Python multiplexer
(``--load_fast=false``) and its Rust data server over gRPC (the default,
``--load_fast=auto``), which keeps one datum per step -- and every route is
requested through ``tensorboard.backend.application`` with werkzeug's test
client, next to TensorBoard's own Scalars plugin; on both stacks
(TensorBoard 2.21 and 2.15; 2.18 with the TensorFlow 2.18 option).
"""

import csv
import io
import json
import os
import re
import tempfile
import time
import urllib.parse

import pytest
import tensorflow as tf
from werkzeug.test import Client

from tensorboard.backend import application
from tensorboard.backend.event_processing import data_ingester
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins import base_plugin
from tensorboard.plugins.scalar import scalars_plugin

from keras_adapt.record import metadata, reader, summary
from tensorboard_plugin_adapt import plugin

import tensorboard_loaders

HOSTILE = "<img src=x onerror=alert(1)>"
N_POINTS = 5000
PREFIX = "/data/plugin/adapt"


def _ev(kind, step, policy="P", reason="r", before=None, after=None, epoch=0):
    return metadata.make_event(kind, step, epoch, policy, reason, before or {}, after or {})


#: What the main run's policies emitted (its adapt_events.jsonl, in emission
#: order): several events per step, one of them arriving after its step
#: was written, and a kind from a newer writer.
MAIN_EVENTS = [
    _ev("batch_size", 100, "GNSBatchSizePolicy", "gns 149 > 2 x 32", {"batch_size": 32},
        {"batch_size": 64}),
    _ev("lr", 100, "LRScalingPolicy", "batch 32 -> 64", {"lr": 0.05}, {"lr": 0.1}),
    _ev("batch_size", 2500, "GNSBatchSizePolicy", "gns 149 > 2 x 64", {"batch_size": 64},
        {"batch_size": 128}, epoch=3),
    _ev("lr", 2500, "LRScalingPolicy", "batch 64 -> 128", {"lr": 0.1},
        {"lr": 0.019999999552965164}, epoch=3),
    dict(_ev("lr", 4000, "Future", "new kind", epoch=5), kind="teleport"),
    # Emitted late (after steps 2500 and 4000 were written) for step 100.
    _ev("resume", 100, "LRScalingPolicy", "state restored", {}, {"last_adapt": 100}),
    _ev("lr", 4100, "LRScalingPolicy", "next to a damaged record", {"lr": 0.1}, {"lr": 0.2}),
]


def _write_main_run(path):
    with tf.summary.create_file_writer(path).as_default():
        for s in range(N_POINTS):
            summary.scalar("gns", 100.0 + (s % 50), step=s)
        for s in range(0, N_POINTS, 100):
            summary.scalar("batch_size", 64.0 if s < 2500 else 128.0, step=s)
            summary.scalar("lr", 0.1 if s < 2500 else 0.2, step=s)
            summary.scalar("workers", 2.0, step=s)
            summary.scalar("throughput", 1000.0 + s, step=s)
            summary.step_time(0, 0.01, step=s)
            summary.step_time(1, 0.012, step=s)
        # Events as AdaptTensorBoard writes them: in three writes, one of
        # them adding to steps already written.
        writer = summary.EventWriter()
        for batch in (MAIN_EVENTS[:3], MAIN_EVENTS[3:5], MAIN_EVENTS[5:6]):
            for record in batch:
                writer.add(record)
            writer.write()
        # Damage: a record that is not JSON next to a good one, and a number
        # under the events tag.
        md = metadata.create_summary_metadata("tensor")
        good = metadata.event_to_json(MAIN_EVENTS[6])
        tf.summary.write(metadata.EVENTS_TAG, tf.constant(["not json {", good]), step=4100,
                         metadata=md)
        tf.summary.write(metadata.EVENTS_TAG, tf.constant(3.5), step=4200, metadata=md)


def _write_small_run(path, reason="r"):
    with tf.summary.create_file_writer(path).as_default():
        for s in range(10):
            summary.scalar("gns", 10.0 + s, step=s)
        summary.events([metadata.make_event("resume", 5, 0, HOSTILE, reason, {}, {"path": HOSTILE})])


def _adapt_metadata(data_class, version):
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=str(version).encode()),
        data_class=data_class)


OLD_EVENTS = [_ev("batch_size", 10), _ev("lr", 10), _ev("lr", 20)]


def _write_old_format_run(path):
    """As keras-adapt wrote before format 1: series under plugin "adapt", one record per datum."""
    with tf.summary.create_file_writer(path).as_default():
        md = _adapt_metadata(summary_pb2.DATA_CLASS_SCALAR, 0)
        for s in range(30):
            tf.summary.write("adapt/gns", tf.constant(50.0 + s), step=s, metadata=md)
        md = _adapt_metadata(summary_pb2.DATA_CLASS_TENSOR, 0)
        for e in OLD_EVENTS:
            tf.summary.write(metadata.EVENTS_TAG, tf.constant(metadata.event_to_json(e)),
                             step=e["step"], metadata=md)


def _write_newer_format_run(path):
    """A future writer: format PROTO_VERSION + 1 for the events and an old-plugin series."""
    newer = metadata.PROTO_VERSION + 1
    with tf.summary.create_file_writer(path).as_default():
        summary.scalar("gns", 7.0, step=1)
        md = _adapt_metadata(summary_pb2.DATA_CLASS_SCALAR, newer)
        tf.summary.write("adapt/new_series", tf.constant(1.0), step=1, metadata=md)
        md = _adapt_metadata(summary_pb2.DATA_CLASS_TENSOR, newer)
        for step in (3, 4):
            tf.summary.write(metadata.EVENTS_TAG, tf.constant(["{\"v\": 2}"]), step=step,
                             metadata=md)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt_logs")
    _write_main_run(str(root / "main"))
    _write_small_run(str(root / HOSTILE), reason=HOSTILE)
    _write_old_format_run(str(root / "old_format"))
    _write_newer_format_run(str(root / "newer_format"))
    # No adapt data: a stock scalar only.
    with tf.summary.create_file_writer(str(root / "plain")).as_default():
        tf.summary.scalar("loss", 1.0, step=1)
    # Empty event file, and a file of garbage bytes.
    (root / "empty").mkdir()
    (root / "empty" / "events.out.tfevents.1.host").write_bytes(b"")
    (root / "garbage").mkdir()
    (root / "garbage" / "events.out.tfevents.1.host").write_bytes(os.urandom(300))
    # Truncated in the middle of its last record.
    _write_small_run(str(root / "truncated"))
    (f,) = [p for p in (root / "truncated").iterdir() if "tfevents" in p.name]
    data = f.read_bytes()
    f.write_bytes(data[:-7])
    return str(root)


def _app(logdir, loader):
    provider, stop = tensorboard_loaders.provider(loader, logdir,
                                                  expect_runs=("main", "truncated", "old_format"))
    context = base_plugin.TBContext(data_provider=provider, logdir=logdir)
    adapt = plugin.AdaptLoader().load(context)
    scalars = scalars_plugin.ScalarsPlugin(context)
    return application.TensorBoardWSGI([adapt, scalars], data_provider=provider), adapt, stop


@pytest.fixture(scope="module", params=tensorboard_loaders.LOADERS)
def loaded(request, logdir):
    app, adapt, stop = _app(logdir, request.param)
    yield request.param, Client(app), adapt
    stop()


@pytest.fixture(scope="module")
def client(loaded):
    return loaded[1]


def get_json(client, path, code=200):
    response = client.get(PREFIX + path)
    assert response.status_code == code, (path, response.status_code, response.get_data()[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.get_data())


def q(run):
    return urllib.parse.quote(run, safe="")


def _fields(event):
    return {k: event[k] for k in metadata.EVENT_FIELDS}


def test_runs_lists_only_runs_with_adapt_data(client):
    body = get_json(client, "/runs")
    runs = {r["run"]: r for r in body["runs"]}
    assert sorted(runs) == sorted(["main", HOSTILE, "truncated", "old_format", "newer_format"])
    assert runs["main"]["events"] is True
    assert set(runs["main"]["tags"]) == {
        "adapt/gns", "adapt/batch_size", "adapt/lr", "adapt/workers", "adapt/throughput",
        "adapt/step_time/rank_0", "adapt/step_time/rank_1"}
    assert runs["old_format"]["tags"] == ["adapt/gns"]
    # A series of a newer format is not offered; the run's readable one is.
    assert runs["newer_format"]["tags"] == ["adapt/gns"]
    assert body["kinds"] == list(metadata.EVENT_KINDS) == ["batch_size", "lr", "resize", "resume",
                                                        "sync_strategy", "straggler", "preemption",
                                                        "checkpoint", "communication"]
    # One distinct colour per declared kind (the tab draws with these), and
    # a different one for any other kind.
    assert list(body["kind_colors"]) == body["kinds"]
    colours = list(body["kind_colors"].values()) + [body["unknown_color"]]
    assert len(set(colours)) == len(colours)
    assert all(re.fullmatch("#[0-9a-f]{6}", c) for c in colours), colours
    # The strategies' names by the index adapt/sync_strategy holds, as the
    # strategy classes number themselves (the tab labels its chart with them).
    from keras_adapt.sync.sync_state import STRATEGIES

    assert body["sync_strategies"] == list(metadata.SYNC_STRATEGIES)
    assert {name: body["sync_strategies"][cls.index] for name, cls in STRATEGIES.items()} == {
        name: name for name in STRATEGIES}
    # What adapt/compression holds, by the compression switch's index.
    from keras_adapt.optimizer.compression_switch import MODES

    assert body["compressions"] == list(metadata.COMPRESSIONS) == list(MODES) == ["none", "fp16"]


def test_scalars_are_downsampled_keeping_first_last_and_extremes(loaded):
    loader, client, adapt = loaded
    stored = get_json(client, "/scalars?run=main&max_points=20000")["series"]["adapt/gns"]
    # TensorBoard samples scalars (1000 per series by default, both loaders).
    assert len(stored) == data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE["scalars"]
    assert stored[-1][0] == N_POINTS - 1
    assert all(p[2] == 100.0 + p[0] % 50 for p in stored)
    body = get_json(client, "/scalars?run=main&max_points=200")
    gns = body["series"]["adapt/gns"]
    assert body["total"]["adapt/gns"] == len(stored)
    assert 100 <= len(gns) <= 200
    assert gns[0] == stored[0] and gns[-1] == stored[-1]
    assert [p[0] for p in gns] == sorted(p[0] for p in gns)
    values = [p[2] for p in gns]
    assert min(values) == min(p[2] for p in stored) == 100.0
    assert max(values) == max(p[2] for p in stored) == 149.0  # the extremes survive
    # Short series pass through unchanged, with their real values.
    lr = body["series"]["adapt/lr"]
    assert [p[0] for p in lr] == list(range(0, N_POINTS, 100))
    assert lr[0][2] == pytest.approx(0.1) and lr[-1][2] == pytest.approx(0.2)
    default = get_json(client, "/scalars?run=main")
    assert len(default["series"]["adapt/gns"]) <= plugin.DEFAULT_MAX_POINTS


def test_scalars_one_tag_and_latency(client):
    start = time.perf_counter()
    body = get_json(client, "/scalars?run=main&tag=adapt/gns&max_points=1000")
    elapsed = time.perf_counter() - start
    assert list(body["series"]) == ["adapt/gns"]
    assert len(body["series"]["adapt/gns"]) <= 1000
    print(f"scalars route, {N_POINTS} points -> 1000: {elapsed * 1000:.1f} ms")
    assert elapsed < 2.0


def test_series_are_in_tensorboards_scalars_tab(client):
    """TensorBoard's own Scalars plugin lists and serves the adapt/* series (and CSV)."""
    tags = json.loads(client.get("/data/plugin/scalars/tags").get_data())
    assert {"adapt/gns", "adapt/lr", "adapt/batch_size", "adapt/workers", "adapt/throughput",
            "adapt/step_time/rank_0", "adapt/step_time/rank_1"} <= set(tags["main"])
    assert "old_format" not in tags  # format 0 wrote them for the Adapt tab only
    response = client.get("/data/plugin/scalars/scalars?run=main&tag=adapt/batch_size")
    assert response.status_code == 200
    points = json.loads(response.get_data())  # [[wall_time, step, value], ...]
    assert [(p[1], p[2]) for p in points] == [
        (s, 64.0 if s < 2500 else 128.0) for s in range(0, N_POINTS, 100)]
    response = client.get("/data/plugin/scalars/scalars?run=main&tag=adapt/lr&format=csv")
    rows = list(csv.reader(io.StringIO(response.get_data(as_text=True))))
    assert rows[0] == ["Wall time", "Step", "Value"]
    assert [(int(r[1]), float(r[2])) for r in rows[1:]] == [
        (s, pytest.approx(0.1 if s < 2500 else 0.2)) for s in range(0, N_POINTS, 100)]
    # The Adapt routes read the same series.
    lr = get_json(client, "/scalars?run=main&tag=adapt/lr")["series"]["adapt/lr"]
    assert [(p[0], p[2]) for p in lr] == [(int(r[1]), float(r[2])) for r in rows[1:]]


@pytest.mark.parametrize("path,code", [
    ("/scalars", 400),
    ("/scalars?run=main&max_points=abc", 400),
    ("/scalars?run=main&max_points=1", 400),
    ("/scalars?run=main&max_points=999999", 400),
    ("/scalars?run=nosuchrun", 404),
    ("/scalars?run=plain", 404),
    ("/events", 400),
    ("/events?run=nosuchrun", 404),
])
def test_bad_requests_get_clear_errors(client, path, code):
    body = get_json(client, path, code=code)
    assert body["error"]


def test_every_event_of_every_step_with_unknown_kinds_and_damage_skipped(client):
    body = get_json(client, "/events?run=main")
    events = body["events"]
    # Exactly what was emitted (the run's JSONL), in step then emission order.
    expected = sorted(MAIN_EVENTS, key=lambda e: (e["step"], e["wall_time"]))
    assert [_fields(e) for e in events] == expected
    assert [(e["step"], e["kind"]) for e in events] == [
        (100, "batch_size"), (100, "lr"), (100, "resume"), (2500, "batch_size"), (2500, "lr"),
        (4000, "teleport"), (4100, "lr")]
    teleport = [e for e in events if e["kind"] == "teleport"]
    assert len(teleport) == 1 and teleport[0]["known"] is False
    assert all(e["known"] for e in events if e["kind"] != "teleport")
    assert body["skipped"] == 2 and body["newer"] == 0
    assert body["kinds"] == ["batch_size", "lr", "resume", "teleport"]
    lr_only = get_json(client, "/events?run=main&kind=lr")["events"]
    assert [e["after"] for e in lr_only] == [{"lr": 0.1}, {"lr": 0.019999999552965164}, {"lr": 0.2}]


def test_older_format_is_still_read(loaded):
    loader, client, _ = loaded
    series = get_json(client, "/scalars?run=old_format")["series"]
    assert [p[2] for p in series["adapt/gns"]] == [50.0 + s for s in range(30)]
    events = get_json(client, "/events?run=old_format")["events"]
    if loader == "python":
        assert [_fields(e) for e in events] == OLD_EVENTS
    else:
        # Format 0 put each record of a step in its own datum; the data
        # server keeps the last of them (why format 1 exists).
        assert [_fields(e) for e in events] == OLD_EVENTS[1:]


def test_newer_format_is_skipped_and_counted(client):
    body = get_json(client, "/events?run=newer_format")
    assert body["events"] == [] and body["newer"] == 2 and body["skipped"] == 0
    assert [p[2] for p in get_json(client, "/scalars?run=newer_format")["series"]["adapt/gns"]] == [7.0]


def test_hostile_run_name_round_trips_as_data(client):
    body = get_json(client, f"/scalars?run={q(HOSTILE)}")
    assert body["run"] == HOSTILE
    assert [p[2] for p in body["series"]["adapt/gns"]] == [10.0 + s for s in range(10)]
    events = get_json(client, f"/events?run={q(HOSTILE)}")["events"]
    assert len(events) == 1
    assert events[0]["reason"] == HOSTILE and events[0]["policy"] == HOSTILE


def test_frontend_never_builds_html_from_strings(client):
    js = client.get(PREFIX + "/index.js").get_data(as_text=True)
    # All data reaches the page through textContent/setAttribute.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js
    # No request leaves the machine.
    assert "http://" not in js.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in js


def test_truncated_and_empty_files_do_not_break_other_runs(client):
    body = get_json(client, "/scalars?run=truncated")
    assert len(body["series"]["adapt/gns"]) == 10  # the records before the damage
    assert get_json(client, "/runs")["runs"]


@pytest.mark.parametrize("path", [
    "/static/../../x",
    "/static/../plugin.py",
    "/static/%2e%2e/plugin.py",
    "/static/%2E%2E%2Fplugin.py",
    "/static/..%2fplugin.py",
    "/static/..%5cplugin.py",
    "/static/%252e%252e%252fplugin.py",
    "/static/",
    "/static/nosuchfile.js",
    "/static/./index.js/../../plugin.py",
])
def test_static_rejects_traversal(client, path):
    response = client.get(PREFIX + path)
    assert response.status_code == 404, path
    assert b"import" not in response.get_data()


def test_static_and_entry_routes(client):
    for path in ("/index.js", "/static/index.js"):
        response = client.get(PREFIX + path)
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/javascript")
        assert b"export async function render" in response.get_data()
    entry = client.get("/data/plugin_entry.html?name=adapt")
    assert entry.status_code == 200 and b"./index.js" in entry.get_data()
    listing = json.loads(client.get("/data/plugins_listing").get_data())
    assert listing["adapt"]["enabled"] is True
    assert listing["adapt"]["tab_name"] == "Adapt"
    assert listing["adapt"]["loading_mechanism"]["module_path"] == PREFIX + "/index.js"


def test_plugin_apps_answer_without_the_application(loaded):
    # The bare routes of get_plugin_apps(), as TensorBoard mounts them.
    _, _, adapt = loaded
    for route, app in adapt.get_plugin_apps().items():
        path = PREFIX + route.replace("*", "index.js")
        query = "?run=main" if route in ("/scalars", "/events") else ""
        response = Client(app).get(path + query)
        assert response.status_code == 200, route


def test_empty_logdir(tmp_path):
    app, _, _ = _app(str(tmp_path), "python")
    body = get_json(Client(app), "/runs")
    assert body["runs"] == []
    listing = json.loads(Client(app).get("/data/plugins_listing").get_data())
    assert listing["adapt"]["enabled"] is False


def test_tab_is_enabled_by_series_alone(tmp_path):
    """A run with adapt/* series but no events (no policy) still enables the tab."""
    with tf.summary.create_file_writer(str(tmp_path / "run")).as_default():
        summary.scalar("gns", 3.0, step=1)
        tf.summary.scalar("loss", 1.0, step=1)
    app, _, _ = _app(str(tmp_path), "python")
    listing = json.loads(Client(app).get("/data/plugins_listing").get_data())
    assert listing["adapt"]["enabled"] is True
    assert [r["run"] for r in get_json(Client(app), "/runs")["runs"]] == ["run"]


def test_entry_point_and_loader_flags(tmp_path):
    from tensorboard import default, program

    assert plugin.AdaptLoader in default.get_dynamic_plugins(), (
        "reinstall keras-adapt (pip install --no-build-isolation --no-deps -e .) so "
        "TensorBoard sees the tensorboard_plugins entry point")
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=["tensorboard", f"--logdir={tmp_path}"])
    assert tb.flags.samples_per_plugin[metadata.PLUGIN_NAME] == plugin.DEFAULT_SAMPLES_PER_TAG
    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(argv=["tensorboard", f"--logdir={tmp_path}", "--samples_per_plugin=adapt=7"])
    assert tb.flags.samples_per_plugin[metadata.PLUGIN_NAME] == 7


# -- the stored format, without TensorBoard's loaders --------------------------

def test_content_version_and_latest_datums():
    assert metadata.content_version(str(metadata.PROTO_VERSION).encode()) == 1
    assert metadata.content_version(b"") == 0 and metadata.content_version(b"0") == 0
    assert metadata.content_version(b"\x08\x01") is None and metadata.content_version(None) is None

    class D:
        def __init__(self, step, name):
            self.step, self.name = step, name

    # The data server's rule: a datum drops the earlier ones at its step or later.
    written = [D(1, "a"), D(5, "b"), D(5, "b2"), D(9, "c"), D(3, "d"), D(9, "e")]
    assert [d.name for d in metadata.latest_datums(written)] == ["a", "d", "e"]


def test_event_writer_rewrites_steps_so_none_is_lost(tmp_path):
    """Records arriving late, out of order and twice: the datums always hold every record."""
    log = str(tmp_path / "w")
    a, b = _ev("batch_size", 10), _ev("lr", 10)
    c, d, late = _ev("lr", 30), _ev("batch_size", 20), _ev("resume", 10)
    w = summary.EventWriter()
    with tf.summary.create_file_writer(log).as_default():
        assert w.add(a) and w.add(b) and not w.add(dict(a))  # identical: kept once
        assert w.write() == [10]
        assert w.write() == []  # nothing new
        w.add(c)
        assert w.write() == [30]
        w.add(d)  # a step before one already written: 30 is written again
        assert w.write() == [20, 30]
        w.add(late)
        assert w.write() == [10, 20, 30]
    provider, _ = tensorboard_loaders.python_provider(str(tmp_path))
    events, skipped, newer = reader.read_events(provider, None, "", "w")
    assert [_fields(e) for e in events] == [a, b, late, d, c] and (skipped, newer) == (0, 0)


@pytest.mark.parametrize("records,match", [
    ([], "non-empty list"),
    ({"step": 1}, "non-empty list"),
    ([{"step": 1}], "is not an adaptation event"),
    ([_ev("lr", 1), _ev("lr", 2)], r"steps \[1, 2\]"),
])
def test_events_rejects_bad_records(records, match):
    with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
        with pytest.raises(ValueError, match=match):
            summary.events(records)
