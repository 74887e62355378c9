"""``PairAveraging``: asynchronous decentralised training (AD-PSGD's pair averaging)."""

import tensorflow as tf

from keras_adapt.checks import check_float, check_int
from keras_adapt.record import metadata
from keras_adapt.sync.base import SyncStrategy


class PairAveraging(SyncStrategy):
    """Asynchronous pair averaging (AD-PSGD, Lian et al. 2018; KungFu's
    asynchronous decentralised SGD): each worker applies its own gradient
    and, every ``period`` (H) updates, sends its model to one peer (in turn)
    and averages its model with the newest model a peer has sent it,
    x_i <- (x_i + x_j) / 2, without waiting for anyone: there is no global
    barrier, so a slow worker holds nobody back. A worker that has received
    nothing new since its last exchange goes on with its own model.

    Staleness is bounded: a peer model more than ``max_staleness`` updates
    older than the worker's own (model versions, see
    :mod:`keras_adapt.sync.peer_exchange`) is not averaged with. What each
    worker averaged with, and how stale it was, is in
    ``optimizer.adapt_state.sync.exchange.record``
    (:class:`~keras_adapt.sync.peer_exchange.ExchangeRecord`).

    The models travel over ZeroMQ (``pip install 'keras-adapt[async]'``),
    not Horovod; each worker binds its own host's address (the one
    ``horovodrun -H`` names, or ``$KERAS_ADAPT_EXCHANGE_ADDRESS``). Entering
    the strategy (the first update, a switch into it, an elastic re-form) is
    the one moment all workers meet: they average their models and exchange
    addresses. The gradient statistics are not measured while it runs (that
    would be a collective every ``stats_interval`` updates); they keep their
    last values. Optimizer slots stay local.

    Args:
        period: H >= 1, updates between exchanges.
        max_staleness: > 0, the most updates a peer's model may lag this
            worker's and still be averaged with.

    Example:

    >>> from keras_adapt.sync import PairAveraging
    >>> PairAveraging(period=2, max_staleness=8.0)
    PairAveraging(period=2, max_staleness=8.0)
    """

    name = "pair_averaging"
    index = metadata.SYNC_STRATEGIES.index(name)
    agrees = False
    asynchronous = True  # the statistics are not measured: no collective

    def __init__(self, period=1, max_staleness=16.0):
        self.period = check_int("period", period, 1, owner="PairAveraging")
        self.max_staleness = check_float("max_staleness", max_staleness, 0.0, low_open=True,
                                         owner="PairAveraging")

    def params(self):
        return {"period": self.period, "max_staleness": self.max_staleness}

    def synchronize(self, context):
        exchange = context.exchange
        weights = context.weights

        def host(updates, *arrays):
            mixed = exchange.exchange(int(updates), arrays)
            if mixed is None:
                return (False, *arrays)
            return (True, *mixed)

        out = tf.numpy_function(host, [context.updates + 1] + [tf.convert_to_tensor(w)
                                                                for w in weights],
                                [tf.bool] + [w.dtype for w in weights], stateful=True,
                                name="pair_exchange")
        averaged, mixed = out[0], out[1:]
        for m, w in zip(mixed, weights):
            m.set_shape(w.shape)

        def assign():
            return context.assign(weights, mixed)

        return tf.cond(tf.reshape(averaged, []), lambda: _run(assign()), lambda: tf.constant(False))


def _run(op):
    with tf.control_dependencies([op]):
        return tf.constant(True)
