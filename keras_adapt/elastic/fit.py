"""``fit``: ``model.fit`` from the committed position of an elastic state."""

from keras_adapt.elastic.callbacks import (
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)
from keras_adapt.elastic.leave_on_signal import LeaveOnSignalCallback


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not valid; use a positive int")
    return value


def fit(state, data, epochs, steps_per_epoch, callbacks=(), **kwargs):
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

    Args:
        state: the :class:`~keras_adapt.elastic.KerasState`.
        data: ``data(epoch, batch)`` returns this worker's training data from
            step ``batch`` of epoch ``epoch`` on, for all the steps left (a
            repeated ``tf.data.Dataset``, for example), made with the batch
            of ``state.batch_size`` and sharded by ``keras_adapt.rank()`` /
            ``keras_adapt.size()``.
        epochs: the epoch to train to (as in ``model.fit``).
        steps_per_epoch: steps in an epoch.
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
    if not callable(data):
        raise TypeError(f"data must be a function data(epoch, batch) -> dataset, got {data!r}")
    epochs = _positive("epochs", epochs)
    steps_per_epoch = _positive("steps_per_epoch", steps_per_epoch)
    for name in ("initial_epoch", "epochs", "steps_per_epoch"):
        if name in kwargs:
            raise ValueError(f"fit sets {name} of model.fit from the state; do not pass it")
    if state.batch >= steps_per_epoch:
        raise ValueError(
            f"state.batch={state.batch} but an epoch has steps_per_epoch={steps_per_epoch} "
            "steps; use the steps_per_epoch the state was committed with"
        )
    # The data starts at the committed position: shuffling it would lose that.
    kwargs.setdefault("shuffle", False)
    callbacks = list(callbacks)
    for cls in (UpdateBatchStateCallback, UpdateEpochStateCallback, CommitStateCallback,
                LeaveOnSignalCallback):
        if not any(isinstance(c, cls) for c in callbacks):
            callbacks.append(cls(state))
    histories = []
    try:
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
        for c in callbacks:
            if isinstance(c, LeaveOnSignalCallback):
                c.agreement.remove()
    return histories
