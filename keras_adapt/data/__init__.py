"""Datasets: adaptive input streams and seeded synthetic tasks (no downloads).

* :class:`AdaptiveBatchDataset`: in-memory arrays, sharded and shuffled for you;
* :class:`AdaptiveBatchPipeline`: your own ``tf.data`` pipeline, batched with a
  size policies can change;
* :func:`fixed_batch_size`: the micro-batch of an ordinary batched
  ``tf.data.Dataset`` (policies then change only the accumulation steps).
"""

from keras_adapt.data.adaptive_batch_dataset import AdaptiveBatchDataset
from keras_adapt.data.adaptive_batch_pipeline import AdaptiveBatchPipeline
from keras_adapt.data.fixed_batch import fixed_batch_size
from keras_adapt.data.synthetic import (
    linear_regression,
    linear_regression_gradient_stats,
    teacher_student,
)

__all__ = [
    "AdaptiveBatchDataset",
    "AdaptiveBatchPipeline",
    "fixed_batch_size",
    "linear_regression",
    "linear_regression_gradient_stats",
    "teacher_student",
]
