"""Work between training steps that is not training: marked so step timers leave it out.

A step timer (the batch-size policies' :class:`~keras_adapt.policies.UpdateTimer`)
times training from one step's begin to the next, so the callbacks run
between two steps are counted with the step. An evaluation every N samples,
a checkpoint, or a ``model.predict`` inside ``on_train_batch_end`` would
make the step it follows look slow -- and with it the batch it ran at:
the larger the batch, the more of its steps hold one. Such work is marked:

* :func:`paused`: the time spent inside the block does not count (the
  step it falls in is timed without it). For work every worker does alike.
  ``model.evaluate``, ``predict``, ``save`` and ``save_weights`` count as
  paused on a model a timer is attached to.
* :func:`skip_update`: the optimizer update in progress is not timed at
  all (with ``count=2`` the next one neither: work on some workers only, a
  rank-0 checkpoint write, makes the others wait at the next update's
  collective). keras-adapt's own checkpoint writes do this.

Every timer listening (:func:`listen`) hears of both on the thread that
does the work: a pause on the training thread is subtracted; a pause on
another thread overlapped training, and drops the update it falls in.
"""

import contextlib
import functools
import threading
import weakref

_listeners = weakref.WeakSet()
_lock = threading.Lock()
_depth = threading.local()
#: The model methods that run inside :func:`paused` once :func:`pause_model_work` wrapped them.
MODEL_WORK = ("evaluate", "predict", "save", "save_weights")


def listen(timer):
    """Makes ``timer`` hear of :func:`paused` blocks and :func:`skip_update`
    calls: its ``pause()`` at the begin of an outermost block and ``resume()``
    at its end, and ``skip(count)``, each called on the thread doing the
    work. The timer is held weakly.

    Example:

    >>> from keras_adapt.monitors import step_pauses
    >>> class Printer:
    ...     def pause(self): print("pause")
    ...     def resume(self): print("resume")
    ...     def skip(self, count): print("skip", count)
    >>> printer = Printer()
    >>> step_pauses.listen(printer)
    >>> with step_pauses.paused():
    ...     with step_pauses.paused():   # nested: one pause
    ...         pass
    pause
    resume
    >>> step_pauses.skip_update(2)
    skip 2
    """
    with _lock:
        _listeners.add(timer)


def _tell(method, *args):
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        getattr(listener, method)(*args)


@contextlib.contextmanager
def paused():
    """The work inside the block is not training: step timers leave its time out.

    Use it around work done between steps in a callback on every worker
    alike (an evaluation on held-out data, a log written by every rank). On
    the training thread the block's seconds are subtracted from the step
    they fall in; on another thread (Keras 3 runs ``on_train_batch_end`` of
    callbacks that are all ``async_safe`` in a thread pool) the block
    overlapped training, and the update it falls in is not timed. Blocks
    may nest.

    Example:

    >>> from keras_adapt.monitors import paused
    >>> with paused():
    ...     accuracy = 0.9   # evaluate here
    """
    depth = getattr(_depth, "value", 0)
    _depth.value = depth + 1
    if depth == 0:
        _tell("pause")
    try:
        yield
    finally:
        _depth.value = depth
        if depth == 0:
            _tell("resume")


def skip_update(count=1):
    """The optimizer update in progress (the step that is running or has
    just ended, and with accumulation the other micro-steps of its update)
    is not representative: step timers do not time it, nor the ``count - 1``
    updates after it.

    ``count=2`` on every worker for work some workers do and others do not:
    the others wait for them at the next update's collective, so that
    update is slow on them. Call it from a callback, e.g. in
    ``on_train_batch_end``.

    Example:

    >>> from keras_adapt.monitors import skip_update
    >>> skip_update()      # e.g. this step also reloaded a data file
    >>> skip_update(2)     # rank 0 alone wrote a file: the next update waits for it
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count={count!r} is not valid; use a positive int (updates to skip, "
                         "the one in progress first)")
    _tell("skip", count)


def pause_model_work(model):
    """Makes ``model``'s ``evaluate``, ``predict``, ``save`` and
    ``save_weights`` (:data:`MODEL_WORK`) run inside :func:`paused`:
    called in a callback between two training steps, they do not count as
    step time. Idempotent; the methods behave as before otherwise.

    Example:

    >>> import numpy as np, keras
    >>> from keras_adapt.monitors.step_pauses import pause_model_work
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> pause_model_work(model)
    >>> model.predict(np.ones((3, 2)), verbose=0).shape
    (3, 1)
    """
    for name in MODEL_WORK:
        method = getattr(model, name)
        if getattr(method, "keras_adapt_paused", False):
            continue
        object.__setattr__(model, name, _in_pause(method))


def _in_pause(method):
    @functools.wraps(method)
    def run_paused(*args, **kwargs):
        with paused():
            return method(*args, **kwargs)

    run_paused.keras_adapt_paused = True
    return run_paused
