"""The "Adapt" TensorBoard tab: JSON routes over the data provider, plus the frontend.

Routes (under ``/data/plugin/adapt/``):

``runs``
    ``{"runs": [{"run", "tags", "events"}], "kinds": [...], "kind_colors": {...},
    "unknown_color": "#...", "sync_strategies": [...],
    "compressions": [...]}``
    -- every run with adapt data, the known event kinds and their colours, and the
    synchronisation strategies' names by the index that the
    ``adapt/sync_strategy`` series holds (:data:`metadata.SYNC_STRATEGIES`).
``scalars?run=R[&tag=T][&max_points=N]``
    ``{"run", "series": {tag: [[step, wall_time, value], ...]}, "total": {tag: n}}``,
    each series downsampled on the server to at most N points (default
    1000) keeping the first and last points and each bucket's extremes.
``events?run=R[&kind=K]``
    ``{"run", "events": [...], "kinds": [...], "skipped": n, "newer": n}``:
    every event of the run in step order (``skipped``: records that do not
    parse; ``newer``: datums of a newer stored format, see
    :data:`metadata.PROTO_VERSION`).
``index.js``, ``static/<file>``
    the ES-module frontend; only files that ship in ``static/`` are served,
    so no path (``..``, encoded or not) can leave that folder.

Example:

>>> from tensorboard.plugins import base_plugin
>>> from tensorboard_plugin_adapt.plugin import AdaptPlugin
>>> plugin = AdaptPlugin(base_plugin.TBContext())
>>> sorted(plugin.get_plugin_apps())
['/events', '/index.js', '/runs', '/scalars', '/static/*']
>>> plugin.frontend_metadata().es_module_path, plugin.frontend_metadata().tab_name
('/index.js', 'Adapt')
"""

import os

from werkzeug import wrappers

from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin

from keras_adapt.record import metadata, reader

__all__ = ["AdaptLoader", "AdaptPlugin"]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
DEFAULT_MAX_POINTS = 1000
MAX_MAX_POINTS = 20000
#: Steps with events that TensorBoard keeps in memory unless the user sets
#: ``--samples_per_plugin adapt=N``. TensorBoard's default for third-party
#: plugins is 10 (reservoir-sampled), which would drop most events; 0 would
#: keep everything of arbitrarily long runs. (The ``adapt/*`` series are
#: scalars, sampled like every scalar: ``--samples_per_plugin scalars=N``.)
DEFAULT_SAMPLES_PER_TAG = 100_000

_CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".html": "text/html",
}


def _static_files():
    """Name -> absolute path of every file that ships in ``static/``."""
    try:
        names = os.listdir(STATIC_DIR)
    except OSError:
        return {}
    return {n: os.path.join(STATIC_DIR, n) for n in names
            if os.path.isfile(os.path.join(STATIC_DIR, n))}


def _json(request, body, code=200):
    return http_util.Respond(request, body, "application/json", code=code)


def _bad(request, message, code=400):
    return _json(request, {"error": message}, code=code)


