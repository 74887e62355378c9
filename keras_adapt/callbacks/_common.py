"""What the callbacks share: argument checks and cached logs."""

import keras


def check_interval(interval, what):
    """Raises a ``ValueError`` naming a bad ``interval`` (steps between ``what``) and the fix."""
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(
            f"interval={interval!r} is not valid; use a positive int, the number "
            f"of training steps between {what} (e.g. 10)"
        )


def check_fixed_epochs(callbacks, caller):
    """Raises a ``ValueError`` when a callback ends ``fit``'s epochs itself
    (a batch-size policy with ``epoch_end``): ``caller`` resumes epochs by
    their steps, which such epochs do not have.

    Example:

    >>> from keras_adapt.callbacks._common import check_fixed_epochs
    >>> from keras_adapt.policies import GNSBatchSizePolicy
    >>> check_fixed_epochs([GNSBatchSizePolicy(16, 64, micro_batch_size=16)], "fit")
    >>> policy = GNSBatchSizePolicy(16, 64, micro_batch_size=16, epoch_end="samples",
    ...                             samples_per_epoch=1000)
    >>> check_fixed_epochs([policy], "fit")
    Traceback (most recent call last):
    ...
    ValueError: fit resumes epochs of fixed steps; GNSBatchSizePolicy(epoch_end='samples') ends them on its count. Use epoch_end=None there, or model.fit.
    """
    for cb in callbacks:
        end = getattr(cb, "epoch_end", None)
        if end is not None:
            raise ValueError(
                f"{caller} resumes epochs of fixed steps; {type(cb).__name__}(epoch_end="
                f"{end!r}) ends them on its count. Use epoch_end=None there, or model.fit.")


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
