"""The "adapt" schema: plugin names, tags, data classes, versions and the event record.

Both sides import this module: the writers (``summary.py`` and
``events.py``) and the readers (``reader.py``, ``runs.py``). Changing a name
here changes it everywhere. No TensorFlow import: TensorBoard loads the plugin
(and this module) in its own process.

Event record (one JSON object per line in ``<logdir>/adapt_events.jsonl``,
and the same object in TensorBoard under :data:`EVENTS_TAG`)::

    {"step": int, "epoch": int, "wall_time": float, "kind": str, "rank": int,
     "policy": str, "reason": str, "before": {...}, "after": {...}}

Stored format, version :data:`PROTO_VERSION` (the ``content`` of the
``adapt`` plugin data, an ASCII integer):

- the ``adapt/*`` series are ordinary TensorBoard scalars (plugin
  ``scalars``, data class SCALAR), so TensorBoard's own Scalars tab shows
  them too;
- the events of one step are ONE datum under :data:`EVENTS_TAG` (plugin
  ``adapt``, data class TENSOR): a 1-D string tensor, one JSON record per
  element. TensorBoard's data server keeps one datum per step and drops
  every earlier datum at that step or later when a datum arrives (its rule
  for restarted jobs), so a writer that gets more records for a step it
  has written writes the step again with all of its records, and the steps
  after it too. A reader applies the same rule (:func:`latest_datums`) and
  gets the same records from every TensorBoard loader.

Version 0 (keras-adapt before this format) wrote the series under plugin
``adapt`` and one record per datum; readers still read it.

Example:

>>> from keras_adapt.record import metadata
>>> e = metadata.make_event("batch_size", step=120, epoch=1, policy="GNSBatchSizePolicy",
...                         reason="gns 410 > 2 x 128", before={"batch_size": 128},
...                         after={"batch_size": 256}, wall_time=1.5)
>>> metadata.parse_event_line(metadata.event_to_json(e)) == e
True
>>> metadata.SCALAR_TAGS["gns"], metadata.step_time_tag(1)
('adapt/gns', 'adapt/step_time/rank_1')
"""

import json
import math
import numbers
import time

from keras_adapt.checks import invalid

__all__ = [
    "content_version", "create_summary_metadata", "event_to_json", "latest_datums",
    "make_event", "parse_event_line", "parse_system_tag", "parse_worker_time_tag",
    "step_time_tag", "system_key", "system_tag", "worker_time_key", "worker_time_tag",
]

PLUGIN_NAME = "adapt"
#: TensorBoard's own scalars plugin: the ``adapt/*`` series are written for it.
SCALARS_PLUGIN_NAME = "scalars"
#: Version of the stored format, written as the ``adapt`` plugin data's
#: content; bump it when the stored format changes. Readers read this
#: version and older ones and skip (counting them) datums of a newer one.
PROTO_VERSION = 1

TAG_PREFIX = "adapt/"
#: Logs key (docs/design.md#logs-keys) -> TensorBoard scalar tag.
SCALAR_TAGS = {
    key: TAG_PREFIX + key
    for key in ("gns", "batch_size", "lr", "workers", "throughput",
                "grad_sqr", "grad_var", "grad_snr", "sync_strategy", "compression", "staleness",
                "step_time", "comm_fraction", "samples", "progress")
}
#: Per-worker times of a step, in seconds (``WorkerTimingMonitor``): the
#: logs key of worker r's time t is ``<t>/rank_<r>`` (:func:`worker_time_key`)
#: and its tag ``adapt/<t>/rank_<r>`` (:func:`worker_time_tag`). compute_time
#: + wait_time = step_time; wait_time is the time in the collectives.
WORKER_TIMES = ("step_time", "compute_time", "wait_time")
WORKER_TIME_RANK = "/rank_"
STEP_TIME_TAG_PREFIX = TAG_PREFIX + "step_time" + WORKER_TIME_RANK
#: Host metrics of ``SystemMonitor``, each with its unit: the logs key of
#: host h's metric m is ``system/host_<h>/<m>`` (:func:`system_key`) and its
#: tag ``adapt/system/host_<h>/<m>`` (:func:`system_tag`).
SYSTEM_METRICS = {
    "cpu_percent": "% of all cores",
    "memory_percent": "% of memory",
    "net_in_mb_s": "MB/s",
    "net_out_mb_s": "MB/s",
    "gpu_percent": "% (mean over GPUs)",
    "gpu_memory_percent": "% (mean over GPUs)",
}
SYSTEM_KEY_PREFIX = "system/host_"
#: String tensor tag holding the JSON event records (data class TENSOR).
EVENTS_TAG = TAG_PREFIX + "events"
#: File name of the JSONL event log inside a run's log directory.
EVENTS_FILENAME = "adapt_events.jsonl"

