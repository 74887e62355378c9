"""Datasets: the adaptive input stream and seeded synthetic tasks (no downloads)."""

from keras_adapt.data.adaptive_batch_dataset import AdaptiveBatchDataset
from keras_adapt.data.synthetic import (
    linear_regression,
    linear_regression_gradient_stats,
    teacher_student,
)

__all__ = [
    "AdaptiveBatchDataset",
    "linear_regression",
    "linear_regression_gradient_stats",
    "teacher_student",
]
