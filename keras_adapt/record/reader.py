"""Reading "adapt" data through a TensorBoard data provider.

The plugin's HTTP routes and ``keras-adapt report`` both read through these
functions (``ctx`` may be None outside a request), so the tab and the static
report show the same numbers. They take any
``tensorboard.data.provider.DataProvider`` -- TensorBoard's Python
``MultiplexerDataProvider`` or the gRPC provider of its Rust data server
(``--load_fast``) -- give the same answer from both, and never fail on
damaged data: a run whose data cannot be read yields empty results, never
an exception that would take the other runs down with it.

The ``adapt/*`` series are read from TensorBoard's scalars plugin (format
version 1) and from the ``adapt`` plugin (version 0). Event datums of a
format newer than :data:`metadata.PROTO_VERSION` are skipped and counted.

Example:

>>> from keras_adapt.record import reader
>>> pts = [(s, 0.0, float(s % 7)) for s in range(5000)]
>>> small = reader.downsample(pts, 200)
>>> len(small) <= 200, small[0] == pts[0], small[-1] == pts[-1]
(True, True, True)
"""

import json
import logging
import math

from keras_adapt.checks import check_int
from keras_adapt.record import metadata

__all__ = ["annotate", "downsample", "list_runs", "read_events", "read_series",
           "shows_sync_strategy", "sync_strategy_name"]

_SCALARS, _ADAPT = metadata.SCALARS_PLUGIN_NAME, metadata.PLUGIN_NAME

logger = logging.getLogger(__name__)

#: Ask the data provider for every stored point; downsampling happens here,
#: where it can keep the first and last points and each bucket's extremes.
_READ_ALL = 10_000_000


def _context(ctx):
    """``ctx``, or an empty request context (what a local, offline reader has)."""
    if ctx is not None:
        return ctx
    from tensorboard import context as tb_context

    return tb_context.RequestContext()


