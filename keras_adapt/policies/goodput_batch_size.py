"""GoodputBatchSizePolicy: the batch that maximises throughput x statistical efficiency."""

import dataclasses
import math

from keras_adapt.checks import check_float, check_int
from keras_adapt.formulas.goodput import default_min_efficiency, examples_efficiency, goodput_gain
from keras_adapt.policies.batch_size_policy import BatchSizePolicy
from keras_adapt.policies.update_timer import UpdateTimer


@dataclasses.dataclass(frozen=True)
class GoodputChoice:
    """One decision of :meth:`GoodputBatchSizePolicy.choose`.

    Attributes:
        batch: the global batch to move to (the current one: no change).
        reason: why, in one sentence (the ``batch_size`` event's reason).
        step_times: what priced the step times: ``"model"``, a usable
            throughput fit; ``"tentative"``, a fit with parameters that is
            not usable (not significant yet), priced by the same rule
            (:func:`step_time_ratio`); ``"flat"``, no fit
            yet, so the policy took them as equal (``fit_reason`` says why).
        fit_reason: the throughput fit's own ``reason``.

    Example:

    >>> from keras_adapt.policies import GoodputChoice
    >>> GoodputChoice(64, "efficiency 0.9 at 64", "flat", "too few configurations").batch
    64
    """

    batch: int
    reason: str
    step_times: str
    fit_reason: str


