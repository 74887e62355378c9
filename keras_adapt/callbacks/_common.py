"""What the callbacks share: cached logs."""

import keras


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
