"""Learning-rate scaling rules: how the learning rate follows the batch size.

A rule maps the scale ``s = B / B0`` of the current global batch B over the
batch B0 the learning rate was tuned for to a factor on that learning rate:

* :class:`NoScaling`: 1;
* :class:`LinearScaling`: s (Goyal et al. 2017), usually with a warm-up;
* :class:`SqrtScaling`: sqrt(s) (Krizhevsky 2014; Hoffer et al. 2017), for
  adaptive optimizers such as Adam;
* :class:`AdaScale`: the gain r = (sigma^2 + mu^2) / (sigma^2 / s + mu^2)
  from the measured gradient statistics (Johnson et al. 2020), between 1
  and s, together with scale-invariant progress (a schedule advances by r
  per update).

``warmup_steps`` ramps the learning rate linearly from its old to its new
value over that many updates after every change.

Example:

>>> from keras_adapt.formulas import scaling_rules as r
>>> r.LinearScaling().factor(4.0), r.SqrtScaling().factor(4.0), r.NoScaling().factor(4.0)
(4.0, 2.0, 1.0)
>>> stats = {"grad_sqr": 1.0, "grad_var": 64.0}   # |G|^2 = 1, tr(Sigma) = 64
>>> round(r.AdaScale().factor(4.0, stats, base_batch=32), 4)   # sigma^2 = 2
2.0
"""

import math

from keras_adapt.checks import check_int


class ScalingRule:
    """Base class: subclasses implement :meth:`factor`.

    Args:
        warmup_steps: updates over which a new learning rate is ramped in.

    Example:

    >>> from keras_adapt.formulas.scaling_rules import ScalingRule
    >>> class Cubic(ScalingRule):
    ...     def factor(self, scale, stats=None, base_batch=None):
    ...         return scale ** (1 / 3)
    >>> round(Cubic().factor(8.0), 6)
    2.0
    """

    #: True when the factor depends on measurements and is updated every
    #: interval, not only when the batch size changes.
    continuous = False
    #: True when a learning-rate schedule should advance by the factor per
    #: update (scale-invariant progress) instead of by one.
    uses_progress = False

    def __init__(self, warmup_steps=0):
        self.warmup_steps = check_int(
            "warmup_steps", warmup_steps, 0,
            fix="use an int >= 0 (the updates over which the learning rate ramps to its new value)")

    def factor(self, scale, stats=None, base_batch=None):
        """The learning-rate factor for batch scale ``scale = B / B0``."""
        raise NotImplementedError

    def get_config(self):
        """The constructor arguments, for :func:`get`."""
        return {"warmup_steps": self.warmup_steps}

    def __repr__(self):
        return f"{type(self).__name__}(warmup_steps={self.warmup_steps})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()


class NoScaling(ScalingRule):
    """Keeps the learning rate as configured, whatever the batch.

    Example:

    >>> from keras_adapt.formulas.scaling_rules import NoScaling
    >>> NoScaling().factor(8.0)
    1.0
    """

    def factor(self, scale, stats=None, base_batch=None):
        return 1.0


class LinearScaling(ScalingRule):
    """Learning rate proportional to the batch: factor s (Goyal et al. 2017).

    Example:

    >>> from keras_adapt.formulas.scaling_rules import LinearScaling
    >>> LinearScaling(warmup_steps=100).factor(8.0)
    8.0
    """

    def factor(self, scale, stats=None, base_batch=None):
        return float(scale)


class SqrtScaling(ScalingRule):
    """Learning rate proportional to the square root of the batch: factor sqrt(s).

    Example:

    >>> from keras_adapt.formulas.scaling_rules import SqrtScaling
    >>> SqrtScaling().factor(16.0)
    4.0
    """

    def factor(self, scale, stats=None, base_batch=None):
        return math.sqrt(float(scale))


