"""Records the per-worker batch size inside ``model.train_step``.

The noise-scale estimators need the batch size b behind each gradient, but
an optimizer never sees the data. ``GradientStatsMonitor`` therefore wraps the
model's ``train_step`` so that the compiled train function assigns
``tf.shape(x)[0]`` to a variable before the optimizer runs (no host sync; the
last, smaller batch of an epoch is measured correctly too).
"""

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

    object.__setattr__(model, "_keras_adapt_hook", hook)
    object.__setattr__(model, "train_step", train_step)
    # Keras keeps the compiled train function between fit() calls; drop it so
    # the next one is traced through the hook.
    model.train_function = None
