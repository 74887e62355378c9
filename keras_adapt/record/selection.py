"""Which runs of a log directory a command works on: the one rule for ``report`` and ``plan``.

:func:`select_runs` reads the runs with adapt data under a log directory
(:func:`keras_adapt.record.runs.load_runs`), only the named ones when names
are given, and says what is wrong when that leaves nothing to work on: no
run has adapt data, or a name matches none of them (the error lists the
names there are).

Example:

>>> import os, tempfile
>>> from keras_adapt.record import events
>>> from keras_adapt.record.selection import select_runs
>>> logdir = tempfile.mkdtemp()
>>> _ = events.emit("batch_size", 10, 0, "demo", "gns grew", {"batch_size": 32},
...                 {"batch_size": 64}, log_dir=os.path.join(logdir, "a"), rank=0)
>>> [r.name for r in select_runs(logdir, ["a"])]
['a']
>>> select_runs(logdir, ["typo"])
Traceback (most recent call last):
...
ValueError: no run 'typo' under '...'; runs with adapt data: a
"""

from keras_adapt.record.runs import load_runs

__all__ = ["select_runs"]


def select_runs(logdir, names=None, max_points=2000, error=ValueError):
    """The runs with adapt data under ``logdir``; with ``names``, exactly those runs.

    Raises ``error`` (a ``ValueError`` unless given) when no run under
    ``logdir`` has adapt data, or when a name is not one of those runs --
    naming it and listing the runs with adapt data; ``FileNotFoundError``
    when ``logdir`` is not a directory.

    Example:

    >>> import tempfile
    >>> from keras_adapt.record.selection import select_runs
    >>> select_runs(tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    ValueError: no run under '...' has adapt data; train with keras_adapt.callbacks.AdaptTensorBoard(log_dir=...) under that folder
    """
    wanted = None if names is None else list(dict.fromkeys(names))
    found = load_runs(logdir, runs=wanted, max_points=max_points)
    if wanted is None or len(found) < len(wanted):
        everything = found if wanted is None else load_runs(logdir, max_points=2)
        if not everything:
            raise error(f"no run under {str(logdir)!r} has adapt data; train with "
                        "keras_adapt.callbacks.AdaptTensorBoard(log_dir=...) under that folder")
        known = {r.name for r in everything}
        missing = [n for n in (wanted or []) if n not in known]
        if missing:
            raise error(f"no run {', '.join(repr(n) for n in missing)} under {str(logdir)!r}; "
                        f"runs with adapt data: {', '.join(r.name for r in everything)}")
    return found
