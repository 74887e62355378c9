"""LearningRateWarmupCallback: Horovod's gradual warm-up from lr/size to lr."""

from keras_adapt import _hvd
from keras_adapt.callbacks.learning_rate_schedule import LearningRateScheduleCallback
from keras_adapt.checks import check_choice, check_int


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Warms the learning rate up from ``initial_lr / size`` to ``initial_lr``
    over ``warmup_epochs`` epochs, before every batch (Goyal et al. 2017;
    Horovod's callback, same arguments and values).

    With N workers, before batch ``b`` of epoch ``e`` (``s`` batches per
    epoch) the rate is ``initial_lr / N x (1 + (N - 1) x (e + (b + 1) / s)
    / warmup_epochs)``, so it reaches ``initial_lr`` exactly at the last
    batch of the warm-up. The rate is the base rate under keras-adapt's
    learning-rate factor (see :class:`LearningRateScheduleCallback`).

    Args:
        initial_lr: the rate after the warm-up (usually the single-worker
            rate times the number of workers).
        warmup_epochs: length of the warm-up in epochs.
        momentum_correction: see :class:`LearningRateScheduleCallback`.
        steps_per_epoch: batches per epoch; None: taken from ``fit``.
        verbose: 1 prints a line on rank 0 when the warm-up ends.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import LearningRateWarmupCallback
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> cb = LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2)
    >>> h = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=3, verbose=0, callbacks=[cb])
    >>> [round(v, 6) for v in h.history["lr"]]   # one worker: nothing to warm up
    [0.1, 0.1, 0.1]
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        self.warmup_epochs = check_int("warmup_epochs", warmup_epochs)
        self.verbose = check_choice("verbose", verbose, (0, 1))

        def multiplier(epoch):
            size = _hvd.size()
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose and _hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{self._base:g}.")
