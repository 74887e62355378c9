"""Shared plumbing of the benchmarks: they launch themselves on 2 local workers.

A benchmark script run by hand calls :func:`run_on_workers`, which
re-executes the same script under ``horovodrun -np 2`` with ``--worker``
and returns rank 0's result; the worker side calls :func:`pin_worker`
before it imports TensorFlow. The launcher is ``horovodrun`` beside this
Python, or the command in ``KERAS_ADAPT_HOROVODRUN`` (the test suite's,
see :func:`horovodrun`).
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def horovodrun():
    """The launcher command, as a list: ``$KERAS_ADAPT_HOROVODRUN`` split as
    a shell would, or else the ``horovodrun`` installed beside this Python.

    Example::

        cmd = [*horovodrun(), "-np", "2", "-H", "localhost:2", "--gloo", "python", "x.py"]
    """
    command = os.environ.get("KERAS_ADAPT_HOROVODRUN")
    if command:
        return shlex.split(command)
    return [os.path.join(os.path.dirname(sys.executable), "horovodrun")]


def run_on_workers(script, args, prefix, np=2, out=None):
    """Runs ``script --worker --out DIR ARGS`` on ``np`` local Gloo workers;
    returns the JSON rank 0 wrote to ``DIR/rank0.json`` (exits on failure).
    DIR is ``out``, or else a new temporary directory named ``prefix...``."""
    out = out or tempfile.mkdtemp(prefix=prefix)
    cmd = [*horovodrun(), "-np", str(np),
           "-H", f"localhost:{np}", "--gloo", sys.executable, os.path.abspath(script),
           "--worker", "--out", out, *map(str, args)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"benchmark workers failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                 f"{proc.stderr[-4000:]}")
    with open(os.path.join(out, "rank0.json")) as f:
        return json.load(f)


def pin_worker(slot=None):
    """Pins this worker (and every thread it will start) to its own core and
    gives TensorFlow one thread per pool; call before importing TensorFlow.
    The core is the ``slot``-th (default: the local rank; on emulated hosts,
    one worker per host on one machine, pass the rank).

    Unpinned, the two workers' threads migrate across the two cores and step
    times move by +-10% between runs, far more than the effects measured.
    """
    if slot is None:
        slot = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[slot % len(cores)]})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def parser(doc):
    """An argument parser with the hidden ``--worker``/``--out`` flags."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def write_result(out, rank, result):
    """Writes this worker's ``result`` where :func:`run_on_workers` reads it."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def describe_stack(load_before):
    """What every benchmark result records about where it ran: the stack,
    the versions and the load average before and after (call it when the
    measurements are done)."""
    import horovod
    import keras
    import tensorflow as tf

    from keras_adapt import _keras

    return {
        "stack": "primary" if _keras.IS_KERAS3 else "legacy",
        "versions": f"tf {tf.__version__}, keras {keras.__version__}, horovod {horovod.__version__}",
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def fmt(value, spec):
    """``value`` formatted with ``spec``, or ``-`` for None (a missed target)."""
    return "-" if value is None else format(value, spec)


def median(values):
    """The median of the values that are not None, or None when none is."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
