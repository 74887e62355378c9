"""GNSBatchSizePolicy: the global batch follows the measured gradient noise scale."""

import math

from keras_adapt.checks import check_bool, check_float, check_int
from keras_adapt.formulas.goodput import goodput_gain
from keras_adapt.policies.batch_size_policy import BatchSizePolicy
from keras_adapt.policies.update_timer import UpdateTimer

#: Batches :meth:`GNSBatchSizePolicy.fastest_batch` prices between the
#: current batch and the target (geometric steps, the target included).
FASTEST_GRID = 48


class GNSBatchSizePolicy(BatchSizePolicy):
    """Moves the global batch toward a multiple of the gradient noise scale.

    The noise scale B_simple = tr(Sigma) / |G|^2 estimates the critical
    batch: below it, a larger batch buys almost proportionally fewer steps;
    above it, little (McCandlish et al. 2018). It grows as training progresses, so a
    batch that follows it stays efficient throughout: small while the
    gradient is clean, large once noise dominates (the policy the KungFu
    paper proposes).

    Every ``interval`` updates the target ``gns_multiple x B_simple`` is
    clipped to ``[min_batch, max_batch]`` (and to the budget's cap, below).
    The batch changes only when

    * the statistics cover at least ``warmup_updates`` optimizer updates
      (``covered_updates``: with ``stats_interval`` N, one measurement covers N),
    * at least ``min_change_interval`` updates passed since the last change,
    * the unclipped target leaves the hysteresis band: it is >=
      ``(1 + hysteresis) x`` the current batch (or, with ``allow_decrease``,
      <= current / ``(1 + hysteresis)``); the batch then moves to the
      clipped target, growing at most ``max_growth`` times (below).

    A noise scale that is not finite (nothing resolved yet) changes nothing;
    the shrink at the end of a sample budget (below) needs none.

    **Step times** (``price_step_times=True``; off by default). Where an update gets
    costlier as the batch grows (a device that is full), the batch that
    trains fastest may be below the target: the noise scale says how many
    updates a larger batch saves, the step time what each one costs. The
    policy times its updates and fits a
    :class:`~keras_adapt.formulas.throughput.ThroughputModel` (as
    :class:`GoodputBatchSizePolicy` does, through an :class:`UpdateTimer`),
    and grows only as far as :meth:`fastest_batch`: of the batches from the
    current one up to the target, the one with the most goodput
    (:func:`goodput_gain`: statistical progress per second, with the step
    times' ratio priced by :func:`step_time_ratio`, which counts a
    difference only beyond ``confidence`` standard errors). While the model
    has no fit (one batch measured so far) step times count as flat and the
    batch goes to the target, so the first ramp is as fast as without the
    term; where the step time does not grow with the batch (or the
    measurements cannot tell), the target wins as before. The term only
    stops growth: a batch already beyond the fastest one stays (a move down
    would gain a few percent at most near the optimum, within the band).
    Off by default because on ``benchmarks/time_to_accuracy.py`` it bought
    nothing: each task reaches its target within a few decisions of the
    first ramp, which is priced flat, and where it cut later growth it cost
    accuracy.

    The batch grows by at most ``max_growth`` (2) per change, so the
    learning rate that follows it rises in steps the model can take: the
    first noise-scale estimates are noisy (on ``names_text`` the first said
    121, the next 51), and a jump from 32 to 244 at 7.6x the rate, which the
    linear rule made there, ended the run at chance. Doubling every
    ``min_change_interval`` updates still reaches 16x the start batch in
    80 updates.

    With a ``sample_budget`` (the global samples the whole run trains on,
    e.g. ``epochs x len(x)``) the batch keeps at least ``min_updates_left``
    updates in the rest of the budget: it grows to at most
    ``samples left / min_updates_left`` (:meth:`budget_cap`), and once that
    cap falls a band below the batch as the budget runs out, the batch
    shrinks to it. The end of a sample budget is where the accuracy is made
    (the learning rate's decay): there every sample buys more progress at a
    small batch, and with the learning rate following the batch the noise
    of an update stays where the schedule put it. Without the shrink, a
    batch at twice the noise scale spends the whole budget at a third of a
    small batch's progress per sample and ends below a tuned fixed batch;
    with it, the last ``min_updates_left x ln(...)`` updates run at ever
    smaller batches (docs/results/time_to_accuracy_notes.md, "The
    candidate defaults"). On progress epochs
    (``epoch_end="progress"``) there is no budget in samples and no cap is
    needed: an update adds at most ``B_simple + base_batch`` progress at any
    batch, so the end of the schedule always keeps
    ``progress left / (B_simple + base_batch)`` updates; a ``sample_budget``
    there is refused.

    The defaults were chosen on ``benchmarks/time_to_accuracy.py`` (see
    docs/policies.md, "How the defaults were chosen", and
    docs/results/time_to_accuracy_notes.md): the batch goes to twice the measured
    noise scale (``gns_multiple`` 2; 1, the critical batch of McCandlish et
    al., grew too slowly on digits), at most doubling per change, the
    learning rate scales linearly with it (the small batch's progress per
    sample; AdaScale's gain and the optimal step size's ratio of McCandlish
    et al. each lost accuracy on most tasks at equal samples), on a budget 100 updates are kept, and a change may follow
    the last after ``min_change_interval`` 20 updates: the statistics'
    moving average already lags by about 100 updates, so the interval need
    not add as much again.

    Args:
        min_batch, max_batch: bounds of the global batch.
        gns_multiple: target = gns_multiple x B_simple (> 0).
        hysteresis: relative dead band around the current batch (>= 0).
        min_change_interval: updates between two changes (>= 0).
        warmup_updates: optimizer updates the statistics must cover before
            the first decision (independent of ``stats_interval``).
        allow_decrease: also shrink the batch when the noise scale falls.
        max_growth: the largest factor by which one change grows the batch
            (>= 1; default 2; ``None``: straight to the target).
        sample_budget: global training samples of the whole run (None: no
            budget, the batch follows the noise scale up to ``max_batch``);
            not with ``epoch_end="progress"``.
        min_updates_left: updates the rest of the budget must hold at the
            batch (>= 1; default 100): growth stops there and the batch
            shrinks as the budget runs out (see above).
        scaling_rule: how the learning rate follows the batch (default
            ``"linear"``: lr x B / base_batch, Goyal et al.); ``None`` leaves
            it alone (e.g. when an :class:`LRScalingPolicy` drives it).
        price_step_times: grow only as far as the fastest batch
            (:meth:`fastest_batch`; True or False, default False).
        confidence: how many standard errors of the step-time ratio count
            as no difference (>= 0; 2: about 95%).
        throughput_model: the :class:`~keras_adapt.formulas.throughput.ThroughputModel`
            to feed (default: :class:`UpdateTimer`'s); only with
            ``price_step_times``.
        **kwargs: see :class:`BatchSizePolicy` (``dataset``,
            ``micro_batch_size``, ``max_micro_batch_size``, ``base_batch``,
            ``interval``, ``log_dir``, ``verbose``).

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.policies import GNSBatchSizePolicy
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05)), "mse")
    >>> policy = GNSBatchSizePolicy(min_batch=8, max_batch=64, micro_batch_size=8,
    ...                             warmup_updates=5, scaling_rule="sqrt", interval=5)
    >>> x = np.random.default_rng(0).normal(size=(512, 4))
    >>> _ = model.fit(x, x.sum(1), batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    >>> 8 <= policy.batch.value <= 64
    True
    """

    needs_statistics = True

    def __init__(self, min_batch, max_batch, gns_multiple=2.0, hysteresis=0.25,
                 min_change_interval=20, warmup_updates=50, allow_decrease=False,
                 max_growth=2.0, sample_budget=None, min_updates_left=100,
                 scaling_rule="linear",
                 price_step_times=False, confidence=2.0, throughput_model=None, **kwargs):
        super().__init__(min_batch, max_batch, scaling_rule=scaling_rule, **kwargs)
        check_bool("price_step_times", price_step_times)
        if throughput_model is not None and not price_step_times:
            raise ValueError(
                f"throughput_model={throughput_model!r} is only used with "
                "price_step_times=True; drop it, or set price_step_times=True")
        self.price_step_times = price_step_times
        self.confidence = check_float("confidence", confidence)
        if price_step_times:
            self.update_timer = UpdateTimer(throughput_model)
        self.sample_budget = (None if sample_budget is None
                              else check_int("sample_budget", sample_budget))
        if self.sample_budget is not None and self.epoch_end == "progress":
            raise ValueError(
                f"sample_budget={sample_budget} caps the batch by samples, but with "
                "epoch_end='progress' the run's length is its statistical progress, and every "
                "update adds at most (noise scale + base batch) of it, whatever the batch: "
                "the end of the schedule keeps its updates without a cap. Pass "
                "sample_budget=None, or epoch_end='samples' to keep a budget in samples")
        self.min_updates_left = check_int("min_updates_left", min_updates_left)
        self.gns_multiple = check_float("gns_multiple", gns_multiple, low_open=True)
        self.hysteresis = check_float("hysteresis", hysteresis)
        self.min_change_interval = check_int("min_change_interval", min_change_interval, 0)
        self.warmup_updates = check_int("warmup_updates", warmup_updates, 0)
        self.allow_decrease = check_bool("allow_decrease", allow_decrease)
        self.max_growth = (None if max_growth is None else check_float(
            "max_growth", max_growth, 1.0,
            fix="use a float >= 1 (the largest factor of one change), or None for no limit"))

    def budget_cap(self):
        """The largest global batch that leaves ``min_updates_left`` updates in
        the sample budget (``max_batch`` without a budget; never below
        ``min_batch``)."""
        if self.sample_budget is None:
            return self.max_batch
        left = max(0, self.sample_budget - self.progress.samples)
        return min(self.max_batch, max(self.min_batch, left // self.min_updates_left))

    def target_for(self, gns):
        """The clipped target global batch for noise scale ``gns``."""
        return min(max(self.gns_multiple * gns, self.min_batch), self.budget_cap())

    def shrinks_to(self, current):
        """The budget's cap when it has fallen a band below ``current`` (the
        batch then shrinks to it), else None. Without a ``sample_budget``
        always None.

        Example:

        >>> from keras_adapt.policies import GNSBatchSizePolicy
        >>> policy = GNSBatchSizePolicy(32, 1024, micro_batch_size=32,
        ...                             sample_budget=20_000, min_updates_left=100)
        >>> policy.shrinks_to(256), policy.shrinks_to(160)   # cap: 20000 // 100 = 200
        (200, None)
        """
        if self.sample_budget is None or current <= self.min_batch:
            return None
        cap = self.budget_cap()
        return cap if cap * (1.0 + self.hysteresis) <= current else None

    def fastest_batch(self, current, target, gns, fit=None):
        """Of the global batches from ``current`` up to ``target``, the one
        with the most goodput at noise scale ``gns`` (``current`` itself when
        no larger one gains): :func:`goodput_gain` with the step times' ratio
        from ``fit`` (default: the throughput model's current fit) by
        :meth:`UpdateTimer.time_ratio`. ``target`` without a fit, or with
        ``price_step_times=False``. Prices the batches that would be made
        (:meth:`configuration`) for :data:`FASTEST_GRID` points of a
        geometric grid.

        Example:

        >>> from keras_adapt.policies import GNSBatchSizePolicy
        >>> policy = GNSBatchSizePolicy(32, 1024, micro_batch_size=32, price_step_times=True)
        >>> policy.fastest_batch(32, 800, gns=400.0)   # nothing timed yet: flat
        800
        """
        if self.update_timer is None:
            return target
        fit = self.throughput_model.fit() if fit is None else fit
        if not fit.fitted or target <= current:
            return target
        best, best_gain = current, 1.0
        for i in range(1, FASTEST_GRID + 1):
            m = round(target)  # the last point: the target itself, as without step times
            if i < FASTEST_GRID:
                point = current * (target / current) ** (i / FASTEST_GRID)
                b, k, n = self.configuration(round(point))
                m = b * k * n  # the batch that would be made
            ratio = self.update_timer.time_ratio(current, m, self.configuration,
                                                 self.confidence, fit)
            gain = goodput_gain(m, current, gns, ratio)
            if gain > best_gain:
                best, best_gain = (target if i == FASTEST_GRID else m), gain
        return best

    def should_change(self, step, gns, covered_updates, current):
        """The decision rule: the target batch, or None to keep ``current``.
        The budget's shrink needs no statistics; growth needs a finite noise
        scale over ``warmup_updates``."""
        if self._last_change is not None and step - self._last_change < self.min_change_interval:
            return None
        shrunk = self.shrinks_to(current)
        if shrunk is not None:
            return shrunk
        if gns is None or not math.isfinite(gns) or covered_updates < self.warmup_updates:
            return None
        # The band is tested on the unclipped target, so a target beyond a
        # bound still moves the batch all the way to that bound.
        raw = self.gns_multiple * gns
        band = 1.0 + self.hysteresis
        if raw >= current * band and current < self.max_batch:
            cap = self.budget_cap()
            # max_batch is a fixed bound: the batch may move all the way to
            # it; the budget's cap shrinks as training goes on, so a step
            # toward it is made only while it is still band-sized.
            if cap < self.max_batch and cap < current * band:
                return None
            target = self._grown(gns, current)
            fastest = self.fastest_batch(current, target, gns)
            if fastest < target and fastest < current * band:
                return None  # growing pays less than its cost in step time
            return fastest
        if self.allow_decrease and raw * band <= current and current > self.min_batch:
            return self.target_for(gns)
        return None

    def decide(self, step, values):
        current = self.batch.value
        gns = values.get("gns")
        target = self.should_change(step, gns, values.get("covered_updates", 0), current)
        if target is None:
            return
        if target == self.shrinks_to(current):
            left = self.sample_budget - self.progress.samples
            reason = (f"budget: {left} samples left, at most {target} for "
                      f"{self.min_updates_left} updates (batch {current})")
        else:
            reason = (f"gns {gns:.1f} x {self.gns_multiple:g} -> target {target:.0f} "
                      f"(batch {current}, band x{1 + self.hysteresis:g}{self._budget_note(gns)}"
                      f"{self._growth_note(gns, current, target)}"
                      f"{self._time_note(gns, current, target)})")
        self.change_batch(target, reason, values)

    def get_config(self):
        config = super().get_config()
        config.update(gns_multiple=self.gns_multiple, hysteresis=self.hysteresis,
                      min_change_interval=self.min_change_interval,
                      warmup_updates=self.warmup_updates, allow_decrease=self.allow_decrease,
                      max_growth=self.max_growth, sample_budget=self.sample_budget,
                      min_updates_left=self.min_updates_left,
                      price_step_times=self.price_step_times, confidence=self.confidence)
        return config

    def _grown(self, gns, current):
        """The target for ``gns`` within one change's growth from ``current``."""
        target = self.target_for(gns)
        return target if self.max_growth is None else min(target, current * self.max_growth)

    def _growth_note(self, gns, current, target):
        if target < self._grown(gns, current) - 0.5 or self._grown(gns, current) >= (
                self.target_for(gns) - 0.5):
            return ""
        return f"; at most x{self.max_growth:g} per change"

    def _time_note(self, gns, current, target):
        if target >= self._grown(gns, current) - 0.5:
            return ""
        fit = self.throughput_model.fit()
        kind = "model" if fit.usable else "tentative fit"
        return (f"; step times ({kind}): {target:.0f} is the fastest batch "
                f"up to {self._grown(gns, current):.0f}")

    def _budget_note(self, gns):
        cap = self.budget_cap()
        if cap >= min(self.gns_multiple * gns, self.max_batch):
            return ""
        left = self.sample_budget - self.progress.samples
        return f"; {left} samples left: at most {cap} for {self.min_updates_left} updates"
