"""``fit``: ``model.fit`` from the committed position of an elastic state."""

from keras_adapt.callbacks.preemption_checkpoint import PreemptionCheckpoint
from keras_adapt.checkpointing import epoch_ender
from keras_adapt.checks import check_int
from keras_adapt.elastic import disk_checkpoint
from keras_adapt.elastic.state_callbacks import (
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)
from keras_adapt.elastic.leave_on_signal import LeaveOnSignalCallback


def fit(state, data, epochs, steps_per_epoch=None, callbacks=(), **kwargs):
    """Runs ``state.model.fit`` from the position in ``state`` to ``epochs``:
    the rest of a partly done epoch first (its remaining steps only), then
    the following epochs. Call it inside a :func:`keras_adapt.elastic.run`
    function; it returns the ``History`` objects of the ``fit`` calls.

    No step and no epoch runs twice after a change of workers: ``fit`` gets
    ``initial_epoch=state.epoch`` and the steps left, and the elastic
    callbacks (added when missing, with the default commit interval) keep
    the position. A :class:`~keras_adapt.elastic.LeaveOnSignalCallback` is
    added too when none is given: a worker sent SIGTERM or SIGINT (a
    preempted machine) leaves at an agreed step and the others go on
    without rollback.

    A :class:`~keras_adapt.callbacks.PreemptionCheckpoint` among the
    callbacks keeps a whole-job preemption: when every worker is signalled,
    the leave callback writes it at the agreed step and every worker exits
    with its ``exit_code`` (one agreement on the signal, the leave
    callback's, which takes the checkpoint's ``check_interval`` and
    ``deadline_s``). Its ``save_freq`` (``"epoch"`` or every that many
    updates; None: on preemption only) writes it periodically too, rank 0
    right after the commit at those steps (the commit callback's
    :meth:`~keras_adapt.elastic.CommitStateCallback.save_to`): a disk copy
    that outlives the whole job. Running the same command again restores
    the newest at the first ``fit`` of the new job (rank 0 reads it, the
    elastic sync gives it to all; with another worker count the state's
    :class:`~keras_adapt.elastic.ResizeRule` applies) and goes on from that
    step; a worker that joins a running job restores nothing.

    Epochs that a batch-size policy ends (``epoch_end="samples"`` or
    ``"progress"``, docs/policies.md) have no fixed steps: pass
    ``steps_per_epoch=None`` and the policy among ``callbacks`` and in
    ``KerasState(..., policies=[policy])``, so its count is committed,
    restored and synced with the model. ``fit`` is then one
    ``model.fit`` from ``state.epoch`` over the endless stream, and after a
    reset the policy ends the interrupted epoch, and every later one, at
    the update where a run without the reset ends it.

    Args:
        state: the :class:`~keras_adapt.elastic.KerasState`.
        data: ``data(epoch, batch)`` returns this worker's training data from
            step ``batch`` of epoch ``epoch`` on, for all the steps left (a
            repeated ``tf.data.Dataset``, for example), made with the batch
            of ``state.batch_size`` and sharded by ``keras_adapt.rank()`` /
            ``keras_adapt.size()``; or the
            :class:`~keras_adapt.data.AdaptiveBatchDataset` given to the state
            as ``KerasState(..., dataset=ds)``, which the state keeps at the
            committed position and re-shards on every reset.
        epochs: the epoch to train to (as in ``model.fit``).
        steps_per_epoch: steps in an epoch; None when a policy among
            ``callbacks`` ends the epochs (its ``epoch_end``).
        callbacks: more Keras callbacks.
        **kwargs: passed to ``model.fit`` (``verbose``, ``validation_data``...);
            ``shuffle`` is False unless given (shuffle in ``data`` instead,
            seeded by the epoch, so every worker count sees the same order).

    Example:

    >>> import keras, keras_adapt, numpy as np, tensorflow as tf
    >>> from keras_adapt import elastic
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> state = elastic.KerasState(model, batch=3, rule=elastic.ResizeRule("keep", global_batch=4))
    >>> def data(epoch, batch):
    ...     x = np.ones((64, 3), "float32")
    ...     return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(state.batch_size).repeat()
    >>> runs = elastic.fit(state, data, epochs=2, steps_per_epoch=5, verbose=0)
    >>> [len(h.epoch) for h in runs], state.epoch, state.batch, int(model.optimizer.iterations)
    ([1, 1], 2, 0, 7)
    """
    if data is not None and data is state.dataset:
        dataset = data

        def data(epoch, batch):  # the stream is where the state put it
            return dataset.dataset
    elif state.dataset is not None:
        raise ValueError(
            f"the state re-shards its AdaptiveBatchDataset on every reset, so fit must read "
            f"that one: call fit(state, state.dataset, ...), not with {data!r}")
    elif hasattr(data, "reshard"):
        raise ValueError(
            "an AdaptiveBatchDataset under elastic must be given to the state too, which keeps "
            "its position and re-shards it on every reset: KerasState(model, ..., dataset=ds), "
            "then fit(state, ds, ...)")
    elif not callable(data):
        raise TypeError(f"data must be a function data(epoch, batch) -> dataset, got {data!r}")
    epochs = check_int("epochs", epochs)
    ender = epoch_ender(callbacks)
    if ender is None:
        steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch)
    else:
        _check_ender(state, ender, steps_per_epoch)
    for name in ("initial_epoch", "epochs", "steps_per_epoch"):
        if name in kwargs:
            raise ValueError(f"fit sets {name} of model.fit from the state; do not pass it")
    # The data starts at the committed position: shuffling it would lose that.
    kwargs.setdefault("shuffle", False)
    callbacks, leave = _with_elastic_callbacks(state, list(callbacks))
    if leave.checkpoint is not None:
        disk_checkpoint.resume(leave.checkpoint, state)  # every entry: a fresh job restores
    if ender is None and state.batch >= steps_per_epoch:
        raise ValueError(
            f"state.batch={state.batch} but an epoch has steps_per_epoch={steps_per_epoch} "
            "steps; use the steps_per_epoch the state was committed with"
        )
    histories = []
    try:
        if ender is not None:  # the policy ends each epoch on its (committed) count
            if state.epoch < epochs:
                histories.append(state.model.fit(
                    data(state.epoch, state.batch), initial_epoch=state.epoch, epochs=epochs,
                    callbacks=callbacks, **kwargs))
            return histories
        if state.batch > 0 and state.epoch < epochs:
            histories.append(state.model.fit(
                data(state.epoch, state.batch), initial_epoch=state.epoch,
                epochs=state.epoch + 1, steps_per_epoch=steps_per_epoch - state.batch,
                callbacks=callbacks, **kwargs))
        if state.epoch < epochs:
            histories.append(state.model.fit(
                data(state.epoch, 0), initial_epoch=state.epoch, epochs=epochs,
                steps_per_epoch=steps_per_epoch, callbacks=callbacks, **kwargs))
    finally:
        # A fit left by an exception (a reset) never calls on_train_end:
        # the signal handlers must not outlive it.
        leave.agreement.remove()
    return histories


