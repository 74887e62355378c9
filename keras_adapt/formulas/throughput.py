"""ThroughputModel: the time of one optimizer update as a function of the configuration.

A configuration is ``(b, N, k)``: per-worker micro-batch ``b``, worker count
``N`` and accumulation steps ``k`` (micro-steps per update). One update
computes ``k`` micro-batch gradients, then averages them over the workers in
one collective and applies them. Its time is modelled as

    T_step = k*(alpha_c + beta_c*b) + alpha_u                     (compute, update)
           + beta_n*(N-1)/N + alpha_n*(N-1)                        (allreduce)
           + k*(gamma_c + delta_c*b)*(N-1)/N                        (interference)

with seven terms, each a cost in seconds per unit of its multiplier
(:func:`design_row`):

* ``per_sample`` (beta_c): compute per sample (forward and backward);
* ``per_micro_step`` (alpha_c): fixed cost of one micro-step (dispatch,
  callbacks, data);
* ``per_update`` (alpha_u): fixed cost of one update (applying it, and the
  collective's own bookkeeping, which exists at N = 1 too);
* ``sync_bandwidth`` (beta_n): the bandwidth part of a ring allreduce,
  ``2*(N-1)/N * S/BW`` for S gradient bytes, per unit of (N-1)/N;
* ``sync_latency`` (alpha_n): the latency part, ``2*(N-1)`` hops;
* ``interference_per_micro_step`` (gamma_c) and ``interference_per_sample``
  (delta_c): how much slower the compute runs because other workers run
  too: workers sharing a host compete for its cores, caches and memory
  bandwidth, and at the collective every worker waits for the slowest,
  a wait that grows with the work done since the last synchronisation.
  Both vanish at N = 1 and saturate like (N-1)/N.

This refines ``T_grad(b) = alpha_c + beta_c*b`` per micro-step and
``T_sync(N)``, zero at N = 1 (docs/design.md#throughput-model), with the
synchronisation split as a ring allreduce costs it (Thakur et al. 2005;
Horovod reduces over a ring), a per-update constant, so accumulation is
priced right (``k`` micro-steps pay the compute, the update pays the rest
once), and the interference terms.
Those helped on some measurements and not on others (in
``benchmarks/perf_model.py``, at two workers on one busy host, they cut the
held-out error by 25% and 39% on two runs and raised it by 15% on a third),
so the fit tries both candidate models (:data:`MODELS`: without and with
them) and keeps the one with the lower held-out error. The terms add:
keras-adapt's optimizer reduces once after the backward pass, so computation
and communication do not overlap (Pollux's ``(T_grad^g + T_sync^g)^(1/g)``
is for frameworks that overlap them). The gradient size S is fixed for a
model, so it lives inside ``sync_bandwidth``.

The model is linear in its terms and is fitted by least squares on
*relative* errors (each configuration's row divided by its measured time),
which minimises the squared percentage error, the quantity MAPE measures;
every configuration counts once, however often it was observed. Terms the
observed configurations cannot tell apart are not identified, and the
earlier term in :data:`TERMS` takes their joint cost: with all
configurations at ``k = 1``, ``per_micro_step`` takes ``per_update``'s (a
conservative guess for ``k > 1``); with only ``N`` in {1, 2},
``sync_bandwidth`` takes ``sync_latency``'s. A prediction that depends on
such a split says so (``Prediction.determined`` is False).

Example:

>>> from keras_adapt.formulas.throughput import ThroughputModel
>>> model = ThroughputModel(warmup=0)
>>> for b in (16, 32, 64, 128):
...     for n in (1, 2):
...         for _ in range(3):
...             _ = model.observe(b, 0.002 + 1e-4 * b + (0.003 if n == 2 else 0.0), workers=n)
>>> fit = model.fit()
>>> fit.usable, round(fit.params["per_sample"] * 1e6, 3)
(True, 100.0)
>>> round(model.predict_step_time(96, workers=2).value * 1e3, 3)
14.6
"""

import collections
import dataclasses
import math

import numpy as np

from keras_adapt.checks import check_bool, check_choice, check_float, check_int, invalid

__all__ = ["MAX_ERROR_RATIO", "MIN_HELDOUT", "MIN_REPEAT_SIGNIFICANCE", "MODELS", "Prediction", "TERMS", "ThroughputFit",
           "ThroughputModel", "design_row"]

#: The terms of the model, in the order in which they take the cost of
#: terms that the observations cannot separate from them.
TERMS = ("per_sample", "per_micro_step", "per_update", "sync_bandwidth", "sync_latency",
         "interference_per_micro_step", "interference_per_sample")
