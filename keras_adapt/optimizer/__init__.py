"""``DistributedOptimizer``: Horovod gradient averaging plus in-graph gradient statistics.

The package follows one optimizer update:

* :mod:`~keras_adapt.optimizer.factory` -- :func:`DistributedOptimizer`
  makes the distributed class from a Keras optimizer and its settings;
* :mod:`~keras_adapt.optimizer.settings` -- :class:`AdaptSettings`, those
  settings as one frozen object, their defaults and their checks;
* :mod:`~keras_adapt.optimizer._bindings` -- the Keras 3 and tf.keras 2
  hooks (``apply`` / ``apply_gradients``, the learning rate);
* :mod:`~keras_adapt.optimizer._step` -- the order of a step: accumulate,
  reduce (one grouped allreduce carries the gradients and the measurement),
  measure, apply or skip;
* :mod:`~keras_adapt.optimizer.statistics` -- what the statistics are
  computed from with N >= 2 workers, N = 1, or N x k micro-steps;
* :mod:`~keras_adapt.optimizer.batch_weighting` -- the batch-weighted
  mean when the workers' micro-batches differ (straggler rebalance);
* :mod:`~keras_adapt.optimizer.compression_switch` -- float32 or float16
  gradients, switched while training runs without a new trace;
* :mod:`~keras_adapt.optimizer.accumulation`,
  :mod:`~keras_adapt.optimizer.lr_control` -- state that actuators change
  without retracing;
* :mod:`~keras_adapt.optimizer.adapt_state` -- :class:`AdaptState`, the public
  object (``optimizer.adapt_state``) through which callbacks, actuators and
  policies reach all of the above;
* :mod:`~keras_adapt.optimizer.learning_rate` -- the user's and the
  effective learning rate, read and set on the host.

Example:

>>> import keras, keras_adapt
>>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
>>> keras_adapt.optimizer.is_distributed(opt), type(opt).__name__
(True, 'SGD')
"""

from keras_adapt.optimizer.accumulation import AccumulationState, UpdateBoundary, enable_accumulation
from keras_adapt.optimizer._bindings import distributed_class
from keras_adapt.optimizer.batch_weighting import BatchWeighting
from keras_adapt.optimizer.compression_switch import CompressionSwitch
from keras_adapt.optimizer.factory import (
    DistributedOptimizer,
    distributed_class_like,
    is_distributed,
    require_distributed,
)
from keras_adapt.optimizer.learning_rate import (
    base_learning_rate,
    effective_learning_rate,
    set_base_learning_rate,
)
from keras_adapt.optimizer.lr_control import LearningRateControl, enable_lr_control, is_schedule
from keras_adapt.optimizer.settings import AdaptSettings
from keras_adapt.optimizer.slots import build_slots, optimizer_variables
from keras_adapt.optimizer.adapt_state import AdaptState, WorkerLocalVariables, variable_key
from keras_adapt.optimizer.statistics import DEFAULT_STATS_INTERVAL, PreviousGradient

__all__ = [
    "DEFAULT_STATS_INTERVAL",
    "AccumulationState",
    "AdaptSettings",
    "AdaptState",
    "BatchWeighting",
    "CompressionSwitch",
    "DistributedOptimizer",
    "LearningRateControl",
    "PreviousGradient",
    "WorkerLocalVariables",
    "base_learning_rate",
    "build_slots",
    "distributed_class",
    "distributed_class_like",
    "effective_learning_rate",
    "enable_accumulation",
    "UpdateBoundary",
    "enable_lr_control",
    "is_distributed",
    "is_schedule",
    "optimizer_variables",
    "require_distributed",
    "set_base_learning_rate",
    "variable_key",
]
