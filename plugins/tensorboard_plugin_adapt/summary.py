"""Writing "adapt" data with ``tf.summary``: scalars, step times, event records.

Like TensorBoard's own ``summary_v2`` modules, every function writes to the
default summary writer (``with writer.as_default(): ...``) and returns True
when something was written (False when no default writer is set). The
plugin metadata comes from :mod:`tensorboard_plugin_adapt.metadata`, so the
reader in ``plugin.py`` finds exactly what is written here.

Example:

>>> import os, tempfile
>>> import tensorflow as tf
>>> from tensorboard_plugin_adapt import summary
>>> d = tempfile.mkdtemp()
>>> with tf.summary.create_file_writer(d).as_default():
...     summary.scalar("gns", 412.5, step=10)
...     summary.step_time(1, 0.031, step=10)
...     summary.event({"step": 10, "epoch": 0, "wall_time": 1.0, "kind": "lr",
...                    "rank": 0, "policy": "demo", "reason": "r",
...                    "before": {"lr": 0.1}, "after": {"lr": 0.2}})
True
True
True
>>> any(f.startswith("events.out.tfevents") for f in os.listdir(d))
True
"""

import math

import tensorflow as tf

from tensorboard_plugin_adapt import metadata

__all__ = ["event", "is_writable_number", "scalar", "step_time"]


def _result(written):
    """A python bool in eager mode; the boolean tensor inside a ``tf.function``."""
    return bool(written) if tf.executing_eagerly() else written


def _tag(name):
    """``"gns"`` -> ``"adapt/gns"``; a full ``adapt/...`` tag passes through."""
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"name={name!r} is not valid; use a logs key such as "
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
    """Writes one point of an ``adapt/*`` scalar series.

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
    >>> from tensorboard_plugin_adapt import summary
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
    >>> from tensorboard_plugin_adapt import summary
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     summary.step_time(0, 0.05, step=7)
    True
    """
    return scalar(metadata.step_time_tag(rank), seconds, step=step)


def event(record, step=None):
    """Writes one adaptation event record under :data:`metadata.EVENTS_TAG`.

    ``record`` is a dict with the fields of :data:`metadata.EVENT_FIELDS`
    (as returned by ``keras_adapt.events.emit`` or ``metadata.make_event``);
    it is stored as one JSON string (data class TENSOR). ``step`` defaults
    to the record's own step.

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from tensorboard_plugin_adapt import metadata, summary
    >>> e = metadata.make_event("resize", 40, 1, "demo", "more data", {"workers": 2},
    ...                         {"workers": 4})
    >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
    ...     summary.event(e)
    True
    """
    if not isinstance(record, dict) or not all(f in record for f in metadata.EVENT_FIELDS):
        raise ValueError(
            f"record={record!r} is not an adaptation event; build it with "
            "keras_adapt.events.emit(...) or metadata.make_event(...)"
        )
    text = metadata.event_to_json(record)
    md = metadata.create_summary_metadata("tensor", "keras-adapt adaptation event (JSON)")
    return _result(tf.summary.write(
        tag=metadata.EVENTS_TAG,
        tensor=tf.constant(text, dtype=tf.string),
        step=int(record["step"]) if step is None else step,
        metadata=md,
    ))


def is_writable_number(value):
    """True for a finite real number (NaN/inf points are not written).

    Example:

    >>> from tensorboard_plugin_adapt.summary import is_writable_number
    >>> is_writable_number(3), is_writable_number(float("inf")), is_writable_number(None)
    (True, False, False)
    """
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