def _finite_or_none(value):
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def downsample(points, max_points):
    """Reduces ``points`` to at most ``max_points``, keeping their shape.

    ``points`` are ``(step, wall_time, value)`` tuples in step order (value
    may be None). The first and last points are always kept; the points in
    between are cut into equal buckets and each bucket keeps its minimum
    and maximum (in step order), so spikes and the steps of a step line
    survive. Deterministic, O(n).

    Example:

    >>> from keras_adapt.record.reader import downsample
    >>> downsample([(0, 0, 1.0), (1, 0, 5.0), (2, 0, 2.0)], 10)
    [(0, 0, 1.0), (1, 0, 5.0), (2, 0, 2.0)]
    >>> [p[0] for p in downsample([(s, 0, float(s == 50)) for s in range(101)], 4)]
    [0, 1, 50, 100]
    """
    check_int("max_points", max_points, 2)
    n = len(points)
    if n <= max_points:
        return list(points)
    first, last, inner = points[0], points[-1], points[1:-1]
    buckets = max(1, (max_points - 2) // 2)
    out = [first]
    for b in range(buckets):
        lo = b * len(inner) // buckets
        hi = (b + 1) * len(inner) // buckets
        if lo >= hi:
            continue
        chunk = range(lo, hi)
        valued = [i for i in chunk if inner[i][2] is not None]
        if not valued:
            out.append(inner[lo])
            continue
        i_min = min(valued, key=lambda i: inner[i][2])
        i_max = max(valued, key=lambda i: inner[i][2])
        for i in sorted({i_min, i_max}):
            out.append(inner[i])
    out.append(last)
    # One bucket may keep two points; with an odd budget trim the surplus
    # from the middle rather than the ends.
    while len(out) > max_points:
        del out[len(out) // 2]
    return out


def _list(provider, method, ctx, experiment_id, plugin_name, run=None):
    """``provider.list_scalars``/``list_tensors`` as ``{run: {tag: time series}}``; {} on failure."""
    from tensorboard.data import provider as tb_provider

    kwargs = {}
    if run is not None:
        kwargs["run_tag_filter"] = tb_provider.RunTagFilter(runs=[run])
    try:
        return getattr(provider, method)(ctx, experiment_id=experiment_id,
                                         plugin_name=plugin_name, **kwargs) or {}
    except Exception:  # noqa: BLE001 - one bad run must not hide the others
        logger.exception("adapt: %s(plugin_name=%r) failed", method, plugin_name)
        return {}


def _readable(series):
    """The format version of an ``adapt`` time series, if this reader knows it; else None."""
    version = metadata.content_version(getattr(series, "plugin_content", b""))
    return version if version is not None and version <= metadata.PROTO_VERSION else None


def _scalar_tags(provider, ctx, experiment_id, run=None):
    """``{run: {tag: plugin_name}}`` of the ``adapt/*`` series (the scalars plugin wins)."""
    out = {}
    for r, tags in _list(provider, "list_scalars", ctx, experiment_id, _ADAPT, run).items():
        for tag, series in tags.items():
            if _readable(series) is not None:
                out.setdefault(r, {})[tag] = _ADAPT
    for r, tags in _list(provider, "list_scalars", ctx, experiment_id, _SCALARS, run).items():
        for tag in tags:
            if tag.startswith(metadata.TAG_PREFIX):
                out.setdefault(r, {})[tag] = _SCALARS
    return out


def list_runs(provider, ctx, experiment_id):
    """Runs with adapt data: ``[{"run", "tags", "events"}]`` sorted by run name.

    ``tags`` are the run's ``adapt/*`` scalar tags; ``events`` tells whether
    it has event records.

    Example:

    >>> from keras_adapt.record import reader
    >>> reader.list_runs(None, None, "")
    []
    """
    if provider is None:
        return []
    ctx = _context(ctx)
    runs = {}
    for run, tags in _scalar_tags(provider, ctx, experiment_id).items():
        runs[run] = {"run": run, "tags": sorted(tags), "events": False}
    for run, tags in _list(provider, "list_tensors", ctx, experiment_id, _ADAPT).items():
        if metadata.EVENTS_TAG in tags:
            runs.setdefault(run, {"run": run, "tags": [], "events": False})["events"] = True
    return [runs[r] for r in sorted(runs)]


def read_series(provider, ctx, experiment_id, run, tags=None, max_points=None):
    """The run's ``adapt/*`` scalar series: ``{tag: [(step, wall_time, value)]}``.

    Non-finite values become None. With ``max_points`` each series is
    :func:`downsample`-d. ``tags`` limits the result to those tags.

    Example:

    >>> from keras_adapt.record import reader
    >>> reader.read_series(None, None, "", "run")
    {}
    """
    if provider is None:
        return {}
    from tensorboard.data import provider as tb_provider

    ctx = _context(ctx)
    by_plugin = {}
    for tag, plugin_name in _scalar_tags(provider, ctx, experiment_id, run).get(run, {}).items():
        if tags is None or tag in tags:
            by_plugin.setdefault(plugin_name, []).append(tag)
    out = {}
    # Old (plugin "adapt") first: a run continued by a newer writer keeps
    # both, the newer points winning at the same step.
    for plugin_name in (_ADAPT, _SCALARS):
        if plugin_name not in by_plugin:
            continue
        try:
            data = provider.read_scalars(
                ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                downsample=_READ_ALL,
                run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=by_plugin[plugin_name]),
            )
        except Exception:  # noqa: BLE001 - damaged data gives an empty run, not an error
            logger.exception("adapt: reading scalars of run %r failed", run)
            continue
        for tag, datums in (data.get(run) or {}).items():
            points = out.setdefault(tag, {})
            for d in datums:
                points[int(d.step)] = (int(d.step), float(d.wall_time), _finite_or_none(d.value))
    result = {}
    for tag, points in out.items():
        pts = [points[s] for s in sorted(points)]
        result[tag] = downsample(pts, max_points) if max_points else pts
    return result


def _records(array):
    """The strings of a string tensor's numpy value (any shape); None if it holds no strings."""
    try:
        if not hasattr(array, "reshape"):
            items = [array]
        elif getattr(array, "dtype", None) is not None and array.dtype.kind not in "OSU":
            return None
        else:
            items = array.reshape(-1).tolist()
    except Exception:  # noqa: BLE001
        return None
    if not all(isinstance(item, (bytes, str)) for item in items):
        return None
    return items


def read_events(provider, ctx, experiment_id, run):
    """The run's adaptation events (dicts, sorted by step) and what was skipped.

    Returns ``(events, skipped, newer)``. Of each step's datums only the
    last one written counts (:func:`metadata.latest_datums`; format
    version 1 writes all records of a step into it), so TensorBoard's
    Python loader and its Rust data server give the same events; datums of
    version 0 (one record each) all count. Identical records (wall time
    included) count once. ``skipped`` counts records and datums that do not
    parse; ``newer`` counts datums of a format newer than this reader
    (upgrade keras-adapt to read them). Unknown kinds are kept and marked
    ``"known": False``.

    Example:

    >>> from keras_adapt.record import reader
    >>> reader.read_events(None, None, "", "run")
    ([], 0, 0)
    """
    if provider is None:
        return [], 0, 0
    from tensorboard.data import provider as tb_provider

    ctx = _context(ctx)
    listed = _list(provider, "list_tensors", ctx, experiment_id, _ADAPT, run).get(run, {})
    series = listed.get(metadata.EVENTS_TAG)
    if series is None:
        return [], 0, 0
    try:
        data = provider.read_tensors(
            ctx, experiment_id=experiment_id, plugin_name=_ADAPT,
            downsample=_READ_ALL,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=[metadata.EVENTS_TAG]),
        )
    except Exception:  # noqa: BLE001
        logger.exception("adapt: reading events of run %r failed", run)
        return [], 0, 0
    datums = list((data.get(run) or {}).get(metadata.EVENTS_TAG, []))
    version = metadata.content_version(series.plugin_content)
    if version is None or version > metadata.PROTO_VERSION:
        logger.warning(
            "adapt: run %r holds %d event datum(s) of format %r, which this reader "
            "(format %d) does not know; upgrade keras-adapt where TensorBoard runs to "
            "read them", run, len(datums), series.plugin_content, metadata.PROTO_VERSION)
        return [], 0, len(datums)
    if version >= 1:
        datums = metadata.latest_datums(datums)
    events, skipped, seen = [], 0, set()
    for datum in datums:
        texts = _records(datum.numpy)
        if texts is None:
            skipped += 1
            continue
        for text in texts:
            event = metadata.parse_event_line(text)
            if event is None:
                skipped += 1
                continue
            key = json.dumps(event, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            events.append(annotate(event))
    events.sort(key=lambda e: (e["step"], e["wall_time"]))
    return events, skipped, 0


def annotate(event):
    """Adds ``"known"`` (is the kind in :data:`metadata.EVENT_KINDS`) to an event.

    Example:

    >>> from keras_adapt.record.reader import annotate
    >>> annotate({"kind": "teleport"})["known"]
    False
    """
    event = dict(event)
    event["known"] = event.get("kind") in metadata.EVENT_KINDS
    return event


def sync_strategy_name(value):
    """The name of the strategy whose index is ``value`` (a point of ``adapt/sync_strategy``).

    An index that :data:`metadata.SYNC_STRATEGIES` does not know (a newer
    keras-adapt) is named ``"unknown (i)"``, never dropped.

    Example:

    >>> from keras_adapt.record.reader import sync_strategy_name
    >>> sync_strategy_name(2.0), sync_strategy_name(9.0)
    ('local_sgd', 'unknown (9)')
    """
    index = int(round(float(value)))
    if 0 <= index < len(metadata.SYNC_STRATEGIES):
        return metadata.SYNC_STRATEGIES[index]
    return f"unknown ({index})"


def shows_sync_strategy(points, events):
    """Whether a run gets a "sync strategy" chart: the Adapt tab's and the report's rule.

    ``points`` are the run's ``adapt/sync_strategy`` points ``(step,
    wall_time, value)`` (empty without the series), ``events`` its event
    records. A chart needs the series, and tells something only when some
    strategy other than AllReduceSGD was in use or the run recorded a
    ``sync_strategy`` event: a plain synchronous-SGD run gets none. (The
    tab's ``static/index.js`` applies the same rule to the same data.)

    Example:

    >>> from keras_adapt.record.reader import shows_sync_strategy
    >>> plain = [(0, 0.0, 0.0), (10, 0.0, 0.0)]
    >>> shows_sync_strategy(plain, []), shows_sync_strategy(plain + [(20, 0.0, 2.0)], [])
    (False, True)
    >>> shows_sync_strategy(plain, [{"kind": "sync_strategy"}]), shows_sync_strategy([], [{"kind": "sync_strategy"}])
    (True, False)
    """
    return _shows_choices(points, events, metadata.SYNC_STRATEGIES.index("allreduce_sgd"),
                          "sync_strategy")


def shows_compression(points, events):
    """Whether a run gets a "compression" chart: the Adapt tab's rule.

    ``points`` are the run's ``adapt/compression`` points ``(step,
    wall_time, value)`` (written once a ``CommunicationPolicy`` or a
    ``GradientCompression`` enabled the switch), ``events`` its event
    records. A chart needs the series, and tells something only when float16
    was in use or the run recorded a ``communication`` event. (The tab's
    ``static/index.js`` applies the same rule to the same data.)

    Example:

    >>> from keras_adapt.record.reader import shows_compression
    >>> none = [(0, 0.0, 0.0), (10, 0.0, 0.0)]
    >>> shows_compression(none, []), shows_compression(none + [(20, 0.0, 1.0)], [])
    (False, True)
    >>> shows_compression(none, [{"kind": "communication"}]), shows_compression([], [{"kind": "communication"}])
    (True, False)
    """
    return _shows_choices(points, events, metadata.COMPRESSIONS.index("none"), "communication")


def _shows_choices(points, events, plain, kind):
    """A chart of a series of choices tells something when a value other
    than ``plain`` is in it or an event of ``kind`` happened (it needs points)."""
    values = [v for _, _, v in points if v is not None]
    if not values:
        return False
    return any(v != plain for v in values) or any(e.get("kind") == kind for e in events)
