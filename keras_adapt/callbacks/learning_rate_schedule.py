"""LearningRateScheduleCallback: Horovod's per-epoch learning-rate multiplier."""

import warnings

import keras
import numpy as np
import tensorflow as tf

from keras_adapt import optimizer as _optimizer
from keras_adapt.checks import check_bool, check_float, check_int


def _read(value):
    return float(np.asarray(value.numpy() if hasattr(value, "numpy") else value))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr x multiplier(epoch)`` between
    ``start_epoch`` and ``end_epoch`` (Horovod's callback, same arguments).

    With ``staircase=True`` the rate changes at the first batch of each
    epoch and ``multiplier`` gets the integer epoch; with ``staircase=False``
    it changes before every batch and gets ``epoch + batch /
    steps_per_epoch``. A constant ``multiplier`` m means ``m ** (epoch -
    start_epoch)`` (exponential decay). At each epoch end the logs get
    ``lr``, the effective rate.

    The rate it sets is the *base* rate: with keras-adapt's learning-rate
    factor active (``LearningRateScale``, the batch-size policies'
    scaling rules) the effective rate is ``initial_lr x multiplier x
    factor`` on both stacks, so a batch-size policy's scaling composes with
    the schedule instead of being overwritten. The optimizer's learning
    rate must be a float (or variable), not a ``LearningRateSchedule``.

    ``momentum_correction`` (Goyal et al. 2017): for the batch in which the
    rate changes, momentum is multiplied by ``new_lr / old_lr`` and then
    restored. It takes effect only where momentum is a variable of the
    compiled step (tf.keras 2 ``keras.optimizers.legacy`` optimizers); on
    Keras 3 and tf.keras 2's new optimizers momentum is a constant of the
    traced step, so it is skipped there (one warning).

    Args:
        initial_lr: the learning rate the multiplier scales (None: the
            optimizer's rate at the start of training).
        multiplier: a number, or a function ``f(epoch) -> float``.
        start_epoch: first epoch it applies to.
        end_epoch: first epoch it no longer applies to (None: no end).
        staircase: change per epoch (True) or per batch (False).
        momentum_correction: see above.
        steps_per_epoch: batches per epoch for ``staircase=False``; None:
            taken from ``fit``.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import LearningRateScheduleCallback
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> cb = LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=1)
    >>> h = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=3, verbose=0, callbacks=[cb])
    >>> [round(v, 6) for v in h.history["lr"]]
    [0.1, 0.1, 0.05]
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = check_float("initial_lr", initial_lr, none=True)
        check_int("start_epoch", start_epoch, 0)
        check_int("end_epoch", end_epoch, start_epoch + 1, none=True,
                  fix=f"use None or an int > start_epoch ({start_epoch})")
        check_bool("staircase", staircase)
        check_bool("momentum_correction", momentum_correction)
        steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, none=True)
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            constant = check_float("multiplier", multiplier)
            self.multiplier = lambda epoch: constant ** (epoch - start_epoch)
        self.start_epoch = int(start_epoch)
        self.end_epoch = None if end_epoch is None else int(end_epoch)
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self._epoch = None
        self._base = None
        self._restore_momentum = None
        self._warned = False

    # -- the rule -------------------------------------------------------------

    def learning_rate_at(self, epoch, batch=0):
        """The base rate this callback sets before ``batch`` of ``epoch``, or
        None where it does not act (outside its epochs; with a staircase, on
        batches after the first)."""
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return None
        if self.staircase:
            return None if batch != 0 else self.initial_lr * self.multiplier(epoch)
        return self.initial_lr * self.multiplier(epoch + float(batch) / self.steps_per_epoch)

    # -- Keras hooks ------------------------------------------------------------

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if self.initial_lr is None:
            self.initial_lr = _optimizer.base_learning_rate(optimizer)
        if not self.staircase and not self.steps_per_epoch:
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ValueError(
                    f"{type(self).__name__} could not find the number of steps per epoch "
                    "in fit()'s parameters; pass steps_per_epoch=..."
                )
            self.steps_per_epoch = int(steps)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        lr = self.learning_rate_at(self._epoch, batch)
        if lr is None:
            return
        optimizer = self.model.optimizer
        old = self._base if self._base is not None else _optimizer.base_learning_rate(optimizer)
        _optimizer.set_base_learning_rate(optimizer, lr)
        self._base = lr
        if self.momentum_correction and old > 0:
            self._correct_momentum(optimizer, lr / old)

    def _correct_momentum(self, optimizer, ratio):
        momentum = getattr(optimizer, "momentum", None)
        if momentum is None or ratio == 1.0:
            return
        if isinstance(momentum, tf.Variable) or hasattr(optimizer, "_set_hyper"):
            self._restore_momentum = _read(momentum)
            optimizer.momentum = self._restore_momentum * ratio
        elif _read(momentum) != 0.0 and not self._warned:
            self._warned = True
            warnings.warn(
                f"{type(self).__name__}: momentum_correction is not applied: "
                f"{type(optimizer).__name__}'s momentum is a constant of the compiled "
                "train step on this Keras. Use momentum_correction=False to silence this.",
                RuntimeWarning,
                stacklevel=2,
            )

    def on_train_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            self.model.optimizer.momentum = self._restore_momentum
            self._restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _optimizer.effective_learning_rate(self.model.optimizer)
