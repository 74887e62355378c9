"""BestModelCheckpoint: keep the best model so far, written by rank 0 only."""

import keras

from keras_adapt import _hvd


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the model whenever ``monitor`` improves, on rank 0 only
    (Horovod's ``BestModelCheckpoint``: a ``ModelCheckpoint`` with
    ``save_best_only=True``).

    Other ranks do nothing, so N workers never write the same file at once.
    Put :class:`MetricAverageCallback` before it, so the value compared is
    the mean over workers rather than rank 0's shard.

    Unlike Horovod's, ``filepath`` is the first argument (Horovod's Spark
    estimator fills it in later; Keras' ``ModelCheckpoint`` needs it at
    construction): ``.keras`` for the whole model on Keras 3 (``.h5`` or
    ``.keras`` on tf.keras 2), ``.weights.h5`` with ``save_weights_only``.

    Args:
        filepath: where to save (may contain ``{epoch}`` and metric names).
        monitor, verbose, save_weights_only, mode, save_freq: as in
            ``keras.callbacks.ModelCheckpoint``.

    Example:

    >>> import os, tempfile, numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import BestModelCheckpoint
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> path = os.path.join(tempfile.mkdtemp(), "best.weights.h5")
    >>> cb = BestModelCheckpoint(path, monitor="loss", save_weights_only=True)
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=2, verbose=0, callbacks=[cb])
    >>> os.path.exists(path), cb.save_best_only
    (True, True)
    """

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_weights_only=False,
                 mode="auto", save_freq="epoch"):
        super().__init__(filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def on_train_batch_end(self, batch, logs=None):
        if _hvd.rank() == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if _hvd.rank() == 0:
            super().on_epoch_end(epoch, logs)
