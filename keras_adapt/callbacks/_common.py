"""What the callbacks share: argument checks and cached logs."""

import keras


def check_interval(interval, what):
    """Raises a ``ValueError`` naming a bad ``interval`` (steps between ``what``) and the fix."""
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(
            f"interval={interval!r} is not valid; use a positive int, the number "
            f"of training steps between {what} (e.g. 10)"
        )


class CachedLogs(keras.callbacks.Callback):
    """Base of the monitors that measure every few steps: the last values
    (``self._values``, a dict the subclass refreshes) go into the logs of
    every step and epoch end, a dict update only (async-safe)."""

    _values = {}

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs.update(self._values)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self._values)
