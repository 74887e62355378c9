"""Adaptation events: one record per decision, on disk and to listeners.

Every decision a policy makes (a new batch size, a new learning rate, ...)
becomes one event with the schema of :mod:`keras_adapt.record.metadata`
(docs/design.md#adaptation-events). :func:`emit` appends it as one JSON line to
``<log_dir>/adapt_events.jsonl`` -- on rank 0 only, because every rank makes
the same decision at the same step -- and hands it to every registered
listener in this process (``AdaptTensorBoard`` is one: it writes the same
record to TensorBoard).

Example:

>>> import tempfile
>>> from keras_adapt.record import events
>>> d = tempfile.mkdtemp()
>>> seen = []
>>> events.add_listener(seen.append)
>>> e = events.emit("lr", step=10, epoch=0, policy="LRScalingPolicy",
...                 reason="batch 64 -> 128", before={"lr": 0.1}, after={"lr": 0.2},
...                 log_dir=d)
>>> events.remove_listener(seen.append)
>>> [r["after"] for r in events.read_events(d)], len(seen)
([{'lr': 0.2}], 1)
"""

import os
import threading
import warnings

from keras_adapt.record import metadata

EVENT_KINDS = metadata.EVENT_KINDS
EVENT_FIELDS = metadata.EVENT_FIELDS
EVENTS_FILENAME = metadata.EVENTS_FILENAME

_listeners = []
_lock = threading.Lock()


def add_listener(listener):
    """Calls ``listener(event)`` for every event emitted in this process.

    Example:

    >>> from keras_adapt.record import events
    >>> events.add_listener(print); events.remove_listener(print)
    """
    if not callable(listener):
        raise TypeError(f"listener must be callable, got {listener!r}")
    with _lock:
        _listeners.append(listener)


def remove_listener(listener):
    """Stops calling ``listener``; a listener that was never added is ignored.

    Example:

    >>> from keras_adapt.record import events
    >>> events.remove_listener(print)
    """
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def events_path(log_dir):
    """Path of the JSONL event log in ``log_dir``.

    Example:

    >>> from keras_adapt.record import events
    >>> events.events_path("runs/a")
    'runs/a/adapt_events.jsonl'
    """
    return os.path.join(log_dir, EVENTS_FILENAME)


def emit(kind, step, epoch, policy, reason, before, after, log_dir=None, rank=None,
         write=None):
    """Records one adaptation event and returns it (a dict).

    Args:
        kind: one of :data:`EVENT_KINDS`.
        step: optimizer step (``optimizer.iterations``) at which the change
            takes effect.
        epoch: the current epoch (0-based).
        policy: name of the deciding policy (usually its class name).
        reason: a short human-readable cause, e.g. ``"gns 410 > 2 x 128"``.
        before, after: dicts of the changed quantities.
        log_dir: directory of ``adapt_events.jsonl``; None keeps the event in
            memory and listeners only.
        rank: the recording worker (default: this Horovod rank).
        write: whether this process appends to the file (default: rank 0).

    Example:

    >>> from keras_adapt.record import events
    >>> events.emit("resume", 5, 0, "demo", "state restored", {}, {"last_adapt": 0})["kind"]
    'resume'
    """
    if rank is None:
        from keras_adapt import _hvd

        rank = _hvd.rank()
    event = metadata.make_event(kind, step=step, epoch=epoch, policy=policy,
                                reason=reason, before=before, after=after, rank=rank)
    if write is None:
        write = rank == 0
    if log_dir is not None and write:
        os.makedirs(log_dir, exist_ok=True)
        line = metadata.event_to_json(event) + "\n"
        # One write of one line in append mode: a reader never sees half of
        # it, and a crash loses at most the event being written.
        with _lock, open(events_path(log_dir), "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception as exc:  # noqa: BLE001 - a listener must not stop training
            warnings.warn(f"keras-adapt: event listener {listener!r} failed: {exc}",
                          RuntimeWarning, stacklevel=2)
    return event


def read_events(log_dir_or_file):
    """Reads the events of a run; damaged lines are skipped, never fatal.

    Accepts a run directory or the path of an ``adapt_events.jsonl`` file.
    Returns a list of dicts in file order (an empty list if there is none).

    Example:

    >>> from keras_adapt.record import events
    >>> events.read_events("/nonexistent")
    []
    """
    path = log_dir_or_file
    if os.path.isdir(path):
        path = events_path(path)
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, "rb") as f:
        for line in f:
            event = metadata.parse_event_line(line)
            if event is not None:
                out.append(event)
    return out
