"""keras-adapt: adaptive distributed training for Keras on Horovod.

Replace ``hvd.DistributedOptimizer(opt)`` with
``keras_adapt.DistributedOptimizer(opt)``, add the callbacks you want from
``keras_adapt.callbacks``, and launch with ``horovodrun`` as before.

Example:

>>> import keras, keras_adapt
>>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.Adam(1e-3))
>>> callbacks = [keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0),
...              keras_adapt.callbacks.GradientStatsMonitor(interval=10)]
>>> keras_adapt.size() >= 1
True
"""

from keras_adapt import actuators, callbacks, data, events, monitors, ops, policies
from keras_adapt._hvd import local_rank, rank, size
from keras_adapt.optimizer import DistributedOptimizer
from keras_adapt.saving import load_model
from keras_adapt.version import __version__

__all__ = [
    "DistributedOptimizer",
    "__version__",
    "actuators",
    "callbacks",
    "data",
    "events",
    "load_model",
    "local_rank",
    "monitors",
    "ops",
    "policies",
    "rank",
    "size",
]
