"""``ElasticAveraging``: synchronous elastic averaging SGD (EASGD)."""

import tensorflow as tf

from keras_adapt.checks import check_float, check_int
from keras_adapt.record import metadata
from keras_adapt.sync.base import SyncStrategy


class ElasticAveraging(SyncStrategy):
    """Synchronous EASGD (Zhang et al. 2015): each worker applies its own
    gradient; every ``period`` (H) updates the workers are pulled towards a
    centre variable x~ that moves towards their mean. With alpha = lr * rho
    and beta = N * alpha (lr: the optimizer's current learning rate):

        x_i <- x_i - alpha * (x_i - x~)
        x~  <- (1 - beta) * x~ + beta * mean_i(x_i)

    (both from the models before this synchronisation). x~ is made at the
    first trace when ElasticAveraging is a declared candidate and set to the
    workers' mean model on every switch into it. Keep beta <= 1 (rho <=
    1 / (N * lr)). Costs one grouped allreduce of the weights per H updates.
    Optimizer slots stay local.

    Args:
        period: H >= 1, updates between elastic steps.
        rho: the elasticity rho > 0.

    Example:

    >>> from keras_adapt.sync import ElasticAveraging
    >>> ElasticAveraging(period=4, rho=2.0)
    ElasticAveraging(period=4, rho=2.0)
    """

    name = "elastic_averaging"
    index = metadata.SYNC_STRATEGIES.index(name)
    agrees = False

    def __init__(self, period=4, rho=1.0):
        self.period = check_int("period", period, 1, owner="ElasticAveraging")
        self.rho = check_float("rho", rho, 0.0, low_open=True, finite=False,
                               owner="ElasticAveraging")

    def params(self):
        return {"period": self.period, "rho": self.rho}

    @staticmethod
    def state_names():
        """The names of the per-weight state this strategy keeps."""
        return ("centre",)

    def synchronize(self, context):
        alpha = tf.cast(context.learning_rate(), tf.float32) * context.variables["rho"]
        beta = float(context.num_workers) * alpha
        centre = context.extra["centre"]
        means = context.mean(context.weights)
        ops = []
        for x, m, c in zip(context.weights, means, centre):
            a, b = tf.cast(alpha, m.dtype), tf.cast(beta, m.dtype)
            x_value, c_value = tf.convert_to_tensor(x), tf.convert_to_tensor(c)
            ops.append(x.assign(x_value - a * (x_value - c_value)))
            ops.append(c.assign((1.0 - b) * c_value + b * m))
        return tf.group(ops)
