"""Policies that ask for more or fewer workers: ResizePolicy and two rules.

A resize policy decides a worker count and asks for it through
:class:`keras_adapt.actuators.WorkerTarget`, which writes the target file
that ``keras-adapt discover`` (the ``--host-discovery-script`` of
``horovodrun``) reads; Horovod Elastic then starts or stops workers. The
request is recorded as a ``resize`` event whose ``after`` holds
``target_workers``; the membership change itself happens later (docs/elastic_policies.md).
"""

import collections
import math
import statistics

from keras_adapt import _hvd
from keras_adapt.actuators import WorkerTarget
from keras_adapt.checks import check_bool, check_float, check_int, invalid
from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.policies.timing_driven import TimingDrivenPolicy


class ResizePolicy(AdaptationPolicy):
    """Base class of the policies that change the number of workers.

    Subclasses decide from identical inputs on every rank (allreduced
    statistics, allgathered timings) and call :meth:`request_workers`.
    A request is written only when it changes something: not when the
    count asked for is the current count with no other request pending,
    not when it was already asked for, and not within
    ``min_change_interval`` updates of the previous request. Rank 0 writes
    the target file; every rank records the same ``resize`` event
    (``before``: ``workers``, ``target_workers``; ``after``: the same with
    the new target). A request stays *pending* until the job runs with that
    many workers (Horovod may not have the slots; the policy does not ask
    again for the same count meanwhile).

    Args:
        min_workers, max_workers: the counts the policy may ask for
            (``1 <= min_workers <= max_workers``; match ``horovodrun
            --min-np/--max-np``).
        target_file: the file ``keras-adapt discover`` reads (default: the
            environment variable ``KERAS_ADAPT_TARGET_FILE``).
        min_change_interval: optimizer updates between two requests (>= 0).
        interval, log_dir, verbose: see :class:`AdaptationPolicy`.

    Example (ask for one more worker after every epoch, up to 4):

    >>> import os, tempfile
    >>> from keras_adapt.policies import ResizePolicy
    >>> class OneMorePerEpoch(ResizePolicy):
    ...     def on_epoch_adapt(self, epoch, values):
    ...         if self.workers < self.max_workers:
    ...             self.request_workers(self.workers + 1, f"epoch {epoch} ended")
    >>> policy = OneMorePerEpoch(1, 4, target_file=os.path.join(tempfile.mkdtemp(), "target"))
    >>> policy.pending is None
    True
    """

    def __init__(self, min_workers, max_workers, target_file=None, min_change_interval=0,
                 interval=10, log_dir=None, verbose=0):
        super().__init__(interval=interval, log_dir=log_dir, verbose=verbose)
        self.min_workers = check_int("min_workers", min_workers)
        self.max_workers = check_int("max_workers", max_workers)
        if min_workers > max_workers:
            raise ValueError(f"min_workers={min_workers} is larger than max_workers="
                             f"{max_workers}; use min_workers <= max_workers")
        self.min_change_interval = check_int("min_change_interval", min_change_interval, 0)
        self.target = WorkerTarget(target_file, min_workers=min_workers, max_workers=max_workers)
        self._last_request = None  # update of the last request
        self._pending = None  # the count asked for and not yet reached
        self._proposal = None  # (count, consecutive proposals) of propose()

    @property
    def workers(self):
        """The number of workers the job runs with now (``hvd.size()``)."""
        return _hvd.size()

    @property
    def pending(self):
        """The count requested and not reached yet, or None."""
        if self._pending is not None and self._pending == self.workers:
            self._pending = None
        return self._pending

    def request_workers(self, workers, reason, details=None):
        """Asks for ``workers`` workers; returns the ``resize`` event, or None
        when nothing was requested (see the class doc).

        ``details``: measurements behind the decision (a JSON-able dict),
        added to the event's ``before`` and ``after``. Raises ``ValueError``
        for a count outside ``[min_workers, max_workers]``.
        """
        workers = check_int("workers", workers)
        if not self.min_workers <= workers <= self.max_workers:
            raise invalid("workers", workers, f"{type(self).__name__} asks for "
                          f"{self.min_workers} to {self.max_workers} workers "
                          "(min_workers, max_workers)")
        current, pending = self.workers, self.pending
        if workers == (current if pending is None else pending):
            return None
        step = self.step
        if self._last_request is not None and step - self._last_request < self.min_change_interval:
            return None
        before_target = current if pending is None else pending
        self.target.request(workers)
        self._last_request = step
        self._pending = None if workers == current else workers
        details = dict(details or {})
        return self.record("resize", reason,
                           {"workers": current, "target_workers": before_target, **details},
                           {"workers": current, "target_workers": workers, **details})

    def propose(self, proposal, patience, details):
        """Requests ``proposal`` (``(count, reason)``, or None for "no change")
        once the same count was proposed ``patience`` times in a row;
        ``details()`` gives the event's measurements. Returns the ``resize``
        event, or None."""
        if proposal is None or proposal[0] == self.workers:
            self._proposal = None
            return None
        target, reason = proposal
        streak = self._proposal[1] + 1 if self._proposal and self._proposal[0] == target else 1
        self._proposal = (target, streak)
        if streak < patience:
            return None
        event = self.request_workers(target, reason, details())
        if event is not None:
            self._proposal = None
        return event

    def get_state(self):
        state = super().get_state()
        state.update(last_request=self._last_request, pending=self._pending)
        return state

    def restore(self, state):
        super().restore(state)
        self._last_request = state.get("last_request")
        self._pending = state.get("pending")

    def get_config(self):
        config = super().get_config()
        config.update(min_workers=self.min_workers, max_workers=self.max_workers,
                      target_file=self.target.target_file,
                      min_change_interval=self.min_change_interval)
        return config