def _check_ender(state, ender, steps_per_epoch):
    """The checks of a policy that ends the epochs under elastic."""
    name = f"{type(ender).__name__}(epoch_end={ender.epoch_end!r})"
    if steps_per_epoch is not None:
        raise ValueError(
            f"steps_per_epoch={steps_per_epoch!r} but {name} ends the epochs on its count; "
            "pass steps_per_epoch=None")
    if not any(p is ender for p in state.policies):
        raise ValueError(
            f"{name} ends the epochs on its count, which must be committed and restored with "
            "the model: give it to the state too, KerasState(model, ..., policies=[policy])")


def _with_elastic_callbacks(state, callbacks):
    """The callbacks with the elastic ones added where missing, and the
    leave callback, which takes a PreemptionCheckpoint given among them."""
    checkpoints = [c for c in callbacks if isinstance(c, PreemptionCheckpoint)]
    if len(checkpoints) > 1:
        raise ValueError(f"{len(checkpoints)} PreemptionCheckpoint callbacks given; give one")
    callbacks = [c for c in callbacks if not isinstance(c, PreemptionCheckpoint)]
    leaves = [c for c in callbacks if isinstance(c, LeaveOnSignalCallback)]
    if len(leaves) > 1:
        raise ValueError(f"{len(leaves)} LeaveOnSignalCallback callbacks given; give one")
    checkpoint = checkpoints[0] if checkpoints else None
    leave = leaves[0] if leaves else None
    if leave is not None:
        if checkpoint is not None and leave.checkpoint is not checkpoint:
            raise ValueError(
                "a PreemptionCheckpoint and a LeaveOnSignalCallback are given: both would handle "
                "the signals; give the checkpoint to the leave callback instead, "
                "LeaveOnSignalCallback(state, ..., checkpoint=ckpt), and not as a callback")
    for cls in (UpdateBatchStateCallback, UpdateEpochStateCallback, CommitStateCallback):
        if not any(isinstance(c, cls) for c in callbacks):
            callbacks.append(cls(state))
    if not leaves:
        options = {} if checkpoint is None else {
            "check_interval": checkpoint.check_interval, "checkpoint": checkpoint,
            **({} if checkpoint.deadline_s is None else {"deadline_s": checkpoint.deadline_s})}
        leave = LeaveOnSignalCallback(state, **options)
        callbacks.append(leave)
    if leave.checkpoint is not None and leave.checkpoint.save_freq is not None:
        commit = next(c for c in callbacks if isinstance(c, CommitStateCallback))
        commit.save_to(leave.checkpoint)
    return callbacks, leave
