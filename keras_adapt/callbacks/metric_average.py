"""MetricAverageCallback: epoch metrics averaged over all workers."""

import numbers

import keras
import numpy as np
import tensorflow as tf

from keras_adapt import _hvd


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each numeric epoch metric in ``logs`` by its mean over workers.

    Each worker measures loss and metrics on its own shard; without this,
    rank 0 reports only its shard. One allreduce per epoch carries all
    metrics together. Place it before callbacks that read the metrics
    (``CSVLogger``, ``TensorBoard``, ``ReduceLROnPlateau``, checkpointing).

    Example:

    >>> import keras_adapt
    >>> cb = keras_adapt.callbacks.MetricAverageCallback()
    >>> logs = {"loss": 0.5, "accuracy": 0.9}
    >>> cb.on_epoch_end(0, logs)   # one worker: unchanged
    >>> logs
    {'loss': 0.5, 'accuracy': 0.9}
    """

    def __init__(self):
        super().__init__()
        self._epoch_calls = 0

    def on_epoch_end(self, epoch, logs=None):
        if not logs or _hvd.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, numbers.Number)
                      or (isinstance(v, np.ndarray) and v.size == 1))
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        self._epoch_calls += 1
        averaged = _hvd.allreduce_average(
            values, name=f"keras_adapt_metric_average_{self._epoch_calls}"
        ).numpy()
        for k, v in zip(keys, averaged):
            logs[k] = float(v)
