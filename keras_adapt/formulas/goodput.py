"""Goodput: how much a sample is worth at a batch, and what a move of the batch gains.

Goodput is throughput times statistical efficiency: samples per second,
each discounted by how much progress it makes at global batch M given the
gradient noise scale phi (B_simple). The batch-size policies
(:class:`keras_adapt.policies.GoodputBatchSizePolicy`,
:class:`keras_adapt.policies.GNSBatchSizePolicy`) and the planner
(:mod:`keras_adapt.plan`) price batches with these functions; the step
times they need come from :mod:`keras_adapt.formulas.throughput`.

Example:

>>> from keras_adapt.formulas import goodput
>>> goodput.statistical_efficiency(96, 32, 32.0), goodput.goodput_gain(64, 32, 32.0)
(0.5, 1.3333333333333333)
"""

import math

__all__ = ["default_min_efficiency", "examples_efficiency", "goodput_gain",
           "statistical_efficiency", "step_time_ratio"]


def statistical_efficiency(batch, base_batch, gns):
    """Pollux's statistical efficiency E(M) = (phi + M0) / (phi + M), phi = B_simple.

    The progress one sample makes at batch M relative to the base batch M0:
    1 at M0, falling toward M0 / M once M is far beyond the noise scale.

    Example:

    >>> from keras_adapt.formulas.goodput import statistical_efficiency
    >>> statistical_efficiency(96, 32, 32.0)
    0.5
    """
    return (gns + base_batch) / (gns + batch)


def examples_efficiency(batch, gns):
    """What a sample at batch M is worth against one at a vanishing batch:
    ``phi / (phi + M)``, phi = B_simple.

    McCandlish et al. (2018): training to a given loss at batch M takes
    ``E_min (1 + M / phi)`` samples, so each is worth ``E_min / E`` of the
    least: 1/2 at the critical batch M = phi, 1/3 at 2 phi. Unlike
    :func:`statistical_efficiency` it does not depend on a base batch, so a
    floor on it bounds the batch by a multiple of the noise scale alone:
    ``examples_efficiency >= e`` means ``M <= phi (1 - e) / e``. The floor
    of :class:`keras_adapt.policies.GoodputBatchSizePolicy` is on it.

    Example:

    >>> from keras_adapt.formulas.goodput import examples_efficiency
    >>> examples_efficiency(64, 32.0)   # twice the noise scale: a third
    0.3333333333333333
    """
    return gns / (gns + batch)


def goodput_gain(batch, current, gns, time_ratio=1.0):
    """Goodput at global batch ``batch`` over goodput at ``current``.

    ``(M E(M)) / (C E(C)) x T(C) / T(M)`` with Pollux's
    :func:`statistical_efficiency` E at noise scale ``gns`` (the base batch
    cancels) and ``time_ratio`` = T(C) / T(M), the step times' ratio
    (:meth:`keras_adapt.policies.UpdateTimer.time_ratio`; 1: flat). Above
    1: ``batch`` makes more statistical progress per second. The one rule
    by which both batch-size policies price a move.

    Example:

    >>> from keras_adapt.formulas.goodput import goodput_gain
    >>> goodput_gain(64, 32, 32.0)          # 64 x 64 / (32 x 96), flat step times
    1.3333333333333333
    >>> goodput_gain(64, 32, 32.0, 0.5)     # ... but an update at 64 takes twice as long
    0.6666666666666666
    """
    return batch * (gns + current) / (current * (gns + batch)) * time_ratio


def default_min_efficiency(epoch_end):
    """The efficiency floor :class:`~keras_adapt.policies.GoodputBatchSizePolicy` uses by default.

    The floor is on :func:`examples_efficiency`, phi / (phi + M), so it
    bounds the batch by a multiple of the noise scale: ``M <= phi (1 - e) /
    e``. What a sample at low efficiency costs depends on what ends the
    epochs (``epoch_end`` of :class:`~keras_adapt.policies.BatchSizePolicy`).
    On progress (``"progress"``) a less efficient batch trains on more
    samples for the same progress: it costs time, which goodput already
    prices, so the floor only bounds how far beyond the noise scale the
    batch may go: 1/3, M <= 2 phi, where
    :class:`~keras_adapt.policies.GNSBatchSizePolicy` aims. On samples
    (``"samples"``, or ``None``: ``fit``'s own epochs) the samples are fixed
    and a less efficient batch ends with less progress, so lower accuracy:
    2/3, M <= phi / 2 (docs/policies.md, "Why an efficiency floor").

    Example:

    >>> from keras_adapt.formulas.goodput import default_min_efficiency
    >>> default_min_efficiency("progress"), default_min_efficiency(None)
    (0.3333333333333333, 0.6666666666666666)
    """
    return 1.0 / 3.0 if epoch_end == "progress" else 2.0 / 3.0


def step_time_ratio(now, then, confidence=2.0):
    """``T(now) / T(then)`` as the batch-size policies price it, from two predictions.

    The logarithm of the predicted ratio, drawn toward 0 (flat step times)
    by ``confidence`` times the two predictions' relative standard errors
    added, and 0 when it is within that margin: a difference the
    measurements cannot resolve counts as none, and one they can counts
    only beyond its uncertainty. ``now`` and ``then`` are
    :class:`keras_adapt.formulas.throughput.Prediction` objects. The errors
    are added, a bound on the log ratio's error whatever the two
    predictions' correlation; its own, smaller error from the fit's
    covariance made the batch-size decisions slower and less stable between
    runs (docs/policies.md, "Why it is stable").

    Example:

    >>> from keras_adapt.formulas.throughput import Prediction
    >>> from keras_adapt.formulas.goodput import step_time_ratio
    >>> step_time_ratio(Prediction(0.010, 0.0, True), Prediction(0.020, 0.0, True))  # exact
    0.5
    >>> # 10% errors each: 2 x (0.1 + 0.1) off |log 0.5|
    >>> round(step_time_ratio(Prediction(0.010, 0.001, True), Prediction(0.020, 0.002, True)), 4)
    0.7459
    >>> step_time_ratio(Prediction(0.010, 0.002, True), Prediction(0.012, 0.002, True))  # within
    1.0
    """
    log_ratio = math.log(now.value / then.value)
    margin = confidence * (now.relative_std + then.relative_std)
    return math.exp(math.copysign(max(0.0, abs(log_ratio) - margin), log_ratio))
