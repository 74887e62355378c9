"""``LocalSGD``: local steps, models averaged every H updates (post-local SGD)."""

from keras_adapt.checks import check_int
from keras_adapt.record import metadata
from keras_adapt.sync.base import SyncStrategy


class LocalSGD(SyncStrategy):
    """Local SGD (Lin et al., ICLR 2020): each worker applies its own gradient;
    every ``period`` (H) updates the models are averaged, x_i <- mean_j(x_j).

    With ``start_after=s`` it is *post-local SGD*: the first s updates under
    this strategy (counted from when it is selected: from the first update
    when the optimizer is created with it) are ordinary AllReduceSGD updates,
    and local steps start after them (Lin et al. switch after the first
    learning-rate decay). Costs one grouped allreduce of the weights per H
    updates. Optimizer slots stay local (as in Lin et al.).

    Args:
        period: H >= 1, updates between averagings.
        start_after: s >= 0, AllReduceSGD updates before local steps start.

    Example:

    >>> from keras_adapt.sync import LocalSGD
    >>> LocalSGD(period=16, start_after=1000)
    LocalSGD(period=16, start_after=1000)
    """

    name = "local_sgd"
    index = metadata.SYNC_STRATEGIES.index(name)

    def __init__(self, period=8, start_after=0):
        self.period = check_int("period", period, 1, owner="LocalSGD")
        self.start_after = check_int("start_after", start_after, 0, owner="LocalSGD")

    def params(self):
        return {"period": self.period, "start_after": self.start_after}

    def sync_due(self, variables, count):
        # H-th local update after the start_after AllReduceSGD updates.
        return super().sync_due(variables, count - variables["start_after"])

    def synchronize(self, context):
        return context.assign(context.weights, context.mean(context.weights))
