"""A log directory's runs, read on this machine: each run's adapt series and events.

:func:`load_runs` reads what the Adapt tab reads, the same way --
TensorBoard's own event-file multiplexer and data provider, through
:mod:`keras_adapt.record.reader` -- and falls back to a run's
``adapt_events.jsonl`` (:mod:`keras_adapt.record.events`) when its event
files hold no events. Damaged files and unknown event kinds are skipped or
marked as such, never fatal. ``keras-adapt report`` draws what it returns;
``keras-adapt plan`` plans from it.

Example:

>>> import os, tempfile
>>> from keras_adapt.record import events, runs
>>> logdir = tempfile.mkdtemp()
>>> _ = events.emit("batch_size", 10, 0, "demo", "gns grew", {"batch_size": 32},
...                 {"batch_size": 64}, log_dir=os.path.join(logdir, "run1"), rank=0)
>>> [(r.name, r.series, [e["after"] for e in r.events]) for r in runs.load_runs(logdir)]
[('run1', {}, [{'batch_size': 64}])]
"""

import dataclasses
import os

from keras_adapt.extras import require
from keras_adapt.record import events, metadata, reader

__all__ = ["RunData", "load_runs"]


@dataclasses.dataclass
class RunData:
    """One run's adapt data: ``series`` {tag: [(step, wall_time, value)]}, ``events``.

    Attributes:
        name: the run's name (its folder under the log directory).
        series: ``{tag: [(step, wall_time, value)]}``, each downsampled as
            :func:`load_runs` was asked.
        events: the run's adaptation events, from its event files, else from
            its ``adapt_events.jsonl``.
        skipped: how many records could not be read.

    Example:

    >>> from keras_adapt.record.runs import RunData
    >>> RunData("run1", {"adapt/lr": [(0, 0.0, 0.1)]}, []).name
    'run1'
    """

    name: str
    series: dict
    events: list
    skipped: int = 0


def _provider(logdir):
    require("tensorboard", "report", "reading TensorBoard logs (keras-adapt report, plan)")
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    # Keep every point (0): load_runs downsamples itself, like the tab.
    mux = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0, metadata.SCALARS_PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return data_provider.MultiplexerDataProvider(mux, logdir)


def _jsonl_runs(logdir):
    """Run name (as TensorBoard names it) -> path of its adapt_events.jsonl."""
    out = {}
    for root, _dirs, files in os.walk(logdir):
        if metadata.EVENTS_FILENAME in files:
            rel = os.path.relpath(root, logdir)
            out[rel] = os.path.join(root, metadata.EVENTS_FILENAME)
    return out


def load_runs(logdir, runs=None, max_points=2000):
    """Reads every run with adapt data under ``logdir`` (sorted by name).

    ``runs`` (names) keeps only those runs. Series are downsampled to at
    most ``max_points`` points each, keeping the first and last (``None``:
    all). It reads with TensorBoard's own multiplexer and
    :mod:`keras_adapt.record.reader`, as the Adapt tab does (TensorBoard's
    reader imports TensorFlow when it is installed; importing this module,
    the report or the planner does not). ``keras-adapt report`` draws what
    it returns and ``keras-adapt plan`` plans from it.

    Returns:
        A list of :class:`RunData`, one per run with adapt data, sorted by name.

    Raises:
        FileNotFoundError: ``logdir`` is not a directory.

    Example:

    >>> import tempfile
    >>> from keras_adapt.record.runs import load_runs
    >>> load_runs(tempfile.mkdtemp())
    []
    """
    if not os.path.isdir(logdir):
        raise FileNotFoundError(
            f"logdir={logdir!r} is not a directory; pass the folder given to "
            "AdaptTensorBoard's log_dir or its parent (TensorBoard's --logdir)"
        )
    provider = _provider(logdir)
    ctx, eid = None, ""  # a local reader: no request context, one experiment
    listed = {r["run"]: r for r in reader.list_runs(provider, ctx, eid)}
    jsonl = _jsonl_runs(logdir)
    out = []
    for name in sorted(set(listed) | set(jsonl)):
        if runs is not None and name not in runs:
            continue
        series = reader.read_series(provider, ctx, eid, name, max_points=max_points) \
            if name in listed else {}
        run_events, skipped = ([], 0)
        if listed.get(name, {}).get("events"):
            run_events, skipped, newer = reader.read_events(provider, ctx, eid, name)
            skipped += newer
        if not run_events and name in jsonl:
            run_events = [reader.annotate(e) for e in events.read_events(jsonl[name])]
            run_events.sort(key=lambda e: (e["step"], e["wall_time"]))
        if series or run_events:
            out.append(RunData(name, series, run_events, skipped))
    return out
