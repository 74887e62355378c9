"""Writing "adapt" data with ``tf.summary``: scalars, step times, event records.

Like TensorBoard's own ``summary_v2`` modules, every function writes to the
default summary writer (``with writer.as_default(): ...``) and returns True
when something was written (False when no default writer is set). The
plugin metadata comes from :mod:`keras_adapt.record.metadata`, so the
reader in ``reader.py`` finds exactly what is written here.

The series are ordinary TensorBoard scalars (they also appear in the
Scalars tab). Events are written per step, all records of a step in one
datum (:func:`events`); :class:`EventWriter` keeps that true when records of
one step arrive at different times.

Example:

>>> import os, tempfile
>>> import tensorflow as tf
>>> from keras_adapt.record import summary
>>> d = tempfile.mkdtemp()
>>> with tf.summary.create_file_writer(d).as_default():
...     summary.scalar("gns", 412.5, step=10)
...     summary.step_time(1, 0.031, step=10)
...     summary.events([{"step": 10, "epoch": 0, "wall_time": 1.0, "kind": "lr",
...                      "rank": 0, "policy": "demo", "reason": "r",
...                      "before": {"lr": 0.1}, "after": {"lr": 0.2}}])
True
True
True
>>> any(f.startswith("events.out.tfevents") for f in os.listdir(d))
True
"""

import math
import threading

import tensorflow as tf

from keras_adapt.checks import invalid
from keras_adapt.record import metadata

__all__ = ["EventWriter", "events", "is_writable_number", "scalar", "step_time"]


def _result(written):
    """A python bool in eager mode; the boolean tensor inside a ``tf.function``."""
    return bool(written) if tf.executing_eagerly() else written


def _tag(name):
    """``"gns"`` -> ``"adapt/gns"``; a full ``adapt/...`` tag passes through."""
    if not isinstance(name, str) or not name:
        raise invalid(
            "name", name, "use a logs key such as "
            f"{', '.join(sorted(metadata.SCALAR_TAGS))} or a tag starting with "
            f"{metadata.TAG_PREFIX!r}"
        )
    if name in metadata.SCALAR_TAGS:
        return metadata.SCALAR_TAGS[name]
    if name.startswith(metadata.TAG_PREFIX):
        return name
    raise ValueError(
        f"name={name!r} is not an adapt series; use one of "
        f"{', '.join(sorted(metadata.SCALAR_TAGS))} or a tag starting with "
        f"{metadata.TAG_PREFIX!r}"
    )


def scalar(name, data, step=None, description=None):
    """Writes one point of an ``adapt/*`` series as a TensorBoard scalar.

    Args:
        name: a logs key (``"gns"``, ``"batch_size"``, ``"lr"``, ...; see
            :data:`metadata.SCALAR_TAGS`) or a full tag such as
            ``"adapt/step_time/rank_0"``.
        data: a real number (python, numpy or a scalar tensor).
        step: the step; None uses ``tf.summary.experimental.get_step()``.
        description: optional text shown with the series.

    Returns:
        True if written, False if there is no default writer (a boolean
        tensor inside a ``tf.function``).

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from keras_adapt.record import summary
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     summary.scalar("batch_size", 256, step=3)
    True
    """
    tag = _tag(name)
    md = metadata.create_summary_metadata("scalar", description or "")
    with tf.name_scope("adapt_scalar"):
        value = tf.cast(tf.convert_to_tensor(data), tf.float32)
        if value.shape.rank not in (None, 0):
            raise ValueError(f"data for {tag!r} must be a scalar, got shape {value.shape}")
        return _result(tf.summary.write(tag=tag, tensor=value, step=step, metadata=md))


def step_time(rank, seconds, step=None):
    """Writes one worker's mean step time (seconds) as ``adapt/step_time/rank_<rank>``.

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from keras_adapt.record import summary
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     summary.step_time(0, 0.05, step=7)
    True
    """
    return scalar(metadata.step_time_tag(rank), seconds, step=step)


def _check_record(record):
    if not isinstance(record, dict) or not all(f in record for f in metadata.EVENT_FIELDS):
        raise ValueError(
            f"record={record!r} is not an adaptation event; build it with "
            "keras_adapt.record.events.emit(...) or metadata.make_event(...)"
        )
    return metadata.event_to_json(record)


