"""UpdateTimer: times a policy's optimizer updates and feeds a ThroughputModel."""

import threading
import time

from keras_adapt import _hvd
from keras_adapt.checks import invalid
from keras_adapt.formulas.goodput import step_time_ratio
from keras_adapt.formulas.throughput import ThroughputModel
from keras_adapt.monitors import step_pauses

#: The least relative standard error the policies' throughput model gives
#: one visit's step time (``min_relative_error``). A policy times a batch on
#: one visit of a few intervals; the next run's visit of the same batch
#: differs by more than those intervals' scatter says (measured on two CPU
#: workers: a batch's median update time varied between three runs of one
#: seed by 7% as the median coefficient of variation over 40 batches
#: visited, quartiles 5% and 12%). With the scatter alone, decisions whose price lay
#: within that noise of the hysteresis changed from run to run. With 10%
#: they do not (tested with simulated load between visits); the price is a
#: coarser resolution: a doubling's cost counts only where its step time
#: rises by about 1.5x or more (1.6x to 1.8x from two visited batches)
#: (docs/policies.md, "Why it is stable").
VISIT_ERROR = 0.1


class UpdateTimer:
    """Measures the seconds per optimizer update and feeds them to a throughput model.

    A batch-size policy that prices step times holds one (its
    ``update_timer``); :class:`~keras_adapt.policies.BatchSizePolicy` calls
    it from its Keras hooks, so a subclass only reads :attr:`model`. One
    micro-step's time runs from its begin to the next step's begin: what
    training actually gets through, the per-step work of callbacks
    included. Work that is not per step is left out
    (:mod:`keras_adapt.monitors.step_pauses`): the seconds of a
    :func:`~keras_adapt.monitors.paused` block on the training thread are
    subtracted from the step they fall in (``model.evaluate``, ``predict``,
    ``save`` and ``save_weights`` count as paused once the timer is
    attached to the model by :meth:`begin_fit`); an update marked by
    :func:`~keras_adapt.monitors.skip_update`, or with a pause on another
    thread, is not timed; nor are the update that ends an epoch
    (evaluation, epoch callbacks) and the one after it (a worker that
    finished the epoch's end first waits for the others at its
    collective). Every ``adapt()`` the mean time per timed update since
    the last one is agreed over the workers in one small collective, so
    every rank fits the same model.

    Args:
        throughput_model: the :class:`~keras_adapt.formulas.throughput.ThroughputModel` to feed
            (default: a new ``ThroughputModel(warmup=1, statistic="median",
            repeats=True, min_relative_error=VISIT_ERROR)``: the first
            interval after a change pays for new shapes; the median ignores
            an interval slowed by something nobody marked; two batches and
            their repeats make a usable fit when their times differ; a
            visit's time is good to :data:`VISIT_ERROR` at best).
        clock: the seconds clock (default ``time.perf_counter``).

    Example:

    >>> from keras_adapt.monitors import paused, skip_update
    >>> from keras_adapt.policies import UpdateTimer
    >>> now = [0.0]
    >>> timer = UpdateTimer(clock=lambda: now[0])
    >>> timer.begin_fit()
    >>> timer.begin_step(False)    # a fit's first step: nothing ran before it
    >>> now[0] += 0.5              # the step and its callbacks ...
    >>> with paused():             # ... and an evaluation, not counted
    ...     now[0] += 3.0
    >>> timer.begin_step(True)     # the next one: the step before it is timed ...
    >>> timer.end_update()         # ... and completed an update
    >>> now[0] += 0.5
    >>> skip_update()              # this one is not representative
    >>> timer.begin_step(True)
    >>> timer.end_update()
    >>> timer.timed(), timer.dropped_updates
    ((0.5, 1), 1)
    """

    def __init__(self, throughput_model=None, clock=time.perf_counter):
        if throughput_model is None:
            throughput_model = ThroughputModel(warmup=1, statistic="median", repeats=True,
                                               min_relative_error=VISIT_ERROR)
        elif not isinstance(throughput_model, ThroughputModel):
            raise invalid("throughput_model", throughput_model, "pass a "
                          "keras_adapt.formulas.throughput.ThroughputModel or None", error=TypeError)
        if not callable(clock):
            raise invalid("clock", clock, "pass a function returning seconds, such as "
                          "time.perf_counter", error=TypeError)
        #: The :class:`~keras_adapt.formulas.throughput.ThroughputModel` fed by :meth:`observe`.
        self.model = throughput_model
        #: Updates not timed so far (marked, paused on another thread, or at an epoch's end).
        self.dropped_updates = 0
        self._clock = clock
        self._thread = None  # the training thread: the one that begins the steps
        self._t_begin = None  # clock at the current step's begin
        self._paused = 0.0  # seconds paused on the training thread during the step
        self._pause_begin = None  # clock at the begin of an open pause
        self._t_sum = 0.0  # step time since the last update
        self._updates = 0  # updates ended (timed or not)
        self._skip_until = 0  # updates numbered below this are not timed
        self._interval_time = 0.0  # timed seconds since the last observation
        self._interval_updates = 0  # timed updates since the last observation
        step_pauses.listen(self)

    def begin_fit(self, model=None):
        """A new ``fit`` (of ``model``, whose ``evaluate``, ``predict``,
        ``save`` and ``save_weights`` then count as paused): nothing is being
        timed."""
        if model is not None:
            step_pauses.pause_model_work(model)
        self._t_begin = None
        self._t_sum = 0.0
        self.reset_interval()

    def begin_step(self, previous_counts):
        """A micro-step begins; the one before it is counted when ``previous_counts``."""
        now = self._clock()
        if self._t_begin is not None and previous_counts:
            self._t_sum += now - self._t_begin - self._paused
        self._thread = threading.get_ident()
        self._t_begin = now
        self._paused = 0.0
        self._pause_begin = None

    def end_epoch(self):
        """The epoch's last step ran with evaluation and epoch callbacks: its
        update is not timed, nor the next."""
        self._t_begin = None
        self._t_sum = 0.0
        self.skip(2)

    def end_update(self):
        """An optimizer update completed: its micro-steps' time joins the
        interval, unless it is not to be timed."""
        if self._updates < self._skip_until:
            self.dropped_updates += 1
        elif self._t_sum > 0.0:
            self._interval_time += self._t_sum
            self._interval_updates += 1
        self._t_sum = 0.0
        self._updates += 1

    def timed(self):
        """``(seconds, updates)`` timed since the last observation."""
        return self._interval_time, self._interval_updates

    # -- step_pauses' listener ---------------------------------------------------
    def pause(self):
        """A :func:`~keras_adapt.monitors.paused` block begins on this thread."""
        if self._t_begin is None:
            return
        if threading.get_ident() != self._thread:
            self.skip(1)  # it overlaps the step running on the training thread
        else:
            self._pause_begin = self._clock()

    def resume(self):
        """The block ends on this thread."""
        if self._t_begin is None:
            return
        if threading.get_ident() != self._thread:
            self.skip(1)
        elif self._pause_begin is not None:
            self._paused += self._clock() - self._pause_begin
            self._pause_begin = None

    def skip(self, count):
        """The update in progress and the ``count - 1`` after it are not timed."""
        self._skip_until = max(self._skip_until, self._updates + count)

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
