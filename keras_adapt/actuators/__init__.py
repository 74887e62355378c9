"""Actuators: the small, reusable knobs that policies turn.

A policy decides; an actuator changes one thing in the running job, the
same way on every rank:

* :class:`GradientAccumulation` -- k micro-steps per optimizer update (a
  ``tf.Variable``, so changing it never retraces);
* :class:`LearningRateScale` -- a factor on top of the user's learning rate
  or schedule, with an optional warm-up ramp and AdaScale progress;
* :class:`GlobalBatchSize` -- the global batch ``workers x micro-batch x k``,
  using the two above and, when given, an
  :class:`keras_adapt.data.AdaptiveBatchDataset` for the micro-batch;
* :class:`WorkerTarget` -- the worker count the job asks for, written to the
  target file that ``keras-adapt discover`` reads (rank 0 writes);
* :class:`RankBatchSizes` -- a micro-batch per worker (straggler
  rebalance), the update still the mean gradient of the global batch;
* :class:`GradientCompression` -- float32 or float16 gradients in the
  allreduce (a ``tf.Variable`` under a ``tf.cond``: switching never retraces);
* :class:`HostExclusion` -- hosts left out of the job, written to the
  exclusion file that ``keras-adapt discover`` reads (rank 0 writes).
"""

from keras_adapt.actuators.batch_size import GlobalBatchSize
from keras_adapt.actuators.compression import GradientCompression
from keras_adapt.actuators.gradient_accumulation import GradientAccumulation
from keras_adapt.actuators.host_exclusion import HostExclusion
from keras_adapt.actuators.learning_rate import LearningRateScale
from keras_adapt.actuators.rank_batch_sizes import RankBatchSizes
from keras_adapt.actuators.workers import WorkerTarget

__all__ = ["GlobalBatchSize", "GradientAccumulation", "GradientCompression", "HostExclusion",
           "LearningRateScale", "RankBatchSizes", "WorkerTarget"]