#: The terms that are zero at N = 1.
_MULTI_WORKER = TERMS[3:]
#: The candidate models: their terms. The fit keeps the one with the lower
#: held-out error (the simpler one on a tie).
MODELS = {"base": TERMS[:5], "interference": TERMS}
#: Held-out configurations needed before a held-out MAPE means anything.
MIN_HELDOUT = 3
#: A usable fit's held-out MAPE is at most this fraction of the constant
#: model's. With configuration-independent (pure noise) step times the
#: ratio stays above 0.7 at 20 configurations; at 4 it falls below 0.5 for
#: about 5% of noise draws.
MAX_ERROR_RATIO = 0.5
_RANK_TOL = 1e-9
#: With fewer configurations than a held-out error needs, a fit from the
#: repeated observations of each configuration is usable only when the
#: configurations' mean times differ from one constant by at least this many
#: of their standard errors (root mean square over the configurations). The
#: repeats of a visit are consecutive and share the machine's load of the
#: moment, so their scatter understates the error between visits, and with
#: a few repeats the standard errors are themselves uncertain: 4, not 2. With
#: step times that do not depend on the batch (10% noise, two batches,
#: medians), 3 passed 2.6% of 2000 draws at 3 repeats each and 0.15% at 10;
#: 4 passes 0.75% and none.
MIN_REPEAT_SIGNIFICANCE = 4.0
#: The relative floor of a configuration's standard error in such a fit
#: when ``min_relative_error`` is 0 (a configuration whose repeats are
#: identical is not infinitely certain).
_MIN_RELATIVE_SE = 1e-9


def design_row(batch_size, workers=1, accumulation=1):
    """The model's row for one configuration: the multiplier of each term.

    ``T_step = design_row(b, N, k) @ params`` with the parameters in the
    order of :data:`TERMS`.

    Example:

    >>> from keras_adapt.formulas.throughput import design_row
    >>> design_row(32, workers=2, accumulation=4)
    [128.0, 4.0, 1.0, 0.5, 1.0, 2.0, 64.0]
    """
    b, n, k = float(batch_size), float(workers), float(accumulation)
    others = (n - 1.0) / n
    return [k * b, k, 1.0, others, n - 1.0, k * others, k * b * others]


