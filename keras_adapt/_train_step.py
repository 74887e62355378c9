"""Records the per-worker batch size inside ``model.train_step``.

The noise-scale estimators need the batch size b behind each gradient, but
an optimizer never sees the data. ``GradientStatsMonitor`` therefore wraps the
model's ``train_step`` so that the compiled train function assigns
``tf.shape(x)[0]`` to a variable before the optimizer runs (no host sync; the
last, smaller batch of an epoch is measured correctly too).
"""

import inspect

import tensorflow as tf


class _Hook:
    """Plain holder (not trackable) so the model's checkpoint is unchanged."""

    def __init__(self, original, stats):
        self.original = original
        self.stats = stats


def record_batch_size(model, stats):
    """Makes ``model``'s train step record its batch size into ``stats``.

    Idempotent; re-hooking with other statistics replaces the previous hook.
    Must run before Keras builds the train function (``Callback.set_model``
    does), and resets any train function built earlier.
    """
    hook = model.__dict__.get("_keras_adapt_hook")
    if hook is not None and hook.stats is stats:
        return
    original = hook.original if hook is not None else model.train_step
    hook = _Hook(original, stats)

    def train_step(data):
        first = tf.nest.flatten(data)[0]
        hook.stats.record_batch_size(tf.shape(first)[0])
        return hook.original(data)

    # Keras keeps the compiled train function between fit() calls; drop it so
    # the next one is traced through the hook.
    drop_train_function(model, "recording the batch size in the train step")
    object.__setattr__(model, "_keras_adapt_hook", hook)
    object.__setattr__(model, "train_step", train_step)


def _fit_hook(model):
    """``(callback, hook name)`` when a ``model.fit`` on this thread's stack
    is running a callback hook (``on_train_begin`` or later: its train
    function is built), else None (no fit, or one that is still attaching
    its callbacks)."""
    chain = []
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
                callee = chain[-1] if chain else None
                if callee is None or not callee.f_code.co_name.startswith("on_"):
                    return None
                hook = callee.f_code.co_name
                inner = chain[-2] if len(chain) > 1 else None
                callback = (inner.f_locals.get("self") if inner is not None
                            and inner.f_code.co_name == hook else None)
                return callback, hook
            chain.append(frame)
            frame = frame.f_back
        return None
    finally:
        del frame, chain


def drop_train_function(model, what):
    """Drops ``model``'s compiled train function, so that the next ``fit``
    traces it again with ``what`` (a change to what the train step
    computes). A ``fit`` that is already running its callbacks has built
    its train function and calls it next: there this is a ``RuntimeError``
    naming the fix (``on_attach``), before Keras 3 fails with ``TypeError:
    'NoneType' object is not callable`` at ``self.train_function(iterator)``.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt._train_step import drop_train_function
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> drop_train_function(model, "a demo")   # no fit running: the next fit traces anew
    >>> print(model.train_function)
    None
    """
    running = _fit_hook(model)
    if running is not None:
        callback, hook = running
        where = f"{type(callback).__name__}.{hook}" if callback is not None else hook
        raise RuntimeError(
            f"{what} changes the train step, but it was set up in {where} while model.fit "
            "runs: fit has already built its train function. Create actuators in the "
            "policy's on_attach(model) (Keras calls it when the callback gets the model, "
            "before fit builds the train function), or before calling fit")
    model.train_function = None
