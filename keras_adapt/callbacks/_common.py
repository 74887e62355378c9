"""What the callbacks share: argument checks and cached logs."""

import keras


def epoch_ender(callbacks):
    """The callback among ``callbacks`` that ends ``fit``'s epochs itself (a
    batch-size policy with ``epoch_end``), or None; a ``ValueError`` when
    several would.

    Example:

    >>> from keras_adapt.callbacks._common import epoch_ender
    >>> from keras_adapt.policies import GNSBatchSizePolicy
    >>> epoch_ender([GNSBatchSizePolicy(16, 64, micro_batch_size=16)]) is None
    True
    >>> policy = GNSBatchSizePolicy(16, 64, micro_batch_size=16, epoch_end="samples",
    ...                             samples_per_epoch=1000)
    >>> epoch_ender([policy]) is policy
    True
    """
    enders = [cb for cb in callbacks if getattr(cb, "epoch_end", None) is not None]
    if len(enders) > 1:
        names = ", ".join(f"{type(cb).__name__}(epoch_end={cb.epoch_end!r})" for cb in enders)
        raise ValueError(f"{len(enders)} callbacks end the epochs on their counts ({names}); "
                         "give epoch_end to one of them and None to the others")
    return enders[0] if enders else None


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
