"""``run``: Horovod Elastic's retry loop around a training function."""

import functools

import tensorflow as tf

try:
    from horovod.common.elastic import State, run_fn
    from horovod.common.exceptions import HorovodInternalError
    import horovod.tensorflow as _hvd_tf
except ImportError as exc:  # pragma: no cover - both stacks have Horovod
    raise ImportError(
        "keras_adapt.elastic needs Horovod (horovod==0.28.1 with Gloo); see docs/install.md"
    ) from exc


def is_collective_failure(error):
    """Whether a TensorFlow error comes from a Horovod collective that failed
    because a worker left (then the job restores its last commit and goes on).

    Horovod's own ``hvd.elastic.run`` only recognises ``UnknownError``s of
    the ops ``HorovodAllreduce``, ``HorovodAllgather`` and ``HorovodBroadcast``;
    keras-adapt's train step uses the grouped allreduce, whose failure reads
    ``HorovodGroupedAllreduce``, and a failure may surface as another
    ``OpError`` class inside ``model.fit``.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.elastic import is_collective_failure
    >>> is_collective_failure(tf.errors.UnknownError(None, None, "HorovodGroupedAllreduce failed"))
    True
    >>> is_collective_failure(tf.errors.InvalidArgumentError(None, None, "bad shape"))
    False
    """
    return isinstance(error, tf.errors.OpError) and not isinstance(
        error, tf.errors.InvalidArgumentError) and "Horovod" in (error.message or "")


def _reset():
    _hvd_tf.shutdown()
    _hvd_tf.init()


def run(func):
    """Decorator: runs ``func(state, ...)`` under Horovod Elastic
    (Horovod's ``hvd.elastic.run``), for keras-adapt on both stacks.

    ``func`` trains from the position in ``state`` (a
    :class:`~keras_adapt.elastic.KerasState`). Before the first call, and
    after every change of the workers, ``state`` is synchronised from rank 0.
    When a worker is added or removed (host discovery), every rank stops at
    the same commit, re-forms the job and calls ``func`` again; when a
    worker fails, the others restore the last commit first. ``func`` must
    not run collectives before training starts (a joining worker must meet
    the others in the sync first).

    Example:

    >>> import keras_adapt
    >>> @keras_adapt.elastic.run
    ... def train(state, epochs):
    ...     return epochs
    >>> callable(train)
    True
    """
    if not callable(func):
        raise TypeError(f"run() decorates a function train(state, ...), got {func!r}")

    def translated(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            if is_collective_failure(error):
                raise HorovodInternalError(error) from error
            raise

    elastic = run_fn(translated, _reset)

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError(
                f"the first argument of an elastic run must be its state (a "
                f"keras_adapt.elastic.KerasState), got {type(state).__name__}: {state!r}"
            )
        return elastic(state, *args, **kwargs)

    return wrapper