#: The kinds that keras-adapt emits today. A kind is declared here when
#: code starts emitting it; readers show any other kind as "unknown".
EVENT_KINDS = ("batch_size", "lr", "resize", "resume", "sync_strategy", "straggler",
               "preemption", "checkpoint", "communication")
#: The colour of each declared kind's markers, in the Adapt tab (its runs
#: route serves them) and in the report; every kind of :data:`EVENT_KINDS`
#: has one.
EVENT_COLORS = {"batch_size": "#1f77b4", "lr": "#ff7f0e", "resize": "#2ca02c",
                "resume": "#bcbd22", "sync_strategy": "#17becf", "straggler": "#d62728",
                "preemption": "#9467bd", "checkpoint": "#8c564b", "communication": "#e377c2"}
#: The colour of any other kind (written by a newer keras-adapt).
UNKNOWN_EVENT_COLOR = "#7f7f7f"
#: The synchronisation strategies by the value of the strategy variable
#: (``keras_adapt.sync``): the ``adapt/sync_strategy`` series holds the index
#: of the strategy in use, and readers label it with these names.
SYNC_STRATEGIES = ("allreduce_sgd", "model_averaging", "local_sgd", "block_momentum",
                   "elastic_averaging", "pair_averaging")
#: What the gradients travel as, by the value of the compression switch
#: (``optimizer.adapt_state.compression``): the ``adapt/compression`` series
#: holds the index, and readers label it with these names.
COMPRESSIONS = ("none", "fp16")
EVENT_FIELDS = ("step", "epoch", "wall_time", "kind", "rank",
                "policy", "reason", "before", "after")

_FIELD_TYPES = {
    "step": "int", "epoch": "int", "rank": "int", "wall_time": "number",
    "kind": "str", "policy": "str", "reason": "str",
    "before": "dict", "after": "dict",
}


def event_color(kind):
    """The colour readers draw events of ``kind`` in.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.event_color("resize"), metadata.event_color("teleport")
    ('#2ca02c', '#7f7f7f')
    """
    return EVENT_COLORS.get(kind, UNKNOWN_EVENT_COLOR)


def step_time_tag(rank):
    """Tag of one worker's step-time series, e.g. ``adapt/step_time/rank_0``.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.step_time_tag(3)
    'adapt/step_time/rank_3'
    """
    return worker_time_tag("step_time", rank)


def worker_time_key(which, rank):
    """The logs key of worker ``rank``'s ``which`` (one of :data:`WORKER_TIMES`).

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.worker_time_key("wait_time", 1), metadata.worker_time_tag("compute_time", 0)
    ('wait_time/rank_1', 'adapt/compute_time/rank_0')
    """
    if which not in WORKER_TIMES:
        raise ValueError(f"which={which!r} is not a worker time; use one of "
                         f"{', '.join(WORKER_TIMES)}")
    return f"{which}{WORKER_TIME_RANK}{int(rank)}"


def worker_time_tag(which, rank):
    """The TensorBoard tag of worker ``rank``'s ``which``.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.worker_time_tag("wait_time", 3)
    'adapt/wait_time/rank_3'
    """
    return TAG_PREFIX + worker_time_key(which, rank)


def parse_worker_time_tag(tag):
    """``(which, rank)`` of a worker-time tag or logs key, or None for anything else.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.parse_worker_time_tag("adapt/wait_time/rank_2"), metadata.parse_worker_time_tag("adapt/step_time")
    (('wait_time', 2), None)
    """
    rest = tag[len(TAG_PREFIX):] if tag.startswith(TAG_PREFIX) else tag
    which, sep, rank = rest.partition(WORKER_TIME_RANK)
    if not sep or which not in WORKER_TIMES or not rank.isdigit():
        return None
    return which, int(rank)