def step_pays(low, high, throughput_low, throughput_high, efficiency):
    """Whether going from ``low`` to ``high`` workers pays: the throughput
    gained per added worker is at least ``efficiency`` times the per-worker
    throughput at ``low``.

    Example:

    >>> from keras_adapt.policies.worker_scaling import step_pays
    >>> step_pays(1, 2, 100.0, 185.0, 0.8), step_pays(1, 2, 100.0, 175.0, 0.8)
    (True, False)
    """
    gain = (throughput_high - throughput_low) / (high - low)
    return gain >= efficiency * throughput_low / low


class ThroughputScalingPolicy(TimingDrivenPolicy, ResizePolicy):
    """Adds workers while each one pays for itself, removes the last one when it does not.

    Reads the global throughput (samples/s) that a
    :class:`~keras_adapt.callbacks.WorkerTimingMonitor` measures and
    allgathers (identical on every rank), and keeps the recent
    measurements per worker count (the first ``warmup_measurements`` after
    each change of count are left out: new workers trace and warm up). With
    T(N) the median of the kept measurements at N workers, a step from N to
    M > N workers *pays* when ``(T(M) - T(N)) / (M - N) >= efficiency x
    T(N) / N`` (:func:`step_pays`): each added worker adds at least
    ``efficiency`` of what a worker contributed before. At N workers:

    * below ``min_workers`` or above ``max_workers``: ask for the bound;
    * the step from the largest measured count below N to N did not pay:
      ask for N - 1 (remove a worker);
    * otherwise, below ``max_workers``: if T(N + 1) was measured, ask for
      N + 1 when that step pays; if not, and a ``throughput_model``
      (:class:`keras_adapt.formulas.throughput.ThroughputModel`) predicts T(N + 1)
      from a determined fit, ask when the predicted step pays; without a
      prediction, ask for N + 1 to measure it.

    A step measured not to pay is never tried again from below, so the
    count settles at the largest N whose steps all paid. A proposal must
    come ``patience`` measurements in a row before it is requested.

    Args:
        min_workers, max_workers: bounds of the worker count.
        monitor: the run's ``WorkerTimingMonitor`` (in the callback list
            before this policy), or an object with its ``measurements``
            counter and ``new_measurement(since)`` returning ``(count,
            {"throughput": samples/s, "step_time": s, ...})`` (identical on
            every rank) or None when nothing was measured since ``since``.
        efficiency: the fraction of a worker's throughput an added worker
            must add (0 < efficiency <= 1; 0.8 by default).
        warmup_measurements: measurements left out after each change of
            the worker count (>= 0).
        patience: consecutive identical proposals before a request (>= 1).
        window: measurements kept per worker count (>= 1).
        throughput_model: a ``ThroughputModel`` to feed and predict the next count
            with (optional; it predicts once it has seen several batch
            sizes or counts, see docs/throughput_model.md).
        target_file, min_change_interval, log_dir, verbose: see
            :class:`ResizePolicy`.
        interval: updates between checks for a new measurement (default:
            the monitor's interval).

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.callbacks import WorkerTimingMonitor
    >>> from keras_adapt.policies import ThroughputScalingPolicy
    >>> monitor = WorkerTimingMonitor(interval=10)
    >>> policy = ThroughputScalingPolicy(1, 4, monitor, efficiency=0.8,
    ...                                  target_file=os.path.join(tempfile.mkdtemp(), "t"))
    >>> for n, t in ((1, 100.0), (2, 190.0), (3, 230.0)):
    ...     policy.throughput[n] = [t]
    >>> policy.choose(2), policy.choose(3)[0]   # 2 -> 3 adds 40 < 0.8 x 95
    (None, 2)
    """

    def __init__(self, min_workers, max_workers, monitor, efficiency=0.8, warmup_measurements=1,
                 patience=2, window=8, throughput_model=None, target_file=None,
                 min_change_interval=0, interval=None, log_dir=None, verbose=0):
        if interval is None:
            interval = getattr(monitor, "interval", 10)
        super().__init__(min_workers, max_workers, target_file=target_file,
                         min_change_interval=min_change_interval, interval=interval,
                         log_dir=log_dir, verbose=verbose)
        self.follow(monitor, "ThroughputScalingPolicy(1, 4, m)")
        self.efficiency = check_float("efficiency", efficiency, 0.0, 1.0, low_open=True,
                                      fix="use a fraction in (0, 1] (0.8: an added worker "
                                          "must add 80% of a worker's throughput)")
        self.warmup_measurements = check_int("warmup_measurements", warmup_measurements, 0)
        self.patience = check_int("patience", patience)
        self.window = check_int("window", window)
        if throughput_model is not None and not callable(
                getattr(throughput_model, "predict_throughput", None)):
            raise invalid("throughput_model", throughput_model, "pass a "
                          "keras_adapt.formulas.throughput.ThroughputModel or None", error=TypeError)
        self.throughput_model = throughput_model
        #: ``{workers: [samples/s, ...]}``: the kept measurements per worker count.
        self.throughput = {}
        self._counted_workers = None
        self._skip = 0
        #: ``(b, k)`` of the latest measurement: the per-worker micro-batch
        #: and micro-steps per update the model predicts the next count at.
        self.configuration = None

    def measured(self):
        """``{workers: T}``: the median kept throughput per worker count."""
        return {n: statistics.median(v) for n, v in sorted(self.throughput.items()) if v}

    def _predicted(self, workers):
        """The model's throughput at ``workers``, or None without a determined prediction."""
        if self.throughput_model is None or self.configuration is None:
            return None
        b, k = self.configuration
        try:
            prediction = self.throughput_model.predict_throughput(b, workers=workers,
                                                                  accumulation=k)
        except (RuntimeError, ValueError):
            return None
        return prediction.value if prediction.determined else None

    def choose(self, workers):
        """The rule: ``(count, reason)`` to ask for at ``workers`` workers, or None."""
        if workers < self.min_workers:
            return self.min_workers, f"{workers} workers < min_workers {self.min_workers}"
        if workers > self.max_workers:
            return self.max_workers, f"{workers} workers > max_workers {self.max_workers}"
        table = self.measured()
        if workers not in table:
            return None
        now = table[workers]
        below = [m for m in table if m < workers]
        if below and workers > self.min_workers:
            low = max(below)
            if not step_pays(low, workers, table[low], now, self.efficiency):
                return workers - 1, (
                    f"{low} -> {workers} workers added {(now - table[low]) / (workers - low):.4g} "
                    f"samples/s per worker < {self.efficiency:g} x {table[low] / low:.4g}")
        if workers >= self.max_workers:
            return None
        up = workers + 1
        if up in table:
            if step_pays(workers, up, now, table[up], self.efficiency):
                return up, (f"measured: {workers} -> {up} workers adds "
                            f"{table[up] - now:.4g} samples/s >= {self.efficiency:g} x "
                            f"{now / workers:.4g}")
            return None
        predicted = self._predicted(up)
        if predicted is not None:
            if step_pays(workers, up, now, predicted, self.efficiency):
                return up, (f"predicted: {workers} -> {up} workers adds "
                            f"{predicted - now:.4g} samples/s >= {self.efficiency:g} x "
                            f"{now / workers:.4g}")
            return None
        return up, f"{up} workers not measured yet (at {workers}: {now:.4g} samples/s)"

    def on_adapt_begin(self, values):
        # Only measurements made in this fit count: after an elastic reset a
        # new worker (fresh policy, restored state) and the others agree.
        self._proposal = None
        self.skip_past_measurements()

    def on_measurement(self, result):
        workers = self.workers
        if workers != self._counted_workers:
            self._counted_workers, self._skip, self._proposal = (
                workers, self.warmup_measurements, None)
        value = result.get("throughput", math.nan)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            return
        if self._skip > 0:
            self._skip -= 1
            return
        self.throughput.setdefault(workers, collections.deque(maxlen=self.window)).append(
            float(value))
        self._observe_model(result, float(value), workers)
        self.propose(self.choose(workers), self.patience, lambda: {
            "throughput": self.measured()[workers],
            "throughput_by_workers": {str(n): t for n, t in self.measured().items()}})

    def _observe_model(self, result, throughput, workers):
        """Feeds the throughput model one update time at this configuration."""
        if self.throughput_model is None:
            return
        step_time = result.get("step_time", math.nan)
        if not (math.isfinite(step_time) and step_time > 0):
            return
        acc = self._accumulation()
        b = max(1, round(throughput * step_time / workers))
        self.configuration = (b, acc)
        self.throughput_model.observe(b, step_time * acc, workers=workers, accumulation=acc)

    def _accumulation(self):
        """The micro-steps per update now (1 without gradient accumulation)."""
        acc = self.optimizer.adapt_state.accumulation
        return 1 if acc is None else acc.steps_value

    def get_state(self):
        state = super().get_state()
        state["throughput"] = {str(n): list(v) for n, v in self.throughput.items()}
        return state

    def restore(self, state):
        super().restore(state)
        self.throughput = {int(n): collections.deque(v, maxlen=self.window)
                           for n, v in state.get("throughput", {}).items()}


