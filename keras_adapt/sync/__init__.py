"""Synchronisation strategies: how the workers' models agree.

* :class:`AllReduceSGD` -- averaged gradients every update (the default);
* :class:`ModelAveraging` -- KungFu's synchronous model averaging (SMA);
* :class:`LocalSGD` -- local steps, models averaged every H updates
  (post-local SGD with ``start_after``);
* :class:`BlockMomentum` -- BMUF, block-level momentum every H updates;
* :class:`ElasticAveraging` -- synchronous EASGD with a centre variable;
* :class:`PairAveraging` -- asynchronous pair averaging (AD-PSGD), no barrier.

Declare them with ``DistributedOptimizer(..., sync_strategy=...)`` and switch
with ``optimizer.adapt_state.sync.set(...)`` (:class:`SyncState`), without
retracing. See docs/sync_strategies.md.

Example:

>>> import keras, keras_adapt
>>> from keras_adapt.sync import AllReduceSGD, LocalSGD
>>> opt = keras_adapt.DistributedOptimizer(
...     keras.optimizers.SGD(0.1), sync_strategy=[AllReduceSGD(), LocalSGD(period=8)])
>>> opt.adapt_state.sync.set("local_sgd")
>>> opt.adapt_state.sync.strategy.name
'local_sgd'
"""

from keras_adapt.sync.allreduce import AllReduceSGD
from keras_adapt.sync.base import SyncContext, SyncStrategy
from keras_adapt.sync.block_momentum import BlockMomentum
from keras_adapt.sync.elastic_averaging import ElasticAveraging
from keras_adapt.sync.local_sgd import LocalSGD
from keras_adapt.sync.model_averaging import ModelAveraging
from keras_adapt.sync.pair_averaging import PairAveraging
from keras_adapt.sync.peer_exchange import ExchangeRecord, PeerExchange
from keras_adapt.sync.sync_state import STRATEGIES, SyncState, candidates_from

__all__ = [
    "STRATEGIES",
    "AllReduceSGD",
    "BlockMomentum",
    "ElasticAveraging",
    "ExchangeRecord",
    "LocalSGD",
    "ModelAveraging",
    "PairAveraging",
    "PeerExchange",
    "SyncContext",
    "SyncState",
    "SyncStrategy",
    "candidates_from",
]
