"""Scaling rules against hand-computed values."""

import math

import pytest

from keras_adapt.formulas import scaling_rules
from keras_adapt.formulas.scaling_rules import (AdaScale, LinearScaling, NoScaling, ScalingRule,
                                                SqrtScaling)


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0, 16.0])
def test_simple_rules(scale):
    assert NoScaling().factor(scale) == 1.0
    assert LinearScaling().factor(scale) == scale
    assert SqrtScaling().factor(scale) == pytest.approx(math.sqrt(scale))


def test_adascale_gain_by_hand():
    # B0 = 16, tr(Sigma) = 48 -> sigma^2 = 3; |G|^2 = 1; s = 8:
    # r = (3 + 1) / (3/8 + 1) = 4 / 1.375
    stats = {"grad_sqr": 1.0, "grad_var": 48.0}
    assert AdaScale().factor(8.0, stats, base_batch=16) == pytest.approx(4.0 / 1.375)
    # s = 1 gives r = 1 whatever the statistics
    assert AdaScale().factor(1.0, stats, base_batch=16) == pytest.approx(1.0)
    # bounds: pure noise -> s, no noise -> 1, no statistics -> 1
    assert AdaScale().factor(8.0, {"grad_sqr": 0.0, "grad_var": 5.0}, 16) == 8.0
    assert AdaScale().factor(8.0, {"grad_sqr": 2.0, "grad_var": 0.0}, 16) == 1.0
    assert AdaScale().factor(8.0, {"grad_sqr": float("nan"), "grad_var": 1.0}, 16) == 1.0
    assert AdaScale().factor(8.0, None, 16) == 1.0
    assert AdaScale.uses_progress and AdaScale.continuous


def test_get_and_serialize_round_trip():
    for rule in (NoScaling(), LinearScaling(warmup_steps=7), SqrtScaling(3), AdaScale(1)):
        assert scaling_rules.get(scaling_rules.serialize(rule)) == rule
    assert isinstance(scaling_rules.get("Linear"), LinearScaling)
    assert isinstance(scaling_rules.get("sqrt_scaling"), SqrtScaling)


def test_unknown_rule_and_bad_warmup_are_clear_errors():
    with pytest.raises(ValueError, match="unknown scaling rule 'cubic'"):
        scaling_rules.get("cubic")
    with pytest.raises(ValueError, match="scaling rule 3"):
        scaling_rules.get(3)
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        LinearScaling(warmup_steps=-1)
    with pytest.raises(NotImplementedError):
        ScalingRule().factor(2.0)
