"""Keeps the learning-rate factor consistent with the global batch under a rule."""

import math

from keras_adapt.actuators import LearningRateScale
from keras_adapt.formulas import scaling_rules


class LRFollower:
    """Applies a :class:`ScalingRule` for the scale ``batch / base_batch``.

    Shared by :class:`LRScalingPolicy` and the batch-size policies' optional
    ``scaling_rule``. Returns the (before, after) of a change worth an event,
    or None: a change of less than ``tolerance`` (relative) is not made, so
    AdaScale's continuous gain does not flood the event log.
    """

    def __init__(self, model, rule, tolerance=0.01):
        self.rule = scaling_rules.get(rule)
        self.lr = LearningRateScale(model, use_progress=self.rule.uses_progress)
        self.tolerance = tolerance

    def update(self, batch, base_batch, stats):
        scale = batch / base_batch
        factor = self.rule.factor(scale, stats, base_batch)
        if not math.isfinite(factor) or factor <= 0:
            return None
        old = self.lr.target
        if self.rule.uses_progress:
            self.lr.gain = factor
        if abs(factor - old) <= self.tolerance * old:
            return None
        before = {"lr": self.lr.current_lr(), "lr_factor": self.lr.factor}
        self.lr.set(factor, warmup_steps=self.rule.warmup_steps)
        after = {"lr": self.lr.base_lr() * factor, "lr_factor": factor, "scale": scale}
        return before, after
