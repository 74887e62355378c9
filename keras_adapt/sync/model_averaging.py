"""``ModelAveraging``: synchronous model averaging (KungFu's SMA)."""

import tensorflow as tf

from keras_adapt.checks import check_float
from keras_adapt.record import metadata
from keras_adapt.sync.base import SyncStrategy


class ModelAveraging(SyncStrategy):
    """Synchronous model averaging (KungFu's SMA): each worker applies its own
    gradient, then on every update pulls its model towards the workers' mean,
    x_i <- (1 - alpha) * x_i + alpha * mean_j(x_j).

    Costs one grouped allreduce of the weights per update (as many bytes as
    S-SGD's gradients) but no gradient allreduce; ``alpha=1`` makes all models
    equal after each update, small ``alpha`` (KungFu: 0.1) keeps the workers'
    exploration. Optimizer slots stay local.

    Args:
        alpha: the pull towards the mean, in (0, 1].

    Example:

    >>> from keras_adapt.sync import ModelAveraging
    >>> ModelAveraging(alpha=0.1).params()
    {'alpha': 0.1}
    """

    name = "model_averaging"
    index = metadata.SYNC_STRATEGIES.index(name)
    agrees = False

    def __init__(self, alpha=0.1):
        self.alpha = check_float("alpha", alpha, 0.0, 1.0, low_open=True, owner="ModelAveraging")

    def params(self):
        return {"alpha": self.alpha}

    def sync_due(self, variables, count):
        return tf.constant(True)

    def synchronize(self, context):
        alpha = context.variables["alpha"]
        means = context.mean(context.weights)
        return context.assign(context.weights, [
            (1.0 - tf.cast(alpha, m.dtype)) * tf.convert_to_tensor(x) + tf.cast(alpha, m.dtype) * m
            for x, m in zip(context.weights, means)])
