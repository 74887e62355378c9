"""``AllReduceSGD``: synchronous SGD on averaged gradients (the default)."""

from keras_adapt.record import metadata
from keras_adapt.sync.base import SyncStrategy


class AllReduceSGD(SyncStrategy):
    """Synchronous SGD: every update applies the gradient averaged over the
    workers, x <- x - lr * mean_i(g_i) (one grouped allreduce of the gradients
    per update). The default strategy, and exactly keras-adapt's plain
    path: when it is the only declared strategy nothing else is added to the
    train step.

    Weights and optimizer slots stay identical on every rank, since every
    rank applies the same averaged gradient. On every switch *into*
    AllReduceSGD the first update averages the weights and slots of all
    ranks first, so they are identical again.

    Example:

    >>> from keras_adapt.sync import AllReduceSGD
    >>> AllReduceSGD(), AllReduceSGD().local
    (AllReduceSGD(), False)
    """

    name = "allreduce_sgd"
    index = metadata.SYNC_STRATEGIES.index(name)
    local = False

    def params(self):
        return {}

    def synchronize(self, context):
        raise TypeError("AllReduceSGD averages gradients; it has no model synchronisation")