def events(records, step=None):
    """Writes the adaptation events of ONE step as one datum under :data:`metadata.EVENTS_TAG`.

    ``records`` are dicts with the fields of :data:`metadata.EVENT_FIELDS`
    (as returned by ``keras_adapt.record.events.emit`` or ``metadata.make_event``),
    stored as a 1-D string tensor of JSON records (data class TENSOR).
    ``step`` defaults to the records' own step, which they must then share.

    TensorBoard keeps one datum per step (its data server drops the earlier
    datum), so pass ALL the records of the step at once; to add records to
    a step already written, write it again with all of them, or let
    :class:`EventWriter` do it.

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from keras_adapt.record import metadata, summary
    >>> a = metadata.make_event("batch_size", 40, 1, "demo", "gns grew", {"batch_size": 32},
    ...                         {"batch_size": 64})
    >>> b = metadata.make_event("lr", 40, 1, "demo", "batch 32 -> 64", {"lr": 0.1}, {"lr": 0.2})
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     summary.events([a, b])
    True
    """
    if isinstance(records, dict) or not isinstance(records, (list, tuple)) or not records:
        raise invalid(
            "records", records, "pass a non-empty list of event records "
            "(all of one step)"
        )
    texts = [_check_record(r) for r in records]
    if step is None:
        steps = sorted({int(r["step"]) for r in records})
        if len(steps) != 1:
            raise ValueError(
                f"the records have steps {steps}; one datum holds one step's records: "
                "write each step separately (or use EventWriter)"
            )
        step = steps[0]
    md = metadata.create_summary_metadata("tensor", "keras-adapt adaptation events (JSON)")
    return _result(tf.summary.write(
        tag=metadata.EVENTS_TAG,
        tensor=tf.constant(texts, dtype=tf.string),
        step=step,
        metadata=md,
    ))


class EventWriter:
    """Collects adaptation events and writes them so that every one of them reaches TensorBoard.

    :meth:`add` files a record under its step; :meth:`write` (inside ``with
    writer.as_default():``) writes every step that changed since the last
    write as one datum holding ALL its records, and every later step again
    as well: TensorBoard's data server drops the datums at or after a step
    when that step is written again. Identical records (same JSON text,
    wall time included) are kept once, so the same record may be added from
    several sources (a listener and ``adapt_events.jsonl``). Thread-safe.

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from keras_adapt.record import metadata, summary
    >>> w = summary.EventWriter()
    >>> w.add(metadata.make_event("batch_size", 8, 0, "p", "r", {}, {}))
    True
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     first = w.write()
    ...     _ = w.add(metadata.make_event("lr", 8, 0, "p", "r", {}, {}))
    ...     second = w.write()
    >>> first, second  # step 8 written again, now with both records
    ([8], [8])
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._by_step = {}  # step -> JSON texts, in arrival order
        self._records = {}  # JSON text -> record
        self._dirty = None  # lowest step changed since the last write

    def add(self, record):
        """Files ``record`` under its step; False if the identical record is already there."""
        text = _check_record(record)
        step = int(record["step"])
        with self._lock:
            if text in self._records:
                return False
            self._records[text] = record
            self._by_step.setdefault(step, []).append(text)
            self._dirty = step if self._dirty is None else min(self._dirty, step)
            return True

    def write(self):
        """Writes the changed steps (and the steps after them); returns the steps written.

        Needs a default summary writer; nothing is marked written otherwise.
        """
        with self._lock:
            if self._dirty is None:
                return []
            steps = sorted(s for s in self._by_step if s >= self._dirty)
            batches = [(s, [self._records[t] for t in self._by_step[s]]) for s in steps]
            written = []
            for step, records in batches:
                if not events(records, step=step):
                    return written
                written.append(step)
            self._dirty = None
            return written


def is_writable_number(value):
    """True for a finite real number (NaN/inf points are not written).

    Example:

    >>> from keras_adapt.record.summary import is_writable_number
    >>> is_writable_number(3), is_writable_number(float("inf")), is_writable_number(None)
    (True, False, False)
    """
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
