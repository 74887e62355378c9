"""A PreemptionCheckpoint under elastic: the whole-job stop, the periodic saves after commits, the resume of a fresh job."""

import os
import weakref

from keras_adapt import _hvd
from keras_adapt.callbacks.preemption_checkpoint import PreemptionCheckpoint
from keras_adapt.coordination import EXIT_CODE

# The checkpoints with which this process has entered elastic.fit: a rank
# that has not is in a fresh job, or has just joined a running one.
_entered = weakref.WeakSet()


def checked(checkpoint):
    """``checkpoint`` if it can serve an elastic job, else a clear error: it
    must be a :class:`~keras_adapt.callbacks.PreemptionCheckpoint` with an
    exit code (under :func:`keras_adapt.elastic.fit` it is written only
    when every worker is signalled, and the processes must end).

    Example:

    >>> import tempfile
    >>> from keras_adapt.callbacks import PreemptionCheckpoint
    >>> from keras_adapt.elastic.disk_checkpoint import checked
    >>> checked(PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=None)).exit_code
    75
    >>> checked(PreemptionCheckpoint("ck", exit_code=None, save_freq=None))
    Traceback (most recent call last):
    ...
    ValueError: PreemptionCheckpoint('ck'): exit_code=None (fit returns) cannot work under elastic: ...
    """
    if not isinstance(checkpoint, PreemptionCheckpoint):
        raise TypeError(f"checkpoint must be a keras_adapt.callbacks.PreemptionCheckpoint "
                        f"or None, got {checkpoint!r}")
    if checkpoint.exit_code is None:
        raise ValueError(
            f"PreemptionCheckpoint({checkpoint.directory!r}): exit_code=None (fit returns) "
            "cannot work under elastic: the workers of a stopped elastic job must end; use an "
            f"exit code (default {EXIT_CODE})")
    return checkpoint


def _attach(checkpoint, state):
    checkpoint.attach(state.model, state.dataset, state.policies, state.log_dir)


def resume(checkpoint, state):
    """At every entry of :func:`keras_adapt.elastic.fit`, on every rank
    (one host allreduce): at the first entry of a fresh job (no process of
    it has trained yet), rank 0 restores the newest readable checkpoint of
    ``checkpoint`` (a :class:`~keras_adapt.callbacks.PreemptionCheckpoint`;
    falling back past a damaged one, with a warning) into the model, the
    optimizer and ``state`` (a :class:`~keras_adapt.elastic.KerasState`:
    position, data position, policies), records a ``resume`` event, and
    ``state.sync()`` gives it to every rank. A checkpoint written by another
    worker count gets the state's :class:`~keras_adapt.elastic.ResizeRule`
    as at a change of workers
    (:meth:`~keras_adapt.elastic.KerasState.rescale_from`: the per-worker
    batch, the learning rate); the ``resume`` event records the workers
    before and after and what was rescaled. Only rank 0 reads the
    directory. A worker joining a running job restores nothing: the job's
    state reaches it by the elastic sync. Returns the checkpoint's path, or
    None.

    Example (one process: a stop written, then a fresh job resumes):

    >>> import tempfile, time, keras, keras_adapt
    >>> from keras_adapt import elastic
    >>> from keras_adapt.callbacks import PreemptionCheckpoint
    >>> from keras_adapt.elastic import disk_checkpoint
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> state, directory = elastic.KerasState(model, epoch=1, batch=4), tempfile.mkdtemp()
    >>> disk_checkpoint.stop(PreemptionCheckpoint(directory, save_freq=None), state,
    ...                      {0: ("SIGTERM", time.time())}, check_interval=1)
    >>> state.epoch, state.batch = 0, 0
    >>> path = disk_checkpoint.resume(PreemptionCheckpoint(directory, save_freq=None), state)
    >>> path.endswith("ckpt-0"), (state.epoch, state.batch)
    (True, (1, 4))
    """
    _attach(checkpoint, state)
    fresh = float(checkpoint not in _entered)
    _entered.add(checkpoint)
    if _hvd.host_allreduce_mean([fresh], "keras_adapt_resume_fresh")[0] < 1.0:
        return None  # a running job: its state is the elastic one
    found = checkpoint.latest() if _hvd.rank() == 0 else None
    number, saved_workers = -1.0, -1.0
    if found is not None:
        path, meta = found
        checkpoint.files.load(path, meta)
        state.load(meta["epoch"], meta["step_in_epoch"], data_state=meta.get("data"),
                   policy_states=checkpoint.files.policy_states(path, meta, state.policies))
        number, saved_workers = float(path.rsplit("-", 1)[-1]), float(meta["workers"])
    number, saved_workers = _hvd.host_allreduce_max([number, saved_workers],
                                                    "keras_adapt_resume_found")
    if number < 0.0:
        return None
    state.sync()
    # Written by another worker count: the resize rule applies as at a
    # change of workers (every rank; the sync gave them the saved state).
    rescaled = state.rescale_from(int(saved_workers))
    if found is not None:  # the workers, and what the rule changed
        checkpoint.record_resume(path, meta, {"workers": meta["workers"], **rescaled["before"]},
                                 {"workers": _hvd.size(), **rescaled["after"]})
    return os.path.join(checkpoint.directory, f"ckpt-{int(number)}")


def save(checkpoint, state):
    """A periodic checkpoint under elastic, on every rank right after a
    commit (:class:`~keras_adapt.elastic.CommitStateCallback` calls it at
    the commits of the ``save_freq`` of ``checkpoint``): rank 0 writes the
    checkpoint at the committed position of ``state`` and records a
    ``checkpoint`` event; no collective (a worker that joins later runs
    nothing the others do not). Returns the path written (None on other
    ranks).

    Example:

    >>> import tempfile, keras, keras_adapt
    >>> from keras_adapt import elastic
    >>> from keras_adapt.callbacks import PreemptionCheckpoint
    >>> from keras_adapt.elastic import disk_checkpoint
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> state = elastic.KerasState(model, epoch=1, batch=4)
    >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=10)
    >>> path = disk_checkpoint.save(ckpt, state)
    >>> ckpt.position(), ckpt.events[-1]["kind"]
    ((1, 4), 'checkpoint')
    """
    _attach(checkpoint, state)
    return checkpoint.save(state.epoch, state.batch)


def stop(checkpoint, state, signalled, check_interval):
    """Every rank of an elastic job whose every rank was signalled, at the
    agreed step, after ``state.commit()``: rank 0 writes ``checkpoint`` at
    the state's position and the ``preemption`` event, and every rank waits
    until both are on disk (``signalled``: ``{rank: (signal name, time)}``
    as agreed). The caller then ends the process with the checkpoint's
    ``exit_code``.

    Example: see :func:`resume`.
    """
    _attach(checkpoint, state)
    checkpoint.stop(state.epoch, state.batch, signalled, check_interval)
