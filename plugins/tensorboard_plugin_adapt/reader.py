"""Reading "adapt" data through a TensorBoard data provider.

The plugin's HTTP routes and ``keras-adapt report`` both read through these
functions (``ctx`` may be None outside a request), so the tab and the static report show the same numbers. They
take any ``tensorboard.data.provider.DataProvider`` (TensorBoard's own
``MultiplexerDataProvider`` in practice) and never fail on damaged data: a
run whose data cannot be read yields empty results, never an exception that
would take the other runs down with it.

Example:

>>> from tensorboard_plugin_adapt import reader
>>> pts = [(s, 0.0, float(s % 7)) for s in range(5000)]
>>> small = reader.downsample(pts, 200)
>>> len(small) <= 200, small[0] == pts[0], small[-1] == pts[-1]
(True, True, True)
"""

import logging
import math

from tensorboard_plugin_adapt import metadata

__all__ = ["annotate", "downsample", "list_runs", "read_events", "read_series"]

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

    >>> from tensorboard_plugin_adapt.reader import downsample
    >>> downsample([(0, 0, 1.0), (1, 0, 5.0), (2, 0, 2.0)], 10)
    [(0, 0, 1.0), (1, 0, 5.0), (2, 0, 2.0)]
    >>> [p[0] for p in downsample([(s, 0, float(s == 50)) for s in range(101)], 4)]
    [0, 1, 50, 100]
    """
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 2:
        raise ValueError(f"max_points={max_points!r} is not valid; use an int >= 2")
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


def list_runs(provider, ctx, experiment_id):
    """Runs with adapt data: ``[{"run", "tags", "events"}]`` sorted by run name.

    ``tags`` are the run's ``adapt/*`` scalar tags; ``events`` tells whether
    it has event records.

    Example:

    >>> from tensorboard_plugin_adapt import reader
    >>> reader.list_runs(None, None, "")
    []
    """
    if provider is None:
        return []
    ctx = _context(ctx)
    runs = {}
    try:
        scalars = provider.list_scalars(ctx, experiment_id=experiment_id,
                                        plugin_name=metadata.PLUGIN_NAME)
    except Exception:  # noqa: BLE001 - one bad run must not hide the others
        logger.exception("adapt: listing scalars failed")
        scalars = {}
    try:
        tensors = provider.list_tensors(ctx, experiment_id=experiment_id,
                                        plugin_name=metadata.PLUGIN_NAME)
    except Exception:  # noqa: BLE001
        logger.exception("adapt: listing tensors failed")
        tensors = {}
    for run, tags in scalars.items():
        runs.setdefault(run, {"run": run, "tags": [], "events": False})["tags"] = sorted(tags)
    for run, tags in tensors.items():
        if metadata.EVENTS_TAG in tags:
            runs.setdefault(run, {"run": run, "tags": [], "events": False})["events"] = True
    return [runs[r] for r in sorted(runs)]


def read_series(provider, ctx, experiment_id, run, tags=None, max_points=None):
    """The run's ``adapt/*`` scalar series: ``{tag: [(step, wall_time, value)]}``.

    Non-finite values become None. With ``max_points`` each series is
    :func:`downsample`-d. ``tags`` limits the result to those tags.

    Example:

    >>> from tensorboard_plugin_adapt import reader
    >>> reader.read_series(None, None, "", "run")
    {}
    """
    if provider is None:
        return {}
    from tensorboard.data import provider as tb_provider

    ctx = _context(ctx)
    try:
        data = provider.read_scalars(
            ctx, experiment_id=experiment_id, plugin_name=metadata.PLUGIN_NAME,
            downsample=_READ_ALL,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=tags),
        )
    except Exception:  # noqa: BLE001 - damaged data gives an empty run, not an error
        logger.exception("adapt: reading scalars of run %r failed", run)
        return {}
    out = {}
    for tag, datums in (data.get(run) or {}).items():
        points = sorted(((int(d.step), float(d.wall_time), _finite_or_none(d.value))
                         for d in datums), key=lambda p: (p[0], p[1]))
        out[tag] = downsample(points, max_points) if max_points else points
    return out


def _records(array):
    """Yields the strings of a string tensor's numpy value (any shape)."""
    try:
        items = array.reshape(-1).tolist() if hasattr(array, "reshape") else [array]
    except Exception:  # noqa: BLE001
        return
    for item in items:
        if isinstance(item, (bytes, str)):
            yield item


def read_events(provider, ctx, experiment_id, run):
    """The run's adaptation events (dicts, sorted by step), and how many were skipped.

    Returns ``(events, skipped)``. Records that do not parse are counted in
    ``skipped``; unknown kinds are kept and marked ``"known": False``.

    Example:

    >>> from tensorboard_plugin_adapt import reader
    >>> reader.read_events(None, None, "", "run")
    ([], 0)
    """
    if provider is None:
        return [], 0
    from tensorboard.data import provider as tb_provider

    ctx = _context(ctx)
    try:
        data = provider.read_tensors(
            ctx, experiment_id=experiment_id, plugin_name=metadata.PLUGIN_NAME,
            downsample=_READ_ALL,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=[metadata.EVENTS_TAG]),
        )
    except Exception:  # noqa: BLE001
        logger.exception("adapt: reading events of run %r failed", run)
        return [], 0
    events, skipped = [], 0
    for datum in (data.get(run) or {}).get(metadata.EVENTS_TAG, []):
        parsed_any = False
        for text in _records(datum.numpy):
            event = metadata.parse_event_line(text)
            if event is None:
                skipped += 1
                continue
            parsed_any = True
            events.append(annotate(event))
        if not parsed_any and not list(_records(datum.numpy)):
            skipped += 1
    events.sort(key=lambda e: (e["step"], e["wall_time"]))
    return events, skipped


def annotate(event):
    """Adds ``"known"`` (is the kind in :data:`metadata.EVENT_KINDS`) to an event.

    Example:

    >>> from tensorboard_plugin_adapt.reader import annotate
    >>> annotate({"kind": "teleport"})["known"]
    False
    """
    event = dict(event)
    event["known"] = event.get("kind") in metadata.EVENT_KINDS
    return event
