"""Measure: in-graph statistics that the policies decide on, and the marks
that keep work which is not training out of the step timers."""

from keras_adapt.monitors.gradient_stats import GradientStatistics
from keras_adapt.monitors.step_pauses import paused, skip_update

__all__ = ["GradientStatistics", "paused", "skip_update"]