def workers_for_noise_scale(gns, per_worker_batch):
    """The workers needed to process the critical batch at ``per_worker_batch``
    samples per worker and update, unrounded: ``gns / per_worker_batch``.

    Example:

    >>> from keras_adapt.policies.worker_scaling import workers_for_noise_scale
    >>> workers_for_noise_scale(300.0, 64)
    4.6875
    """
    return gns / per_worker_batch


class GNSWorkerScalingPolicy(ResizePolicy):
    """More workers when the critical batch exceeds what the current workers process.

    The gradient noise scale B_simple (``gns``) is the critical batch: up
    to it, a larger global batch buys almost proportionally fewer steps
    (McCandlish et al. 2018). With a per-worker batch b (samples per worker
    and update), N workers process N x b; when the noise scale outgrows
    that, more workers make each step as useful while the step time stays
    about the same: the policy the KungFu paper proposes for cluster size.
    Every ``interval`` updates, with ``raw = gns / b``
    (:func:`workers_for_noise_scale`) and ``needed = ceil(raw)`` clipped to
    ``[min_workers, max_workers]``, the proposal at N workers is:

    * ``needed`` when ``needed > N`` and ``raw >= N x (1 + hysteresis)``
      (the critical batch exceeds the current workers' batch by the margin);
    * with ``allow_decrease``, ``needed`` when ``needed < N`` and
      ``raw x (1 + hysteresis) <= N - 1`` (one worker fewer would still
      cover it with the margin);
    * nothing otherwise, or while the statistics cover fewer than
      ``warmup_updates`` updates, or when the noise scale is not finite.

    A proposal must come from ``patience`` new measurements of the
    statistics in a row before it is requested (a check that finds no new
    measurement counts for nothing). The noise scale is allreduced in the train step, so every
    rank proposes the same count at the same update.

    Args:
        min_workers, max_workers: bounds of the worker count.
        per_worker_batch: b, samples per worker and update (default: the
            global batch of the last measured update, from the gradient
            statistics, divided by the worker count).
        hysteresis: relative dead band (>= 0).
        patience: consecutive measurements proposing the same count before
            a request (>= 1).
        warmup_updates: updates the statistics must cover first (>= 0).
        allow_decrease: also remove workers when the noise scale falls.
        target_file, min_change_interval, interval, log_dir, verbose: see
            :class:`ResizePolicy`.

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.policies import GNSWorkerScalingPolicy
    >>> policy = GNSWorkerScalingPolicy(1, 8, per_worker_batch=64, hysteresis=0.25,
    ...                                 target_file=os.path.join(tempfile.mkdtemp(), "t"))
    >>> policy.choose(2, gns=300.0)[0], policy.choose(2, gns=150.0), policy.choose(4, gns=100.0)[0]
    (5, None, 2)
    """

    needs_statistics = True

    def __init__(self, min_workers, max_workers, per_worker_batch=None, hysteresis=0.25,
                 patience=2, warmup_updates=50, allow_decrease=True, target_file=None,
                 min_change_interval=0, interval=10, log_dir=None, verbose=0):
        super().__init__(min_workers, max_workers, target_file=target_file,
                         min_change_interval=min_change_interval, interval=interval,
                         log_dir=log_dir, verbose=verbose)
        if per_worker_batch is not None:
            per_worker_batch = check_int("per_worker_batch", per_worker_batch)
        self.per_worker_batch = per_worker_batch
        self.hysteresis = check_float("hysteresis", hysteresis)
        self.patience = check_int("patience", patience)
        self.warmup_updates = check_int("warmup_updates", warmup_updates, 0)
        self.allow_decrease = check_bool("allow_decrease", allow_decrease)
        self._measurement = None  # the statistics' measurement count at the last check
        self._global_batch = math.nan

    def measurements(self, result=None):
        result = self.model.optimizer.gradient_statistics.result()
        self._global_batch = float(result["batch_size"])
        return super().measurements(result)

    def batch_per_worker(self, workers):
        """b: ``per_worker_batch``, or the last measured global batch / ``workers``."""
        if self.per_worker_batch is not None:
            return float(self.per_worker_batch)
        return self._global_batch / workers

    def choose(self, workers, gns, per_worker_batch=None):
        """The rule: ``(count, reason)`` to ask for at ``workers`` workers, or None."""
        b = self.per_worker_batch if per_worker_batch is None else per_worker_batch
        if gns is None or not math.isfinite(gns) or not (b and b > 0 and math.isfinite(b)):
            return None
        raw = workers_for_noise_scale(gns, b)
        needed = min(max(math.ceil(raw - 1e-9), self.min_workers), self.max_workers)
        band = 1.0 + self.hysteresis
        if needed > workers and raw >= workers * band:
            return needed, (f"gns {gns:.4g} > {workers} workers x {b:g} per worker "
                            f"(x{band:g}): {raw:.3g} workers needed")
        if self.allow_decrease and needed < workers and raw * band <= workers - 1:
            return needed, (f"gns {gns:.4g} needs {raw:.3g} workers of {b:g}; "
                            f"{workers} are more than x{band:g} that")
        return None

    def on_adapt_begin(self, values):
        # The measurement already there when training (re)starts does not
        # count: after an elastic reset a new worker (fresh policy, restored
        # state and statistics) and the others count the same measurements.
        self._proposal = None
        self._measurement = values.get("updates")

    def adapt(self, step, values):
        if values.get("updates") == self._measurement:
            return  # no new measurement since the last check: patience counts measurements
        self._measurement = values.get("updates")
        workers = self.workers
        proposal = None
        if values.get("covered_updates", 0) >= self.warmup_updates:
            proposal = self.choose(workers, values.get("gns"), self.batch_per_worker(workers))
        self.propose(proposal, self.patience, lambda: {
            "gns": float(values["gns"]), "per_worker_batch": float(self.batch_per_worker(workers))})

    def get_config(self):
        config = super().get_config()
        config.update(per_worker_batch=self.per_worker_batch, hysteresis=self.hysteresis,
                      patience=self.patience, warmup_updates=self.warmup_updates,
                      allow_decrease=self.allow_decrease)
        return config