class GoodputBatchSizePolicy(BatchSizePolicy):
    """Grows the global batch while goodput says it pays and each sample keeps its worth.

    goodput(M) = throughput(M) x E(M): samples per second, discounted by how
    much each sample is worth at batch M given the noise scale phi
    (:func:`statistical_efficiency`, Pollux, OSDI'21, relative to
    ``min_batch``); the floor below is on :func:`examples_efficiency`
    e(M) = phi / (phi + M), the same worth against a vanishing batch, which
    does not depend on ``min_batch``. The candidates (:meth:`candidates`)
    are ``min_batch x 2^(i / candidates_per_doubling)`` up to ``max_batch``:
    powers of two by default. Every ``interval`` updates the policy feeds a
    :class:`keras_adapt.formulas.throughput.ThroughputModel` the mean time per
    update since the last time (agreed over the workers in one small
    collective, so every rank fits the same model), and at most every
    ``min_change_interval`` updates, once the statistics cover
    ``warmup_updates`` updates, it decides:

    * **step times**: only their ratio matters, and it enters by one rule
      (:func:`step_time_ratio`): the throughput fit's estimate of the log ratio,
      drawn toward 0 (flat) by ``confidence`` of its standard errors, and
      0 within them. Before a fit exists (one batch so far) the step time
      is taken as the same at every batch (``"flat"``): the optimistic
      guess that lets the policy try a larger batch, where it is then
      measured. The rule is the same whether the fit passed its
      significance test (``"model"``) or not (``"tentative"``: a fit not yet
      significant is within its errors and prices nothing), so passing the
      test changes no decision by itself. A rule that priced the two
      sides of that gate differently would let timing noise decide on
      which side a fit falls, and the same seed make different decisions
      from run to run (docs/policies.md, "How T(M) enters: one rule");
    * **down** one candidate (M/2 with powers of two), when e(M) <
      ``min_efficiency / (1 + hysteresis)`` (the noise scale fell) or that
      candidate's goodput beats M's by more than ``hysteresis``;
    * otherwise **up**, to the candidate above M with the most goodput among
      those with e >= ``min_efficiency``, if it beats M's by more than
      ``hysteresis``. With flat step times that is the largest batch the
      floor allows, as Pollux moves to its best batch at once; measured
      step times that grow with the batch stop it sooner.

    Why the efficiency floor: with flat step times Pollux's goodput
    ``M/T x (phi + M0)/(phi + M)`` rises with M for ever, so pure goodput
    picks ``max_batch``. It maximises progress per second, not per sample.
    e(M) >= f means M <= phi (1 - f) / f: a multiple of the noise scale,
    whatever ``min_batch`` is. Its default (:func:`default_min_efficiency`)
    depends on what ends the epochs: on statistical progress
    (``epoch_end="progress"``) a less efficient batch only trains on more
    samples, which goodput prices as time, and the floor, 1/3 (M <= 2 phi,
    where :class:`GNSBatchSizePolicy` aims), bounds how far beyond the noise
    scale the batch goes; on samples (a number of epochs, a learning-rate
    schedule in epochs) S samples make the progress of fewer at a larger
    batch, so the job trades final accuracy for speed, and the floor, 2/3
    (M <= phi / 2), caps that loss. The floor is on e(M), not on Pollux's
    E(M) against ``min_batch``, so that it does not depend on where the
    user starts (docs/policies.md, "Why an efficiency floor").
    Decisions are quantised (the candidates), use only the agreed noise
    scale and step times agreed over the workers, and take a step-time
    difference into account only beyond its uncertainty, each visit's time
    counting as good to 10% at best (the default model's
    ``min_relative_error``), so the load of the moment does not decide. A
    real step-time difference whose price lies on the hysteresis still can
    (docs/policies.md, "Why it is stable"). Where the linear
    step-time model misfits (flat up to a batch, rising after), its errors
    stay wide and the policy prices even a measured cost near flat.

    Args:
        min_batch, max_batch: bounds of the global batch.
        min_efficiency: the floor on :func:`examples_efficiency` e(M) = phi
            / (phi + M) (0 < min_efficiency <= 1; default ``None``:
            :func:`default_min_efficiency` of ``epoch_end``, 1/3 on
            progress, 2/3 otherwise).
        hysteresis: relative goodput gain required for a change, and the
            dead band below ``min_efficiency`` before a move down (>= 0).
        confidence: how many standard errors of the step-time ratio count
            as no difference (>= 0; 2: about 95%).
        min_change_interval: updates between changes.
        warmup_updates: optimizer updates the statistics must cover before
            the first decision (independent of ``stats_interval``).
        throughput_model: the :class:`~keras_adapt.formulas.throughput.ThroughputModel`
            to feed and predict with (default: :class:`UpdateTimer`'s, a new
            ``ThroughputModel(warmup=1, statistic="median", repeats=True,
            min_relative_error=0.1)``: the first interval after a change
            pays for new shapes; the median ignores an interval with an
            evaluation; two batches and their repeats make a usable fit when
            their times differ; a visit's time is good to 10% at best, so
            the load of the moment does not decide).
        scaling_rule: how the learning rate follows the batch (default
            ``"adascale"``: AdaScale's gain from the same noise scale, as
            Pollux pairs it with goodput; ``None`` leaves the rate alone).
        candidates_per_doubling: candidates per doubling of the batch (an
            int >= 1; default 1: powers of two; 2: steps of sqrt(2), each
            made through the micro-batch and accumulation as the actuator
            can). On the benchmark's tasks 2 changed neither the updates
            to the target nor the final accuracy beyond the seeds' noise.
        **kwargs: see :class:`BatchSizePolicy`.

    Example:

    >>> from keras_adapt.policies import GoodputBatchSizePolicy
    >>> policy = GoodputBatchSizePolicy(min_batch=32, max_batch=512, micro_batch_size=32)
    >>> policy.candidates()
    [32, 64, 128, 256, 512]
    >>> policy.choose(32, gns=200.0).batch     # flat: e(64) = 200/264 >= 2/3, e(128) < 2/3
    64
    >>> policy.choose(64, gns=200.0).batch     # e(128) = 200/328 < 2/3: stay
    64
    >>> policy.choose(32, gns=400.0).batch     # e(128) = 400/528 >= 2/3 > e(256): two doublings
    128
    """

    needs_statistics = True

    def __init__(self, min_batch, max_batch, min_efficiency=None, hysteresis=0.25,
                 confidence=2.0, min_change_interval=50, warmup_updates=50,
                 throughput_model=None, scaling_rule="adascale", candidates_per_doubling=1,
                 **kwargs):
        super().__init__(min_batch, max_batch, scaling_rule=scaling_rule, **kwargs)
        if min_efficiency is None:
            min_efficiency = default_min_efficiency(self.epoch_end)
        self.min_efficiency = check_float(
            "min_efficiency", min_efficiency, 0.0, 1.0, low_open=True,
            fix="use a fraction in (0, 1], e.g. 0.5, or None for the default of the epochs' "
                "count (0 would let the batch grow without bound)")
        self.hysteresis = check_float("hysteresis", hysteresis)
        self.confidence = check_float("confidence", confidence)
        self.min_change_interval = check_int("min_change_interval", min_change_interval, 0)
        self.warmup_updates = check_int("warmup_updates", warmup_updates, 0)
        self.candidates_per_doubling = check_int(
            "candidates_per_doubling", candidates_per_doubling)
        self.update_timer = UpdateTimer(throughput_model)

    def candidates(self):
        """Global batches considered: ``min_batch x 2^(i / candidates_per_doubling)``
        below ``max_batch``, then ``max_batch``; once the policy knows its
        batch, each as the actuator would make it (:meth:`configuration`:
        micro-batch x accumulation x workers), sorted and without repeats.

        Example:

        >>> from keras_adapt.policies import GoodputBatchSizePolicy
        >>> GoodputBatchSizePolicy(32, 256, micro_batch_size=32).candidates()
        [32, 64, 128, 256]
        >>> GoodputBatchSizePolicy(32, 256, micro_batch_size=32,
        ...                        candidates_per_doubling=2).candidates()
        [32, 45, 64, 91, 128, 181, 256]
        """
        grid, i = [], 0
        while True:
            m = round(self.min_batch * 2.0 ** (i / self.candidates_per_doubling))
            if m >= self.max_batch:
                break
            grid.append(m)
            i += 1
        grid.append(self.max_batch)
        if self.batch is None or self.batch.value is None:
            return grid
        out = []
        for m in grid:
            b, k, n = self.configuration(m)
            made = b * k * n
            if made not in out:
                out.append(made)
        return sorted(out)

    # -- deciding -----------------------------------------------------------
    def choose(self, current, gns, fit=None):
        """The rule (see the class doc): a :class:`GoodputChoice` at global
        batch ``current`` with noise scale ``gns`` and throughput ``fit``
        (default: the policy's model's current fit)."""
        fit = self.throughput_model.fit() if fit is None else fit
        kind = "model" if fit.usable else "tentative" if fit.fitted else "flat"
        candidates = self.candidates()
        eff = {m: examples_efficiency(m, gns) for m in candidates}
        eff[current] = examples_efficiency(current, gns)

        def gain_at(m):
            """m's goodput over the current one's."""
            ratio = self.update_timer.time_ratio(current, m, self.configuration,
                                                 self.confidence, fit)
            return goodput_gain(m, current, gns, ratio)

        threshold = 1.0 + self.hysteresis
        below = [m for m in candidates if m < current]
        if below:
            down = below[-1]
            if eff[current] < self.min_efficiency / threshold:
                return GoodputChoice(down, f"efficiency {eff[current]:.3f} at {current} < "
                                     f"{self.min_efficiency:g} (gns {gns:.1f})", kind, fit.reason)
            gain = gain_at(down)
            if gain > threshold:
                return GoodputChoice(down, f"goodput x{gain:.3f} at {down} ({kind} step "
                                     f"times; gns {gns:.1f})", kind, fit.reason)
        above = [m for m in candidates if m > current]
        if not above:
            return GoodputChoice(current, f"{current} is the largest candidate "
                                 f"(max_batch={self.max_batch})", kind, fit.reason)
        allowed = [m for m in above if eff[m] >= self.min_efficiency]
        if not allowed:
            return GoodputChoice(current, f"efficiency {eff[above[0]]:.3f} at {above[0]} < "
                                 f"{self.min_efficiency:g} (gns {gns:.1f})", kind, fit.reason)
        gains = {m: gain_at(m) for m in allowed}
        up = max(allowed, key=gains.get)  # the smallest of equals
        gain = gains[up]
        if gain <= threshold:
            return GoodputChoice(current, f"goodput x{gain:.3f} at {up} <= {threshold:g} "
                                 f"({kind} step times)", kind, fit.reason)
        return GoodputChoice(up, f"goodput x{gain:.3f} at {up}, efficiency {eff[up]:.3f} >= "
                             f"{self.min_efficiency:g} (gns {gns:.1f}; {kind} step times)",
                             kind, fit.reason)

    def decide(self, step, values):
        gns = values.get("gns")
        if gns is None or not math.isfinite(gns) or values.get("covered_updates", 0) < self.warmup_updates:
            return
        if self._last_change is not None and step - self._last_change < self.min_change_interval:
            return
        current = self.batch.value
        choice = self.choose(current, gns)
        if choice.batch != current:
            reason = choice.reason
            if choice.step_times != "model":
                reason += f"; throughput fit not usable: {choice.fit_reason}"
            self.change_batch(choice.batch, reason, values)

    def get_config(self):
        config = super().get_config()
        config.update(min_efficiency=self.min_efficiency, hysteresis=self.hysteresis,
                      confidence=self.confidence, min_change_interval=self.min_change_interval,
                      warmup_updates=self.warmup_updates,
                      candidates_per_doubling=self.candidates_per_doubling)
        return config
