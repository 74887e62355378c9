"""UpdateTimer: times a policy's optimizer updates and feeds a ThroughputModel."""

import math
import time

from keras_adapt import _hvd
from keras_adapt.checks import invalid
from keras_adapt.perf_model import ThroughputModel

#: The least relative standard error the policies' throughput model gives
#: one visit's step time (``min_relative_error``). A policy times a batch on
#: one visit of a few intervals; the next run's visit of the same batch
#: differs by more than those intervals' scatter says (measured on two CPU
#: workers: a batch's median update time varied between three runs of one
#: seed by 7% as the median coefficient of variation over 40 batches
#: visited, quartiles 5% and 12%). With the scatter alone, decisions whose price lay
#: within that noise of the hysteresis changed from run to run. With 10%
#: they do not (simulated with 5-10% load between visits: the same decision
#: in 400 of 400 draws, against 55-70% without the floor); the price is a
#: coarser resolution: a doubling's cost counts only where its step time
#: rises by about 1.5x or more (1.6x to 1.8x from two visited batches)
#: (docs/policies.md, "Why it is stable").
VISIT_ERROR = 0.1


def step_time_ratio(now, then, confidence=2.0):
    """``T(now) / T(then)`` as the batch-size policies price it, from two predictions.

    The logarithm of the predicted ratio, drawn toward 0 (flat step times)
    by ``confidence`` times the two predictions' relative standard errors
    added, and 0 when it is within that margin: a difference the
    measurements cannot resolve counts as none, and one they can counts
    only beyond its uncertainty. ``now`` and ``then`` are
    :class:`keras_adapt.perf_model.Prediction` objects. The errors are
    added, a bound on the log ratio's error whatever the two predictions'
    correlation; its own, smaller error from the fit's covariance made the
    batch-size decisions slower and less stable between runs, measured
    (docs/policies.md, "A finer price of step times, measured").

    Example:

    >>> from keras_adapt.perf_model import Prediction
    >>> from keras_adapt.policies import step_time_ratio
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


class UpdateTimer:
    """Measures the seconds per optimizer update and feeds them to a throughput model.

    A batch-size policy that prices step times holds one (its
    ``update_timer``); :class:`~keras_adapt.policies.BatchSizePolicy` calls
    it from its Keras hooks, so a subclass only reads :attr:`model`. One
    micro-step's time runs from its begin to the next step's begin: what
    training actually gets through, callbacks included. The step that ends
    an epoch (evaluation, epoch callbacks) is not counted. Every ``adapt()``
    the mean time per update since the last one is agreed over the workers
    in one small collective, so every rank fits the same model.

    Args:
        throughput_model: the :class:`~keras_adapt.perf_model.ThroughputModel` to feed
            (default: a new ``ThroughputModel(warmup=1, statistic="median",
            repeats=True, min_relative_error=VISIT_ERROR)``: the first
            interval after a change pays for new shapes; the median ignores
            an interval with an evaluation; two batches and their repeats
            make a usable fit when their times differ; a visit's time is
            good to :data:`VISIT_ERROR` at best).

    Example:

    >>> from keras_adapt.policies import UpdateTimer
    >>> timer = UpdateTimer()
    >>> timer.begin_fit()
    >>> timer.begin_step(False)    # a fit's first step: nothing ran before it
    >>> timer.begin_step(True)     # the next one: the step before it is timed ...
    >>> timer.end_update()         # ... and completed an update
    >>> timer.model.configurations()   # fed by observe(batch) at the policy's adapt()
    {}
    """

    def __init__(self, throughput_model=None):
        if throughput_model is None:
            throughput_model = ThroughputModel(warmup=1, statistic="median", repeats=True,
                                               min_relative_error=VISIT_ERROR)
        elif not isinstance(throughput_model, ThroughputModel):
            raise invalid("throughput_model", throughput_model, "pass a "
                          "keras_adapt.perf_model.ThroughputModel or None", error=TypeError)
        #: The :class:`~keras_adapt.perf_model.ThroughputModel` fed by :meth:`observe`.
        self.model = throughput_model
        self._t_begin = None  # perf_counter at the current step's begin
        self._t_sum = 0.0  # step time since the last update
        self._interval_time = 0.0  # timed seconds since the last observation
        self._interval_updates = 0  # timed updates since the last observation

    def begin_fit(self):
        """A new ``fit``: nothing is being timed."""
        self._t_begin = None
        self._t_sum = 0.0
        self.reset_interval()

    def begin_step(self, previous_counts):
        """A micro-step begins; the one before it is counted when ``previous_counts``."""
        now = time.perf_counter()
        if self._t_begin is not None and previous_counts:
            self._t_sum += now - self._t_begin
        self._t_begin = now

    def end_epoch(self):
        """The epoch's last step ran with evaluation and epoch callbacks: drop it."""
        self._t_begin = None
        self._t_sum = 0.0

    def end_update(self):
        """An optimizer update completed: its micro-steps' time joins the interval."""
        if self._t_sum > 0.0:
            self._interval_time += self._t_sum
            self._interval_updates += 1
        self._t_sum = 0.0

    def reset_interval(self):
        """Forgets the updates timed since the last observation (the
        configuration changed: they would mix two)."""
        self._interval_time, self._interval_updates = 0.0, 0

    def time_ratio(self, now, then, configure, confidence=2.0, fit=None):
        """``T(now) / T(then)`` for two global batches, by :func:`step_time_ratio`,
        from ``fit`` (default: the model's current fit) whether or not it is
        usable; 1 (flat) when there is no fit yet or it cannot price one of
        them (an extrapolation to a non-positive time). ``configure`` maps a
        global batch to its ``(micro_batch, accumulation, workers)``
        (:meth:`BatchSizePolicy.configuration`); it is called only when
        there is a fit.

        Example:

        >>> from keras_adapt.policies import UpdateTimer
        >>> timer = UpdateTimer()
        >>> on_two = lambda m: (m // 2, 1, 2)             # 2 workers, no accumulation
        >>> timer.time_ratio(32, 128, on_two)             # nothing measured: flat
        1.0
        >>> for b, t in ((16, 0.010), (64, 0.020)):      # 10 ms at 32, 20 ms at 128
        ...     for _ in range(5):                        # (the first is a warm-up)
        ...         _ = timer.model.observe(b, t, workers=2)
        >>> # 0.5 measured, each visit good to 10% (VISIT_ERROR): drawn by 2 x (0.1 + 0.1)
        >>> round(timer.time_ratio(32, 128, on_two), 4)   # exp(log 0.5 + 0.4)
        0.7459
        """
        fit = self.model.fit() if fit is None else fit
        if not fit.fitted:
            return 1.0
        configs = configure(now), configure(then)
        try:
            predicted = [fit.predict_step_time(b, workers=n, accumulation=k, tentative=True)
                         for b, k, n in configs]
        except ValueError:
            return 1.0
        return step_time_ratio(*predicted, confidence)

    def observe(self, batch):
        """Feeds the model the mean update time since the last call at the
        configuration of ``batch`` (a :class:`keras_adapt.actuators.GlobalBatchSize`),
        agreed over the workers: the same call on every rank."""
        total, count = _hvd.host_allreduce_mean(
            [self._interval_time, float(self._interval_updates)], name="keras_adapt_update_timer")
        self.reset_interval()
        if count > 0 and total > 0:
            self.model.observe(batch.micro_batch_size, float(total / count),
                               workers=batch.workers, accumulation=batch.accumulation.steps)