class AdaptPlugin(base_plugin.TBPlugin):
    """Serves the "Adapt" tab: noise scale, batch size, lr, workers, throughput, sync strategy, events.

    It reads only through ``context.data_provider``: the ``adapt/*``
    scalars (TensorBoard's scalars plugin data, so the Scalars tab shows
    them too) and the ``adapt`` event records written by
    ``keras_adapt.record.summary`` and
    ``keras_adapt.callbacks.AdaptTensorBoard``.

    Example:

    >>> from tensorboard.plugins import base_plugin
    >>> from tensorboard_plugin_adapt.plugin import AdaptPlugin
    >>> AdaptPlugin(base_plugin.TBContext()).plugin_name
    'adapt'
    """

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context):
        self._provider = context.data_provider
        self._static = _static_files()

    def get_plugin_apps(self):
        return {
            "/runs": self._serve_runs,
            "/scalars": self._serve_scalars,
            "/events": self._serve_events,
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
        }

    def is_active(self):
        # TensorBoard enables the tab by itself when some run has "adapt"
        # plugin data (events); a run with only adapt/* series stores them
        # as plugin "scalars", which TensorBoard asks about here.
        return bool(reader.list_runs(self._provider, None, ""))

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Adapt")

    # -- data routes --------------------------------------------------------

    @staticmethod
    def _request_context(request):
        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    def _known_run(self, ctx, eid, run):
        return any(r["run"] == run for r in reader.list_runs(self._provider, ctx, eid))

    @wrappers.Request.application
    def _serve_runs(self, request):
        ctx, eid = self._request_context(request)
        runs = reader.list_runs(self._provider, ctx, eid)
        return _json(request, {"runs": runs, "kinds": list(metadata.EVENT_KINDS),
                               "kind_colors": dict(metadata.EVENT_COLORS),
                               "unknown_color": metadata.UNKNOWN_EVENT_COLOR,
                               "sync_strategies": list(metadata.SYNC_STRATEGIES),
                               "compressions": list(metadata.COMPRESSIONS)})

    @wrappers.Request.application
    def _serve_scalars(self, request):
        run = request.args.get("run")
        if run is None:
            return _bad(request, "missing query parameter 'run'; get the names from ./runs")
        raw = request.args.get("max_points", str(DEFAULT_MAX_POINTS))
        try:
            max_points = int(raw)
        except ValueError:
            max_points = -1
        if not 2 <= max_points <= MAX_MAX_POINTS:
            return _bad(request, f"max_points={raw!r} is not valid; use an int from 2 to "
                                 f"{MAX_MAX_POINTS}")
        tag = request.args.get("tag")
        ctx, eid = self._request_context(request)
        if not self._known_run(ctx, eid, run):
            return _bad(request, f"no adapt data for run {run!r}", code=404)
        totals = reader.read_series(self._provider, ctx, eid, run,
                                    tags=[tag] if tag else None)
        series = {t: reader.downsample(p, max_points) for t, p in totals.items()}
        return _json(request, {
            "run": run,
            "series": {t: [list(p) for p in pts] for t, pts in series.items()},
            "total": {t: len(p) for t, p in totals.items()},
        })

    @wrappers.Request.application
    def _serve_events(self, request):
        run = request.args.get("run")
        if run is None:
            return _bad(request, "missing query parameter 'run'; get the names from ./runs")
        ctx, eid = self._request_context(request)
        if not self._known_run(ctx, eid, run):
            return _bad(request, f"no adapt data for run {run!r}", code=404)
        events, skipped, newer = reader.read_events(self._provider, ctx, eid, run)
        kinds = sorted({e["kind"] for e in events})
        kind = request.args.get("kind")
        if kind:
            events = [e for e in events if e["kind"] == kind]
        return _json(request, {"run": run, "events": events, "kinds": kinds,
                               "skipped": skipped, "newer": newer})

    # -- static files ---------------------------------------------------------

    def _respond_file(self, request, name):
        path = self._static.get(name)
        if path is None:
            return http_util.Respond(request, "Not found", "text/plain", code=404)
        with open(path, "rb") as f:
            body = f.read()
        content_type = _CONTENT_TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        return http_util.Respond(request, body, content_type)

    @wrappers.Request.application
    def _serve_index(self, request):
        return self._respond_file(request, "index.js")

    @wrappers.Request.application
    def _serve_static(self, request):
        # Only a bare file name that ships in static/ is served: any other
        # path (../, an encoded %2e%2e, a backslash, a sub-folder) is a 404,
        # whatever the URL decoding did to it.
        marker = "/static/"
        path = request.path
        name = path[path.rfind(marker) + len(marker):] if marker in path else ""
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            return http_util.Respond(request, "Not found", "text/plain", code=404)
        return self._respond_file(request, name)


class AdaptLoader(base_plugin.TBLoader):
    """Loads :class:`AdaptPlugin` and keeps every step with events in TensorBoard's memory.

    TensorBoard keeps only 10 reservoir-sampled values per tag of a
    third-party plugin unless told otherwise, which would drop most
    adaptation events. Unless the user passed ``--samples_per_plugin
    adapt=N``, this loader raises it to :data:`DEFAULT_SAMPLES_PER_TAG`.
    This is the class the ``tensorboard_plugins`` entry point names.

    Example:

    >>> import argparse
    >>> from tensorboard_plugin_adapt.plugin import AdaptLoader
    >>> flags = argparse.Namespace(samples_per_plugin={})
    >>> AdaptLoader().fix_flags(flags)
    >>> flags.samples_per_plugin
    {'adapt': 100000}
    """

    def fix_flags(self, flags):
        samples = getattr(flags, "samples_per_plugin", None)
        if samples is None:
            samples = {}
            try:
                flags.samples_per_plugin = samples
            except AttributeError:
                return
        if isinstance(samples, dict):
            samples.setdefault(metadata.PLUGIN_NAME, DEFAULT_SAMPLES_PER_TAG)

    def load(self, context):
        return AdaptPlugin(context)