class AdaScale(ScalingRule):
    """AdaScale's gain from the measured gradient statistics (Johnson et al. 2020).

    With sigma^2 = tr(Sigma) / B0 (the gradient variance at the base batch)
    and mu^2 = |G|^2, the gain for scale s is
    ``r = (sigma^2 + mu^2) / (sigma^2 / s + mu^2)``, which lies in [1, s]:
    close to s while noise dominates, close to 1 once the gradient is
    clean. The learning rate is ``r x lr(tau)`` where the schedule is
    evaluated at the progress tau, which grows by r per update. Without
    usable statistics (before the first measurement) r is 1.

    Example:

    >>> from keras_adapt.formulas.scaling_rules import AdaScale
    >>> rule = AdaScale()
    >>> rule.factor(4.0, {"grad_sqr": 0.0, "grad_var": 10.0}, base_batch=8)   # all noise
    4.0
    >>> rule.factor(4.0, {"grad_sqr": 5.0, "grad_var": 0.0}, base_batch=8)    # no noise
    1.0
    """

    continuous = True
    uses_progress = True

    def factor(self, scale, stats=None, base_batch=None):
        return adascale_gain(scale, stats, base_batch)


def adascale_gain(scale, stats, base_batch):
    """AdaScale's gain ``r = (sigma^2 + mu^2) / (sigma^2 / s + mu^2)`` for
    batch scale ``s``, with sigma^2 = ``grad_var`` / ``base_batch`` and
    mu^2 = ``grad_sqr`` (clipped to [1, s]; 1 without usable statistics).

    It is also the statistical efficiency of the batch ``B = s x B0``
    against ``B0`` times s: ``r / s = (phi + B0) / (phi + B)`` with the noise
    scale phi = ``grad_var / grad_sqr`` (Pollux's efficiency), so one update
    at B makes ``r`` updates' worth of progress at B0 (AdaScale's
    scale-invariant iterations; :class:`keras_adapt.policies.TrainingProgress`
    counts it). :class:`AdaScale` scales the learning rate by it.

    Example:

    >>> from keras_adapt.formulas.scaling_rules import adascale_gain
    >>> stats = {"grad_sqr": 1.0, "grad_var": 64.0}      # noise scale 64
    >>> adascale_gain(4.0, stats, base_batch=32)          # (64 + 32) / (64 + 128) x 4
    2.0
    >>> adascale_gain(4.0, {}, base_batch=32)             # nothing measured yet
    1.0
    """
    scale = float(scale)
    if stats is None or not base_batch:
        return 1.0
    mu2 = stats.get("grad_sqr")
    var = stats.get("grad_var")
    if mu2 is None or var is None or not (math.isfinite(mu2) and math.isfinite(var)):
        return 1.0
    sigma2 = max(var, 0.0) / float(base_batch)
    mu2 = max(mu2, 0.0)
    denominator = sigma2 / scale + mu2
    if denominator <= 0.0:
        return 1.0
    return min(max((sigma2 + mu2) / denominator, 1.0), max(scale, 1.0))

RULES = {"none": NoScaling, "linear": LinearScaling, "sqrt": SqrtScaling, "adascale": AdaScale}


def get(rule):
    """A :class:`ScalingRule` from an instance, a name or a config dict.

    Names: ``"none"``, ``"linear"``, ``"sqrt"``, ``"adascale"``.

    Example:

    >>> from keras_adapt.formulas import scaling_rules
    >>> scaling_rules.get("sqrt"), scaling_rules.get({"name": "linear", "warmup_steps": 5})
    (SqrtScaling(warmup_steps=0), LinearScaling(warmup_steps=5))
    """
    if isinstance(rule, ScalingRule):
        return rule
    if isinstance(rule, dict):
        config = dict(rule)
        name = config.pop("name", None)
        return _by_name(name)(**config)
    if isinstance(rule, str):
        return _by_name(rule)()
    raise ValueError(
        f"scaling rule {rule!r} is not valid; use one of {sorted(RULES)} or a ScalingRule instance"
    )


def _by_name(name):
    key = str(name).lower().replace("_", "").replace("scaling", "") if name else ""
    if key not in RULES:
        raise ValueError(
            f"unknown scaling rule {name!r}; use one of {sorted(RULES)} or a ScalingRule instance"
        )
    return RULES[key]


def serialize(rule):
    """The config dict of ``rule`` (with its name), for ``get_config``.

    Example:

    >>> from keras_adapt.formulas import scaling_rules
    >>> scaling_rules.serialize(scaling_rules.SqrtScaling(10))
    {'name': 'sqrt', 'warmup_steps': 10}
    """
    if rule is None:
        return None
    name = {cls: n for n, cls in RULES.items()}.get(type(rule))
    if name is None:
        raise ValueError(f"{rule!r} is a custom rule; serialise it yourself")
    return {"name": name, **rule.get_config()}
