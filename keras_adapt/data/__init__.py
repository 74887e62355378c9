"""Data helpers: seeded synthetic tasks (and, later, adaptive re-batching)."""

from keras_adapt.data.synthetic import (
    linear_regression,
    linear_regression_gradient_stats,
    teacher_student,
)

__all__ = ["linear_regression", "linear_regression_gradient_stats", "teacher_student"]
