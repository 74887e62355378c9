"""``BlockMomentum``: block-wise model-update filtering (BMUF)."""

import tensorflow as tf

from keras_adapt.checks import check_bool, check_float, check_int
from keras_adapt.record import metadata
from keras_adapt.sync.base import SyncStrategy


class BlockMomentum(SyncStrategy):
    """Block-wise model-update filtering (BMUF, Chen & Huo 2016): each worker
    applies its own gradient; every ``period`` (H) updates the averaged
    model's change over the block goes through a block-level momentum step
    on a global model x_g:

        delta = mean_j(x_j) - s   (s: where the workers started the block)
        v <- block_momentum * v + block_lr * delta
        x_g <- x_g + v
        x_i <- s <- x_g  (Nesterov: x_g + block_momentum * v)

    (Chen & Huo's G(t) = mean(x) - W_g(t-1): with Nesterov the change is
    measured from the look-ahead model the workers started from, not from
    x_g; measured from x_g the look-ahead would be counted twice and, with
    the paper's block_momentum = 1 - 1/N = 0.5 and block_lr = 1, v would
    never decay.)

    x_g and v are made at the first trace when BlockMomentum is a declared
    candidate; on every switch into BlockMomentum, x_g is set to the workers'
    mean model and v to zero. Costs one grouped allreduce of the weights per
    H updates. Optimizer slots stay local.

    Args:
        period: H >= 1, updates per block.
        block_lr: zeta > 0, the block learning rate (1.0 in the paper).
        block_momentum: mu_b in [0, 1) (the paper: 1 - 1/N).
        nesterov: restart the workers from the look-ahead model.

    Example:

    >>> from keras_adapt.sync import BlockMomentum
    >>> BlockMomentum(period=8, block_momentum=0.5).params()
    {'period': 8, 'block_lr': 1.0, 'block_momentum': 0.5, 'nesterov': True}
    """

    name = "block_momentum"
    index = metadata.SYNC_STRATEGIES.index(name)

    def __init__(self, period=8, block_lr=1.0, block_momentum=0.5, nesterov=True):
        self.period = check_int("period", period, 1, owner="BlockMomentum")
        self.block_lr = check_float("block_lr", block_lr, 0.0, low_open=True, finite=False,
                                    owner="BlockMomentum")
        self.block_momentum = check_float("block_momentum", block_momentum, 0.0, 1.0,
                                          high_open=True, owner="BlockMomentum")
        self.nesterov = check_bool("nesterov", nesterov, owner="BlockMomentum", error=ValueError)

    def params(self):
        return {"period": self.period, "block_lr": self.block_lr,
                "block_momentum": self.block_momentum, "nesterov": self.nesterov}

    @staticmethod
    def state_names():
        """The names of the per-weight state this strategy keeps."""
        return ("global_model", "block_velocity")

    def synchronize(self, context):
        mu = context.variables["block_momentum"]
        zeta = context.variables["block_lr"]
        nesterov = context.variables["nesterov"]
        x_g, v = context.extra["global_model"], context.extra["block_velocity"]
        means = context.mean(context.weights)
        ops = []
        for x, m, g, vel in zip(context.weights, means, x_g, v):
            mu_t = tf.cast(mu, m.dtype)
            # The block's change is measured from where the workers started
            # it: x_g, or with Nesterov the look-ahead x_g + mu_b * v.
            began = tf.where(nesterov, g + mu_t * vel, g)
            new_v = mu_t * vel + tf.cast(zeta, m.dtype) * (m - began)
            new_g = g + new_v
            start = tf.where(nesterov, new_g + mu_t * new_v, new_g)
            ops += [vel.assign(new_v), g.assign(new_g), x.assign(start)]
        return tf.group(ops)
