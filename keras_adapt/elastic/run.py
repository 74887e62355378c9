"""``run``: Horovod Elastic's retry loop around a training function."""

import functools
import threading
import traceback

import tensorflow as tf

try:
    from horovod.common.elastic import State, run_fn
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
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


def release_in_background(error):
    """Frees what an exception's tracebacks hold (the frames it left, and
    everything in them) in a thread of its own, and returns that thread.

    An interrupted ``model.fit`` leaves its frames on the interrupt's
    traceback, among them the epoch's ``tf.data`` iterator. Destroying that
    iterator can wait for the next run of tf.data's autotuning thread,
    seconds to a minute into a long run (docs/elastic.md, "The interrupted
    epoch's data iterator"); the wait does not hold Python's lock, so in
    this thread it runs beside the re-form instead of before it. The
    thread is not a daemon: a process that ends sooner waits for it rather
    than exit while TensorFlow is still destroying the iterator.

    Example:

    >>> import weakref
    >>> from keras_adapt.elastic.run import release_in_background
    >>> class Iterator: pass
    >>> held = []
    >>> def interrupted():
    ...     data = Iterator()  # only this frame holds it, as fit holds its iterator
    ...     held.append(weakref.ref(data))
    ...     raise RuntimeError("interrupt")
    >>> try:
    ...     interrupted()
    ... except RuntimeError as error:
    ...     release_in_background(error).join()
    ...     print(error.__traceback__, held[0]())
    None None
    """
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error.__traceback__)
        error.__traceback__ = None
        error = error.__cause__ or error.__context__

    def release():
        for tb in chain:
            traceback.clear_frames(tb)  # the frames' locals, cycles through them too
        chain.clear()

    thread = threading.Thread(target=release, name="keras-adapt-release")
    thread.start()
    return thread


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
        # Raised afresh, outside the except clauses: the original exceptions
        # hold the interrupted fit's frames, which are released in the
        # background (release_in_background).
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt as interrupt:
            fresh = HostsUpdatedInterrupt(interrupt.skip_sync)
            release_in_background(interrupt)
        except (HorovodInternalError, tf.errors.OpError) as error:
            if not isinstance(error, HorovodInternalError) and not is_collective_failure(error):
                raise
            fresh = HorovodInternalError(f"{type(error).__name__}: {error}")
            release_in_background(error)
        raise fresh

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
