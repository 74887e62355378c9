"""The "adapt" TensorBoard plugin over real event files, served by TensorBoard's WSGI app.

Event files are written with ``tensorboard_plugin_adapt.summary``, read back
through TensorBoard's own multiplexer and ``MultiplexerDataProvider``, and
every route is requested through ``tensorboard.backend.application`` with
werkzeug's test client -- on both stacks (TensorBoard 2.18 and 2.15).
"""

import json
import os
import time
import urllib.parse

import pytest
import tensorflow as tf
from werkzeug.test import Client

from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin

from tensorboard_plugin_adapt import metadata, plugin, summary

HOSTILE = "<img src=x onerror=alert(1)>"
N_POINTS = 5000
PREFIX = "/data/plugin/adapt"


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
        summary.event(metadata.make_event("batch_size", 2500, 3, "GNSBatchSizePolicy", "gns 149 > 2 x 64",
                                          {"batch_size": 64}, {"batch_size": 128}))
        summary.event(metadata.make_event("lr", 2500, 3, "LRScalingPolicy", "batch 64 -> 128",
                                          {"lr": 0.1}, {"lr": 0.2}))
        summary.event(metadata.make_event("resize", 100, 0, "ResizePolicy", "more data",
                                          {"workers": 1}, {"workers": 2}))
        # A kind from a newer writer: kept and shown as unknown.
        unknown = metadata.make_event("lr", 4000, 5, "Future", "new kind", {}, {})
        unknown["kind"] = "teleport"
        summary.event(unknown)
        # Damage: a record that is not JSON, and a number under the events tag.
        md = metadata.create_summary_metadata("tensor")
        tf.summary.write(metadata.EVENTS_TAG, tf.constant("not json {"), step=4100, metadata=md)
        tf.summary.write(metadata.EVENTS_TAG, tf.constant(3.5), step=4200, metadata=md)


def _write_small_run(path, reason="r"):
    with tf.summary.create_file_writer(path).as_default():
        for s in range(10):
            summary.scalar("gns", 10.0 + s, step=s)
        summary.event(metadata.make_event("checkpoint", 5, 0, HOSTILE, reason, {}, {"path": HOSTILE}))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt_logs")
    _write_main_run(str(root / "main"))
    _write_small_run(str(root / HOSTILE), reason=HOSTILE)
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


def _app(logdir):
    mux = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: plugin.DEFAULT_SAMPLES_PER_TAG})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    context = base_plugin.TBContext(data_provider=provider, logdir=logdir)
    adapt = plugin.AdaptLoader().load(context)
    return application.TensorBoardWSGI([adapt], data_provider=provider), adapt


@pytest.fixture(scope="module")
def client(logdir):
    app, _ = _app(logdir)
    return Client(app)


def get_json(client, path, code=200):
    response = client.get(PREFIX + path)
    assert response.status_code == code, (path, response.status_code, response.get_data()[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.get_data())


def q(run):
    return urllib.parse.quote(run, safe="")


def test_runs_lists_only_runs_with_adapt_data(client):
    body = get_json(client, "/runs")
    runs = {r["run"]: r for r in body["runs"]}
    assert sorted(runs) == sorted(["main", HOSTILE, "truncated"])
    assert runs["main"]["events"] is True
    assert set(runs["main"]["tags"]) == {
        "adapt/gns", "adapt/batch_size", "adapt/lr", "adapt/workers", "adapt/throughput",
        "adapt/step_time/rank_0", "adapt/step_time/rank_1"}
    assert body["kinds"] == list(metadata.EVENT_KINDS)


def test_scalars_are_downsampled_keeping_first_last_and_extremes(client):
    body = get_json(client, "/scalars?run=main&max_points=200")
    gns = body["series"]["adapt/gns"]
    assert body["total"]["adapt/gns"] == N_POINTS
    assert 100 <= len(gns) <= 200
    assert gns[0][0] == 0 and gns[-1][0] == N_POINTS - 1
    assert [p[0] for p in gns] == sorted(p[0] for p in gns)
    values = [p[2] for p in gns]
    assert min(values) == 100.0 and max(values) == 149.0  # the extremes survive
    # Short series pass through unchanged, with their real values.
    lr = body["series"]["adapt/lr"]
    assert len(lr) == N_POINTS // 100
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


def test_events_sorted_with_unknown_kinds_and_damage_skipped(client):
    body = get_json(client, "/events?run=main")
    events = body["events"]
    assert [e["step"] for e in events] == [100, 2500, 2500, 4000]
    assert [e["kind"] for e in events][0] == "resize"
    teleport = [e for e in events if e["kind"] == "teleport"]
    assert len(teleport) == 1 and teleport[0]["known"] is False
    assert all(e["known"] for e in events if e["kind"] != "teleport")
    assert body["skipped"] == 2
    assert body["kinds"] == ["batch_size", "lr", "resize", "teleport"]
    lr_only = get_json(client, "/events?run=main&kind=lr")["events"]
    assert [e["after"] for e in lr_only] == [{"lr": 0.2}]


def test_hostile_run_name_round_trips_as_data(client):
    body = get_json(client, f"/scalars?run={q(HOSTILE)}")
    assert body["run"] == HOSTILE
    assert [p[2] for p in body["series"]["adapt/gns"]] == [10.0 + s for s in range(10)]
    events = get_json(client, f"/events?run={q(HOSTILE)}")["events"]
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


def test_plugin_apps_answer_without_the_application(logdir):
    # The bare routes of get_plugin_apps(), as TensorBoard mounts them.
    _, adapt = _app(logdir)
    for route, app in adapt.get_plugin_apps().items():
        path = PREFIX + route.replace("*", "index.js")
        query = "?run=main" if route in ("/scalars", "/events") else ""
        response = Client(app).get(path + query)
        assert response.status_code == 200, route


def test_empty_logdir(tmp_path):
    app, _ = _app(str(tmp_path))
    body = get_json(Client(app), "/runs")
    assert body["runs"] == []
    listing = json.loads(Client(app).get("/data/plugins_listing").get_data())
    assert listing["adapt"]["enabled"] is False


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