def _check_count(name, value, what):
    return check_int(name, value, fix=f"pass {what} as an int >= 1")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A predicted quantity and its standard error.

    ``value`` is the prediction, ``std`` the standard error of the fitted
    mean at this configuration (from the parameters' covariance; about 68%
    of the true mean lies within ``value +- std``, 95% within ``+- 2*std``
    when the model's form is right). ``determined`` is False when the
    observed configurations do not pin the answer down (it rests on how the
    cost of terms they cannot separate was split; see the module doc).

    Example:

    >>> from keras_adapt.formulas.throughput import Prediction
    >>> p = Prediction(0.020, 0.0004, True)
    >>> round(p.relative_std, 3), float(p)
    (0.02, 0.02)
    """

    value: float
    std: float
    determined: bool

    @property
    def relative_std(self):
        """``std / value``."""
        return self.std / self.value

    def __float__(self):
        return float(self.value)


@dataclasses.dataclass(frozen=True)
class ThroughputFit:
    """One least-squares fit of a :class:`ThroughputModel`.

    Attributes:
        usable: the fit may be used: enough configurations, and its
            held-out MAPE is at most half that of the constant model.
        reason: why it is (or is not) usable, in one sentence.
        params: seconds per unit of each term of :data:`TERMS` (0.0 for a
            term that is not identified or not in the chosen model); None
            when there were too few configurations to fit.
        stderr: standard error of each identified parameter (None for the
            others), from the residuals between configurations.
        identified: the terms of the chosen model that the configurations
            determine.
        model: the candidate model chosen: ``"base"`` (no interference
            terms) or ``"interference"`` (all of :data:`TERMS`), the one
            with the lower held-out MAPE (see :data:`MODELS`).
        model_mapes: held-out MAPE of each candidate that could be fitted,
            over the configurations both predicted (the comparison made).
        num_observations: observations used (after warm-up discards,
            within each configuration's window).
        num_configurations: distinct configurations used.
        mape: held-out mean absolute percentage error, in percent: each
            configuration predicted by a fit to all the others
            (leave-one-configuration-out), over the configurations the
            others determine (``heldout``).
        constant_mape: the same for the constant model, which predicts the
            mean step time of the other configurations.
        train_mape: in-sample MAPE of this fit, in percent.
        heldout: how many configurations entered ``mape``.
        evidence: what the fit's usability and standard errors rest on:
            ``"held-out"`` (leave-one-configuration-out errors and the
            residuals between configurations, p + 2 configurations or more)
            or ``"repeats"`` (fewer configurations: the scatter of each
            configuration's repeated observations; ``mape`` is then NaN).

    Example:

    >>> from keras_adapt.formulas.throughput import ThroughputModel
    >>> model = ThroughputModel(warmup=0, min_observations=1)
    >>> for b in (8, 16, 32, 64):
    ...     _ = model.observe(b, 0.001 + 2e-4 * b)
    >>> fit = model.fit()
    >>> fit.identified, fit.usable, round(fit.mape, 6)
    (('per_sample', 'per_micro_step'), True, 0.0)
    >>> round(fit.predict_throughput(48, workers=1).value)   # 48 / (0.001 + 48 * 2e-4)
    4528
    """

    usable: bool
    reason: str
    params: dict
    stderr: dict
    identified: tuple
    model: str
    model_mapes: dict
    num_observations: int
    num_configurations: int
    mape: float
    constant_mape: float
    train_mape: float
    heldout: int
    evidence: str
    _covariance: np.ndarray = dataclasses.field(repr=False, compare=False)
    _row_space: np.ndarray = dataclasses.field(repr=False, compare=False)
    _scale: np.ndarray = dataclasses.field(repr=False, compare=False)
    _mask: np.ndarray = dataclasses.field(repr=False, compare=False)

    @property
    def fitted(self):
        """Whether the fit has parameters: a usable fit, or one refused on
        its errors (``reason`` says why) that :meth:`predict_step_time` can
        still evaluate with ``tentative=True``. False when too few
        configurations were observed to solve for any.

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0, min_observations=1)
        >>> _ = model.observe(32, 0.01)
        >>> model.fit().fitted
        False
        """
        return self.params is not None

    def predict_step_time(self, batch_size, workers=1, accumulation=1, tentative=False):
        """Predicted seconds of one update at ``(b, N, k)``, as a :class:`Prediction`.

        With ``tentative=True`` a fit that is not usable but :attr:`fitted`
        predicts too: its parameters are the least-squares estimate from what
        was observed, not yet shown to beat the constant model (the goodput
        policy prices it by the rule it uses for a usable fit, which counts
        a difference only beyond the prediction's standard errors).

        Raises ``RuntimeError`` when the fit is not usable (the reason is in
        the message; with ``tentative``, when it has no parameters) and
        ``ValueError`` for a multi-worker configuration
        whose synchronisation cost is unknown (no multi-worker configuration
        was observed, or all observations ran at another single worker
        count; the observed count itself is predicted) or when the
        prediction is not a positive time (an extrapolation too far from
        the observations).

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0, min_observations=1)
        >>> for b in (8, 16, 32, 64):
        ...     _ = model.observe(b, 0.001 + 2e-4 * b)
        >>> round(model.fit().predict_step_time(100).value, 6)
        0.021
        >>> model = ThroughputModel(warmup=0, min_observations=2, repeats=True)
        >>> for t32, t64 in ((0.010, 0.012), (0.014, 0.011)):   # two noisy repeats each
        ...     _, _ = model.observe(32, t32), model.observe(64, t64)
        >>> fit = model.fit()   # means 12 and 11.5 ms: no measurable slope
        >>> fit.usable, round(fit.predict_step_time(128, tentative=True).value, 4)
        (False, 0.0105)
        """
        b = _check_count("batch_size", batch_size, "the per-worker micro-batch")
        n = _check_count("workers", workers, "the worker count")
        k = _check_count("accumulation", accumulation, "the micro-steps per update")
        if not (self.usable or (tentative and self.fitted)):
            raise RuntimeError(f"the throughput model is not usable: {self.reason}")
        x = np.array(design_row(b, n, k))
        determined = _in_row_space(x / self._scale * self._mask, self._row_space)
        # With every observation at one worker count N0 > 1 the synchronisation
        # cost is inside the fixed costs: N0 itself is determined, others are not.
        if n > 1 and not determined and not any(t in self.identified for t in _MULTI_WORKER):
            raise ValueError(
                f"workers={n}: no multi-worker configuration was observed, or all observed "
                f"ones ran at one worker count, so the synchronisation cost at {n} workers is "
                "unknown; observe configurations at two or more worker counts, one with "
                "workers > 1 (and enough others), before predicting this one")
        idx = [TERMS.index(t) for t in self.identified]
        theta = np.array([self.params[t] for t in self.identified])
        value = float(x[idx] @ theta)
        if value <= 0.0:
            raise ValueError(
                f"batch_size={b}, workers={n}, accumulation={k}: the fit predicts a step time of "
                f"{value:.3g} s, so this configuration is too far from the observed ones to "
                "extrapolate to; observe configurations nearer to it")
        std = float(math.sqrt(max(x[idx] @ self._covariance @ x[idx], 0.0)))
        return Prediction(value, std, determined)

    def predict_throughput(self, batch_size, workers=1, accumulation=1):
        """Predicted global samples per second ``N*k*b / T_step``, as a :class:`Prediction`.

        Its ``std`` is the step time's relative standard error carried over
        (first order). Raises as :meth:`predict_step_time` does.

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0, min_observations=1)
        >>> for b in (8, 16, 32, 64):
        ...     _ = model.observe(b, 0.001 + 2e-4 * b)
        >>> round(model.fit().predict_throughput(64, accumulation=2).value)
        4638
        """
        t = self.predict_step_time(batch_size, workers, accumulation)
        samples = float(batch_size * workers * accumulation)
        value = samples / t.value
        return Prediction(value, value * t.relative_std, t.determined)


def _in_row_space(x, basis):
    """Is ``x`` a combination of the rows that ``basis`` (orthonormal rows) spans?"""
    residual = x - basis.T @ (basis @ x)
    return bool(np.linalg.norm(residual) <= 1e-8 * max(1.0, np.linalg.norm(x)))


def _row_space(rows):
    """Orthonormal basis (as rows) of the row space of ``rows``."""
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    if s.size == 0 or s[0] == 0.0:
        return np.zeros((0, rows.shape[1]))
    return vt[s > _RANK_TOL * s[0]]


def _identifiable(rows):
    """Indices of the columns kept, in order: each kept column adds rank."""
    kept = []
    for j in range(rows.shape[1]):
        if not np.any(rows[:, j]):
            continue
        trial = rows[:, kept + [j]]
        if np.linalg.matrix_rank(trial, tol=_RANK_TOL * np.linalg.norm(trial, 2)) == len(kept) + 1:
            kept.append(j)
    return kept


def _solve(rows, times, kept):
    """Relative least squares on the columns ``kept`` (the identifiable
    ones, :func:`_identifiable`): their parameters and the scaled rows.

    Minimises sum((1 - rows @ theta / times)^2) over those columns (the
    others are 0)."""
    a = rows[:, kept] / times[:, None]
    theta, *_ = np.linalg.lstsq(a, np.ones(len(times)), rcond=None)
    return theta, a


def _structure(scaled):
    """What a candidate model's fit takes from its rows alone, not from the
    times: the columns kept, the rows' row space, and for each configuration
    whether the others determine it and, if so, the columns they keep.
    The same rows give the same structure, so a model computes it once per
    set of configurations, not at every fit (the rank tests are most of a
    fit's time)."""
    c = len(scaled)
    loo = {}
    for i in range(c):
        others = np.arange(c) != i
        if _in_row_space(scaled[i], _row_space(scaled[others])):
            loo[i] = _identifiable(scaled[others])
    return dict(kept=_identifiable(scaled), row_space=_row_space(scaled), loo=loo)


def _fit_candidate(scaled, times, min_relative_error, structure):
    """One candidate model (its columns not in the model are zero): the fit
    and its leave-one-configuration-out errors, given its rows'
    :func:`_structure`. The parameters' covariance takes the residuals'
    relative variance as at least ``min_relative_error**2``.

    ``errors`` and ``const_errors`` map each configuration the others
    determine to the relative error of the model and of the constant model;
    ``errors`` is None when there are fewer than p + 2 configurations."""
    c = len(times)
    kept = structure["kept"]
    out = dict(kept=kept, errors=None, row_space=structure["row_space"])
    if c < len(kept) + 2:
        return out
    theta, a = _solve(scaled, times, kept)
    residual = 1.0 - a @ theta
    sigma2 = max(float(residual @ residual) / (c - len(kept)), min_relative_error ** 2)
    errors, const_errors = {}, {}
    for i, k_i in structure["loo"].items():
        others = np.arange(c) != i
        th_i, _ = _solve(scaled[others], times[others], k_i)
        errors[i] = abs(float(scaled[i, k_i] @ th_i) - times[i]) / times[i]
        const_errors[i] = abs(float(np.mean(times[others])) - times[i]) / times[i]
    out.update(theta=theta, cov=sigma2 * np.linalg.inv(a.T @ a), residual=residual,
               errors=errors, const_errors=const_errors)
    return out


class ThroughputModel:
    """Step time (one optimizer update) fitted online from observed updates.

    Feed it the measured time of each update (or the mean over a few) with
    its configuration; :meth:`fit` fits the model of the module doc by least
    squares on relative errors and says how well it predicts configurations
    it has not seen.

    What it keeps: for each configuration ``(b, N, k)`` the last ``window``
    observed times. A bounded window, not running sums, so a configuration
    measured again reflects the machine as it is now, memory stays
    ``configurations x window`` floats, and the median is available. The
    first ``warmup`` observations of every *visit* to a configuration (the
    consecutive observations after the configuration changed) are
    discarded: the first steps after a change pay for new shapes (tracing)
    and cold caches (in ``benchmarks/perf_model.py`` the first update after
    a switch took about 25% longer than the steady state, the second 10%,
    the third 4%). A configuration enters the fit once it holds
    ``min_observations`` times; its time is their mean (or median). The
    fit costs ``O(C^2)`` small least-squares solves for C configurations
    (leave-one-out) and is cached until the next observation, so calling it
    every interval is cheap.

    How many configurations: with p identified terms a candidate model needs
    ``p + 2`` distinct configurations: p to determine the parameters, one more
    for a residual (standard errors), and one more so that each configuration
    left out still leaves a determined fit. For the base model p is 2 when
    only the micro-batch varies (4 configurations), 3 when accumulation or the
    worker count (1 and 2) varies too (5), 4 for micro-batch x accumulation x
    one and two workers (6), 5 with three or more worker counts (7); the
    interference model needs one (b x N) or two more (b x k x N)
    configurations, and is only tried when it has them. The held-out MAPE also
    needs at least 3 configurations that the others determine (the rest are
    left out of it). Before that, and when the fit's held-out MAPE is not at
    most half the constant model's (which predicts the mean step time of the
    other configurations; noise alone rarely halves it, see
    :data:`MAX_ERROR_RATIO`), the fit is not usable: ``fit().usable`` is
    False, ``fit().reason`` says why and ``predict_*`` raise ``RuntimeError``.
    The fit is deterministic: fed the same times in the same order (gathered
    first), ranks on the same numpy and BLAS get the same fit.

    Fewer configurations (``repeats=True``): with at least 2 configurations
    and at least p, but fewer than ``p + 2``, the fit rests on the repeats
    instead (``fit().evidence == "repeats"``): each configuration's time
    weighted by the inverse square of its standard error (from the scatter
    of its kept observations; every configuration then needs 2 or more),
    the constant model as the null. It is usable when the configurations'
    times differ from one constant by at least
    :data:`MIN_REPEAT_SIGNIFICANCE` standard errors and the fit's
    chi-square is at most ``MAX_ERROR_RATIO**2`` of the constant's. Its
    ``mape`` is NaN (nothing was held out); its standard errors come from the
    repeats (inflated by the chi-square per degree of freedom above 1). With
    only the micro-batch varying, ``T = a + b*M`` is then usable from two
    batches.

    Args:
        warmup: observations discarded at the start of each visit to a
            configuration (int >= 0).
        window: most recent observations kept per configuration (int >= 1).
        min_observations: observations (after warm-up) a configuration needs
            before it enters the fit (int >= 1, at most ``window``).
        statistic: ``"mean"`` (default: throughput over a long run is set by
            the mean step time) or ``"median"`` (when the times fed in may
            include odd slow steps, such as one with an evaluation).
        repeats: with fewer configurations than ``p + 2`` (but at least 2,
            and at least p), fit from the repeated observations of each
            instead of refusing (default False; see "Fewer configurations"
            above).
        min_relative_error: the least relative standard error a
            configuration's time is given (float in [0, 1); default 0: what
            the data say). In a fit from repeats it floors each
            configuration's standard error from its repeats, which share the
            machine's load of the moment and so understate how far the next
            visit's time may lie; in a held-out fit it floors the relative
            variance of the residuals between configurations, which a few
            configurations that happen to lie on a line understate. A floor
            of, say, 0.1 says "a visit's time is good to 10% at best";
            predictions' standard errors (and a repeats fit's significance
            test) follow from it; the held-out MAPE and usability do not
            change.

    Example:

    >>> from keras_adapt.formulas.throughput import ThroughputModel
    >>> model = ThroughputModel(warmup=1)
    >>> model.observe(32, 0.5)      # the first update after a change: discarded
    False
    >>> for b in (16, 32, 64, 128):
    ...     for _ in range(4):
    ...         _ = model.observe(b, 0.003 + 5e-5 * b)
    >>> model.fit().usable
    True
    >>> round(model.predict_throughput(256).value)   # 256 / (0.003 + 256 * 5e-5)
    16203
    >>> noisy = ThroughputModel(warmup=0, repeats=True, min_relative_error=0.1)
    >>> for b, t in ((32, 0.010), (64, 0.012)):   # two visits, 4 identical repeats each
    ...     for _ in range(4):
    ...         _ = noisy.observe(b, t)
    >>> p = noisy.fit().predict_step_time(64, tentative=True)
    >>> round(p.relative_std, 3)   # the floor, not the repeats' zero scatter
    0.1
    """

    def __init__(self, warmup=2, window=256, min_observations=3, statistic="mean",
                 repeats=False, min_relative_error=0.0):
        for name, value, minimum in (("warmup", warmup, 0), ("window", window, 1),
                                     ("min_observations", min_observations, 1)):
            check_int(name, value, minimum)
        if min_observations > window:
            raise ValueError(f"min_observations={min_observations!r} exceeds window={window!r}; "
                             "a configuration could never enter the fit: lower min_observations "
                             "or raise window")
        check_choice("statistic", statistic, ("mean", "median"))
        self.repeats = check_bool("repeats", repeats, error=ValueError)
        self.min_relative_error = check_float(
            "min_relative_error", min_relative_error, 0.0, 1.0, high_open=True,
            fix="pass the least relative standard error of a visit's time as a float in [0, 1), "
                "e.g. 0.1 for 10%")
        self.warmup = int(warmup)
        self.window = int(window)
        self.min_observations = int(min_observations)
        self.statistic = statistic
        self._times = {}  # (b, N, k) -> deque of seconds
        self._current = None  # configuration of the latest observation
        self._run = 0  # observations so far in the current visit
        self._fit = None
        # The rows' rank structure per candidate model (_structure), for the
        # configurations in the fit now.
        self._structures_of, self._structures = None, {}

    def observe(self, batch_size, step_time, workers=1, accumulation=1):
        """Adds the measured time of one update; returns False when it was a warm-up discard.

        Args:
            batch_size: per-worker micro-batch b (int >= 1).
            step_time: seconds of one optimizer update: its k micro-steps and
                the synchronisation (finite float > 0). The mean over several
                updates of one configuration is fine too.
            workers: worker count N (int >= 1).
            accumulation: micro-steps per update k (int >= 1).

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=1)
        >>> model.observe(64, 0.031, workers=2), model.observe(64, 0.012, workers=2)
        (False, True)
        >>> model.configurations()
        {(64, 2, 1): [0.012]}
        """
        b = _check_count("batch_size", batch_size, "the per-worker micro-batch")
        n = _check_count("workers", workers, "the worker count")
        k = _check_count("accumulation", accumulation, "the micro-steps per update")
        check_float("step_time", step_time, low_open=True, fix="pass the measured seconds of "
                    "one optimizer update (its micro-steps and the synchronisation) as a "
                    "finite float > 0")
        config = (b, n, k)
        if config != self._current:
            self._current, self._run = config, 0
        self._run += 1
        if self._run <= self.warmup:
            return False
        self._times.setdefault(config, collections.deque(maxlen=self.window)).append(
            float(step_time))
        self._fit = None
        return True

    def configurations(self):
        """``{(b, N, k): [seconds, ...]}``: the observations kept, sorted by configuration.

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0, window=2, min_observations=1)
        >>> for t in (0.1, 0.2, 0.3):
        ...     _ = model.observe(8, t)
        >>> model.configurations()
        {(8, 1, 1): [0.2, 0.3]}
        """
        return {c: list(self._times[c]) for c in sorted(self._times)}

    def reset(self):
        """Forgets every observation (for example after the hardware changed).

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0)
        >>> _ = model.observe(8, 0.1); model.reset(); model.configurations()
        {}
        """
        self._times.clear()
        self._current, self._run = None, 0
        self._fit = None

    def get_state(self):
        """The observations kept and the visit in progress, JSON-able: what
        :meth:`set_state` needs to continue exactly where this model is (a
        policy commits it, so that a worker that joins an elastic job, or a
        resumed run, prices with the same model as the others).

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=1)
        >>> for t in (0.5, 0.02, 0.021):
        ...     _ = model.observe(16, t, workers=2)
        >>> model.get_state()
        {'configurations': [[16, 2, 1, [0.02, 0.021]]], 'current': [16, 2, 1], 'run': 3}
        """
        return {"configurations": [[*c, list(self._times[c])] for c in sorted(self._times)],
                "current": None if self._current is None else list(self._current),
                "run": self._run}

    def set_state(self, state):
        """Replaces the observations by those of :meth:`get_state` (keeping
        this model's settings: at most ``window`` per configuration, the
        latest).

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=1)
        >>> model.set_state({"configurations": [[16, 2, 1, [0.02, 0.021]]],
        ...                  "current": [16, 2, 1], "run": 3})
        >>> model.observe(16, 0.022, workers=2)    # the same visit: no warm-up again
        True
        >>> model.configurations()
        {(16, 2, 1): [0.02, 0.021, 0.022]}
        """
        if not isinstance(state, dict) or not isinstance(state.get("configurations"), list):
            raise invalid("state", state, "pass a dict from ThroughputModel.get_state()")
        times = {}
        for entry in state["configurations"]:
            if not isinstance(entry, (list, tuple)) or len(entry) != 4:
                raise ValueError(f"configuration {entry!r} is not valid; pass the state "
                                 "ThroughputModel.get_state() returned: [b, N, k, [seconds]]")
            *config, observed = entry
            config = tuple(_check_count(name, value, f"a configuration's {name} from get_state()")
                           for name, value in zip(("batch_size", "workers", "accumulation"),
                                                  config))
            times[config] = collections.deque((float(t) for t in observed), maxlen=self.window)
        current = state.get("current")
        self._times = times
        self._current = None if current is None else tuple(int(v) for v in current)
        self._run = int(state.get("run", 0))
        self._fit = None

    def fit(self):
        """Fits the model to the observations so far; returns a :class:`ThroughputFit`.

        Cached until the next observation.

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0)
        >>> _ = model.observe(8, 0.1)
        >>> fit = model.fit()
        >>> fit.usable, fit.reason
        (False, 'no configuration has 3 observations yet (min_observations=3)')
        """
        if self._fit is None:
            self._fit = self._compute_fit()
        return self._fit

    def predict_step_time(self, batch_size, workers=1, accumulation=1):
        """``fit().predict_step_time(...)``: see :meth:`ThroughputFit.predict_step_time`.

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0)
        >>> model.predict_step_time(32)
        Traceback (most recent call last):
        ...
        RuntimeError: the throughput model is not usable: no configuration has 3 observations yet (min_observations=3)
        """
        return self.fit().predict_step_time(batch_size, workers, accumulation)

    def predict_throughput(self, batch_size, workers=1, accumulation=1):
        """``fit().predict_throughput(...)``: see :meth:`ThroughputFit.predict_throughput`.

        Example:

        >>> from keras_adapt.formulas.throughput import ThroughputModel
        >>> model = ThroughputModel(warmup=0, min_observations=1)
        >>> for b in (8, 16, 32, 64):
        ...     _ = model.observe(b, 0.001 + 1e-4 * b)
        >>> round(model.predict_throughput(128, workers=1).value)
        9275
        """
        return self.fit().predict_throughput(batch_size, workers, accumulation)

    # -- fitting --------------------------------------------------------------
    def _summaries(self):
        """Configurations with enough observations, their rows, times and counts."""
        reduce = np.mean if self.statistic == "mean" else np.median
        configs = [c for c in sorted(self._times) if len(self._times[c]) >= self.min_observations]
        rows = np.array([design_row(*c) for c in configs]).reshape(len(configs), len(TERMS))
        times = np.array([float(reduce(self._times[c])) for c in configs])
        count = sum(len(self._times[c]) for c in configs)
        return configs, rows, times, count

    def _standard_errors(self, configs):
        """Standard error of each configuration's time from its repeats
        (None when one has a single observation): s / sqrt(n) for the mean,
        sqrt(pi / 2) times that for the median (its large-sample efficiency)."""
        out = []
        for c in configs:
            obs = np.array(self._times[c])
            if obs.size < 2:
                return None
            se = float(np.std(obs, ddof=1)) / math.sqrt(obs.size)
            if self.statistic == "median":
                se *= math.sqrt(math.pi / 2.0)
            out.append(se)
        return np.array(out)

    def _compute_fit(self):
        configs, rows, times, count = self._summaries()
        c = len(configs)

        def unusable(reason, **fields):
            base = dict(params=None, stderr=None, identified=(), model=None, model_mapes={},
                        num_observations=count, num_configurations=c, mape=math.nan,
                        constant_mape=math.nan, train_mape=math.nan, heldout=0,
                        evidence="held-out", _covariance=np.zeros((0, 0)), _row_space=np.zeros((0, len(TERMS))),
                        _scale=np.ones(len(TERMS)), _mask=np.ones(len(TERMS)))
            base.update(fields)
            return ThroughputFit(usable=False, reason=reason, **base)

        if c == 0:
            return unusable(f"no configuration has {self.min_observations} observations yet "
                            f"(min_observations={self.min_observations})")
        # Scale the columns to comparable size: ranks and solves are then
        # well conditioned whatever the batch sizes.
        scale = np.max(np.abs(rows), axis=0)
        scale[scale == 0.0] = 1.0
        scaled = rows / scale
        if self._structures_of != configs:  # a new configuration: new rows
            self._structures_of, self._structures = configs, {}
        fitted = {}
        for name, terms in MODELS.items():
            mask = np.array([t in terms for t in TERMS], dtype=np.float64)
            if name not in self._structures:
                self._structures[name] = _structure(scaled * mask)
            fitted[name] = _fit_candidate(scaled * mask, times, self.min_relative_error,
                                          self._structures[name])
            fitted[name]["mask"] = mask
        base, full = fitted["base"], fitted["interference"]
        if full["kept"] == base["kept"]:
            del fitted["interference"]  # no interference term is identified: the same model
        feasible = {n: f for n, f in fitted.items()
                    if f["errors"] is not None and len(f["errors"]) >= MIN_HELDOUT}
        # Compare on the configurations both predicted; the simpler model wins ties.
        common = set.intersection(*(set(f["errors"]) for f in feasible.values())) \
            if feasible else set()
        model_mapes = {n: float(np.mean([f["errors"][i] for i in sorted(common)])) * 100.0
                       if common else math.nan for n, f in feasible.items()}
        if len(feasible) == 2 and common and model_mapes["interference"] < model_mapes["base"]:
            name = "interference"
        elif "base" in feasible:
            name = "base"
        else:
            name = next(iter(feasible), "base")
        chosen = fitted[name]
        p = len(chosen["kept"])
        if chosen["errors"] is None:
            needed = (f"{c} configuration(s) observed; {p + 2} are needed for the {p} term(s) "
                      "they identify (p to fit, one residual, one to leave out)")
            if not self.repeats or c < 2 or p < 2:
                return unusable(needed)
            return self._repeats_fit(configs, times, scaled * chosen["mask"], chosen, name,
                                     scale, count, needed, unusable)

        kept = chosen["kept"]
        theta = chosen["theta"] / scale[kept]
        cov = chosen["cov"] / np.outer(scale[kept], scale[kept])
        params = {t: 0.0 for t in TERMS}
        stderr = {t: None for t in TERMS}
        for i, j in enumerate(kept):
            params[TERMS[j]] = float(theta[i])
            stderr[TERMS[j]] = float(math.sqrt(max(cov[i, i], 0.0)))
        errors = [chosen["errors"][i] for i in sorted(chosen["errors"])]
        const_errors = [chosen["const_errors"][i] for i in sorted(chosen["errors"])]
        fields = dict(params=params, stderr=stderr, identified=tuple(TERMS[j] for j in kept),
                      model=name, model_mapes=model_mapes,
                      num_observations=count, num_configurations=c,
                      mape=float(np.mean(errors)) * 100.0 if errors else math.nan,
                      constant_mape=float(np.mean(const_errors)) * 100.0 if errors else math.nan,
                      train_mape=float(np.mean(np.abs(chosen["residual"]))) * 100.0,
                      heldout=len(errors), evidence="held-out", _covariance=cov,
                      _row_space=chosen["row_space"],
                      _scale=scale, _mask=chosen["mask"])
        if len(errors) < MIN_HELDOUT:
            return unusable(f"only {len(errors)} of {c} configurations are determined by the "
                            f"others; observe more (at least {MIN_HELDOUT} are needed for a "
                            "held-out error)", **fields)
        if not fields["mape"] <= MAX_ERROR_RATIO * fields["constant_mape"]:
            return unusable(f"held-out MAPE {fields['mape']:.2f}% does not beat the constant "
                            f"model's {fields['constant_mape']:.2f}% (it must be at most "
                            f"{MAX_ERROR_RATIO:g} of it): the step times do not follow the "
                            "configuration measurably", **fields)
        return ThroughputFit(usable=True, reason=(
            f"held-out MAPE {fields['mape']:.2f}% over {len(errors)} configurations vs "
            f"{fields['constant_mape']:.2f}% for the constant model"), **fields)

    def _repeats_fit(self, configs, times, scaled, chosen, name, scale, count, needed,
                     unusable):
        """The fit of fewer configurations than a held-out error needs (at
        least 2, at least p): weighted least squares on the configurations'
        times, each weighted by 1 / its standard error squared from its
        repeats; usable when the constant model is rejected by more than
        :data:`MIN_REPEAT_SIGNIFICANCE` standard errors and the fit explains
        the differences (its chi-square at most ``MAX_ERROR_RATIO**2`` of the
        constant's). The parameters' covariance is inflated by the
        chi-square per degree of freedom when that exceeds 1. No standard
        error is below ``min_relative_error`` of its time."""
        c = len(times)
        kept = chosen["kept"]
        p = len(kept)
        se = self._standard_errors(configs)
        if c < p or se is None:
            why = ("a configuration has a single observation, so its scatter is unknown"
                   if se is None else f"{p} term(s) are identified")
            return unusable(f"{needed}; nor can the repeats decide: {why}")
        se = np.maximum(se, max(self.min_relative_error, _MIN_RELATIVE_SE) * times)
        w = 1.0 / se ** 2
        a = scaled[:, kept]
        normal = a.T @ (a * w[:, None])
        theta = np.linalg.solve(normal, a.T @ (w * times))
        residual = times - a @ theta
        chi2_model = float(np.sum(w * residual ** 2))
        constant = float(np.sum(w * times) / np.sum(w))
        chi2_const = float(np.sum(w * (times - constant) ** 2))
        cov = np.linalg.inv(normal) * (max(1.0, chi2_model / (c - p)) if c > p else 1.0)
        theta_u = theta / scale[kept]
        cov_u = cov / np.outer(scale[kept], scale[kept])
        params = {t: 0.0 for t in TERMS}
        stderr = {t: None for t in TERMS}
        for i, j in enumerate(kept):
            params[TERMS[j]] = float(theta_u[i])
            stderr[TERMS[j]] = float(math.sqrt(max(cov_u[i, i], 0.0)))
        fields = dict(params=params, stderr=stderr, identified=tuple(TERMS[j] for j in kept),
                      model=name, model_mapes={}, num_observations=count,
                      num_configurations=c, mape=math.nan, constant_mape=math.nan,
                      train_mape=float(np.mean(np.abs(residual / times))) * 100.0, heldout=0,
                      evidence="repeats", _covariance=cov_u, _row_space=chosen["row_space"],
                      _scale=scale, _mask=chosen["mask"])
        z = math.sqrt(chi2_const / (c - 1))
        if z < MIN_REPEAT_SIGNIFICANCE:
            return unusable(
                f"{needed}; from the repeats, the {c} configurations' times differ from a "
                f"constant by {z:.2f} standard errors, fewer than {MIN_REPEAT_SIGNIFICANCE:g}: "
                "the step times do not follow the configuration measurably", **fields)
        if not chi2_model <= MAX_ERROR_RATIO ** 2 * chi2_const:
            return unusable(
                f"{needed}; from the repeats, the fit's chi-square {chi2_model:.3g} is not at "
                f"most {MAX_ERROR_RATIO ** 2:g} of the constant model's {chi2_const:.3g}",
                **fields)
        return ThroughputFit(usable=True, reason=(
            f"from the repeats of {c} configurations (fewer than the {p + 2} a held-out error "
            f"needs): their times differ from a constant by {z:.1f} standard errors"),
            **fields)