def system_key(host, metric):
    """The logs key of host ``host``'s ``metric`` (one of :data:`SYSTEM_METRICS`).

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.system_key(0, "cpu_percent"), metadata.system_tag(0, "cpu_percent")
    ('system/host_0/cpu_percent', 'adapt/system/host_0/cpu_percent')
    """
    if metric not in SYSTEM_METRICS:
        raise ValueError(f"metric={metric!r} is not a system metric; use one of "
                         f"{', '.join(SYSTEM_METRICS)}")
    return f"{SYSTEM_KEY_PREFIX}{int(host)}/{metric}"


def system_tag(host, metric):
    """The TensorBoard tag of host ``host``'s ``metric``.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.system_tag(2, "memory_percent")
    'adapt/system/host_2/memory_percent'
    """
    return TAG_PREFIX + system_key(host, metric)


def parse_system_tag(tag):
    """``(host, metric)`` of a system tag or logs key, or None for anything else.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.parse_system_tag("adapt/system/host_3/net_in_mb_s"), metadata.parse_system_tag("adapt/gns")
    ((3, 'net_in_mb_s'), None)
    """
    rest = tag[len(TAG_PREFIX):] if tag.startswith(TAG_PREFIX) else tag
    if not rest.startswith(SYSTEM_KEY_PREFIX):
        return None
    host, _, metric = rest[len(SYSTEM_KEY_PREFIX):].partition("/")
    if not host.isdigit() or metric not in SYSTEM_METRICS:
        return None
    return int(host), metric

def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(field, value):
    kind = _FIELD_TYPES[field]
    ok = {
        "int": _is_int(value),
        "number": isinstance(value, numbers.Real) and not isinstance(value, bool)
        and math.isfinite(float(value)),
        "str": isinstance(value, str),
        "dict": isinstance(value, dict),
    }[kind]
    if not ok:
        raise invalid(
            f"adaptation event field {field!r}", value, "it must be "
            f"a{'n' if kind == 'int' else ''} {kind}"
        )


def _plain(value):
    """JSON-safe copy: numpy scalars become python numbers, tuples lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if _is_int(value):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else str(f)
    return str(value)


def make_event(kind, step, epoch, policy, reason, before, after, rank=0, wall_time=None):
    """Builds a validated event record (a plain dict with :data:`EVENT_FIELDS`).

    ``kind`` must be one of :data:`EVENT_KINDS`; a ``ValueError`` names any
    bad field. ``before``/``after`` are made JSON-safe (numpy numbers become
    python numbers, non-finite floats strings).

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.make_event("batch_size", 10, 0, "p", "r", {"batch_size": 32},
    ...                     {"batch_size": 64})["after"]
    {'batch_size': 64}
    >>> metadata.make_event("teleport", 10, 0, "p", "r", {}, {})
    Traceback (most recent call last):
    ...
    ValueError: adaptation event kind='teleport' is unknown; use one of ...
    """
    if kind not in EVENT_KINDS:
        raise ValueError(
            f"adaptation event kind={kind!r} is unknown; use one of {', '.join(EVENT_KINDS)}"
        )
    event = {
        "step": step, "epoch": epoch,
        "wall_time": time.time() if wall_time is None else wall_time,
        "kind": kind, "rank": rank, "policy": policy, "reason": reason,
        "before": _plain(before), "after": _plain(after),
    }
    for field in EVENT_FIELDS:
        _check(field, event[field])
    event["step"], event["epoch"], event["rank"] = int(step), int(epoch), int(rank)
    event["wall_time"] = float(event["wall_time"])
    return event


def event_to_json(event):
    """One line of JSON (no newline) for ``event``, keys in schema order.

    Example:

    >>> from keras_adapt.record import metadata
    >>> e = metadata.make_event("lr", 1, 0, "p", "r", {}, {}, wall_time=2.0)
    >>> metadata.event_to_json(e)[:30]
    '{"step": 1, "epoch": 0, "wall_'
    """
    return json.dumps({k: event[k] for k in EVENT_FIELDS}, allow_nan=False)


def parse_event_line(line):
    """Parses one stored event, tolerating damage; returns a dict or None.

    Readers must never fail on a bad record: a line that is not a JSON
    object, or lacks ``step`` or ``kind``, gives None. Missing optional
    fields get defaults. Unknown kinds are kept as they are (a newer writer
    may know more kinds); readers show them as such.

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.parse_event_line('{"step": 3, "kind": "teleport"}')["kind"]
    'teleport'
    >>> metadata.parse_event_line('{"step": 3, "ki') is None
    True
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not _is_int(obj.get("step")) or not isinstance(obj.get("kind"), str):
        return None
    out = {
        "step": int(obj["step"]),
        "epoch": obj["epoch"] if _is_int(obj.get("epoch")) else -1,
        "wall_time": float(obj["wall_time"]) if isinstance(obj.get("wall_time"), (int, float))
        and not isinstance(obj.get("wall_time"), bool) else 0.0,
        "kind": obj["kind"],
        "rank": obj["rank"] if _is_int(obj.get("rank")) else 0,
        "policy": obj["policy"] if isinstance(obj.get("policy"), str) else "",
        "reason": obj["reason"] if isinstance(obj.get("reason"), str) else "",
        "before": obj["before"] if isinstance(obj.get("before"), dict) else {},
        "after": obj["after"] if isinstance(obj.get("after"), dict) else {},
    }
    return out


