"""Measure: in-graph statistics that the policies decide on."""

from keras_adapt.monitors.gradient_stats import GradientStatistics

__all__ = ["GradientStatistics"]