def content_version(content):
    """The format version stored in an ``adapt`` plugin-data ``content``; None if unreadable.

    An empty content counts as version 0 (the first format).

    Example:

    >>> from keras_adapt.record import metadata
    >>> metadata.content_version(b"1"), metadata.content_version(b""), metadata.content_version(b"x")
    (1, 0, None)
    """
    if isinstance(content, str):
        content = content.encode("utf-8", errors="replace")
    if not isinstance(content, (bytes, bytearray)):
        return None
    text = bytes(content).strip()
    if not text:
        return 0
    if not text.isdigit():
        return None
    return int(text)


def latest_datums(datums):
    """The datums a TensorBoard data server keeps: each one drops the earlier ones at its step or later.

    ``datums`` are objects with a ``step`` (TensorBoard's ``TensorDatum``)
    in the order they were written, as TensorBoard's Python loader returns
    them; its data server has applied this rule already, so this returns
    its answer unchanged. The result is in step order, one datum per step.

    Example:

    >>> import collections
    >>> from keras_adapt.record import metadata
    >>> D = collections.namedtuple("D", "step name")
    >>> [d.name for d in metadata.latest_datums([D(5, "a"), D(9, "b"), D(5, "a+c"), D(7, "d")])]
    ['a+c', 'd']
    """
    kept = []
    for datum in datums:
        while kept and kept[-1].step >= datum.step:
            kept.pop()
        kept.append(datum)
    return kept


def create_summary_metadata(data_class="scalar", description=""):
    """A ``SummaryMetadata`` proto for one ``adapt/*`` series or for the event records.

    ``data_class="scalar"``: an ordinary TensorBoard scalar (plugin
    ``scalars``), so it also appears in TensorBoard's Scalars tab.
    ``data_class="tensor"``: the event records (plugin ``adapt``, content
    :data:`PROTO_VERSION`).

    Example:

    >>> from keras_adapt.record import metadata
    >>> md = metadata.create_summary_metadata("scalar")
    >>> md.plugin_data.plugin_name, md.data_class
    ('scalars', 1)
    >>> md = metadata.create_summary_metadata("tensor")
    >>> md.plugin_data.plugin_name, md.plugin_data.content, md.data_class
    ('adapt', b'1', 2)
    """
    from tensorboard.compat.proto import summary_pb2

    if data_class == "scalar":
        from tensorboard.plugins.scalar import metadata as scalar_metadata

        md = scalar_metadata.create_summary_metadata(display_name="", description=description)
        md.data_class = summary_pb2.DATA_CLASS_SCALAR
        return md
    if data_class != "tensor":
        raise invalid("data_class", data_class, "use 'scalar' or 'tensor'")
    return summary_pb2.SummaryMetadata(
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=str(PROTO_VERSION).encode()
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
