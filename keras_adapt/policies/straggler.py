"""StragglerPolicy: flags a worker that computes persistently slower than the others."""

import math
import statistics

from keras_adapt.policies.base import AdaptationPolicy, _check_positive_int


def _check_float(name, value, minimum, fix):
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or value < minimum:
        raise ValueError(f"{name}={value!r} is not valid; use {fix}")
    return float(value)


def slow_ranks(compute_times, threshold):
    """``{rank: ratio}`` of the workers whose compute time exceeds the median
    of all workers' by more than ``threshold`` (a fraction), ratio = own / median.

    Example:

    >>> from keras_adapt.policies.straggler import slow_ranks
    >>> slow_ranks([0.010, 0.030], threshold=0.067)
    {1: 1.5}
    >>> slow_ranks([0.010, 0.0105, 0.0102], threshold=0.067)
    {}
    """
    median = statistics.median(compute_times)
    if not median > 0.0:
        return {}
    return {r: c / median for r, c in enumerate(compute_times) if c > (1.0 + threshold) * median}


class StragglerPolicy(AdaptationPolicy):
    """Flags a worker whose compute time stays above the others' (a ``straggler`` event).

    Reads the agreed per-worker compute times of a
    :class:`~keras_adapt.callbacks.WorkerTimingMonitor` (its
    :meth:`~keras_adapt.callbacks.WorkerTimingMonitor.result`; compute time
    is a worker's step time minus its wait in the collectives, so it does
    not include waiting for the straggler). After a warm-up of
    ``warmup_s`` seconds of timed training, each new measurement marks the
    workers whose compute time exceeds the median of all workers' by more
    than ``threshold`` (:func:`slow_ranks`); a worker marked in
    ``patience`` consecutive measurements is flagged: one ``straggler``
    event (``after``: ``straggler_rank``, ``ratio`` to the median, its
    ``compute_time`` and the ``median_compute_time``). It is flagged again
    only after a measurement that does not mark it. The defaults follow
    CM-DARE's bottleneck detection (30 s warm-up, 6.7 % threshold).

    The measurements come from the monitor's allgather and the warm-up is
    counted in the measured step time, so every worker makes the same
    decisions at the same step. The policy records; it does not change the
    job.

    Args:
        monitor: the run's ``WorkerTimingMonitor`` (in the same callback
            list, before this policy).
        warmup_s: seconds of timed training before the first decision
            (>= 0; the sum of the measured step times).
        threshold: how much above the median (a fraction, > 0) counts as slow.
        patience: consecutive slow measurements before a worker is flagged.
        interval: optimizer updates between checks for a new measurement
            (default: the monitor's interval).
        log_dir, verbose: see :class:`AdaptationPolicy`.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import WorkerTimingMonitor
    >>> from keras_adapt.policies import StragglerPolicy
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    >>> monitor = WorkerTimingMonitor(interval=2)
    >>> policy = StragglerPolicy(monitor, warmup_s=0.0, patience=2)
    >>> _ = model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, verbose=0,
    ...               callbacks=[monitor, policy])
    >>> policy.events  # one worker: never slower than itself
    []
    """

    def __init__(self, monitor, warmup_s=30.0, threshold=0.067, patience=3, interval=None,
                 log_dir=None, verbose=0):
        from keras_adapt.callbacks import WorkerTimingMonitor

        if not isinstance(monitor, WorkerTimingMonitor):
            raise TypeError(
                f"monitor={monitor!r} is not valid; pass the WorkerTimingMonitor of the "
                "same fit, e.g. m = WorkerTimingMonitor(10); StragglerPolicy(m), "
                "callbacks=[m, policy]"
            )
        super().__init__(interval=monitor.interval if interval is None else interval,
                         log_dir=log_dir, verbose=verbose)
        self.monitor = monitor
        self.warmup_s = _check_float("warmup_s", warmup_s, 0.0, "seconds >= 0 (e.g. 30)")
        self.threshold = _check_float("threshold", threshold, 0.0,
                                      "a fraction > 0 (e.g. 0.067 for 6.7 %)")
        if self.threshold == 0.0:
            raise ValueError(f"threshold={threshold!r} is not valid; use a fraction > 0 "
                             "(e.g. 0.067 for 6.7 %)")
        self.patience = _check_positive_int("patience", patience)
        self._reset()

    def _reset(self):
        self._seen = self.monitor.measurements
        self._timed_s = 0.0
        self._streaks = {}

    def on_adapt_begin(self, values):
        self._reset()

    def adapt(self, step, values):
        self._check_measurement()

    def on_epoch_adapt(self, epoch, values):
        self._check_measurement()

    def _check_measurement(self):
        if self.monitor.measurements == self._seen:
            return  # no new measurement since the last check
        self._seen = self.monitor.measurements
        result = self.monitor.result()
        warm = self._timed_s >= self.warmup_s
        self._timed_s += result["step_time"] * result["steps"]
        if not warm:
            return
        compute = result["compute_time"]
        slow = slow_ranks(compute, self.threshold)
        self._streaks = {r: self._streaks.get(r, 0) + 1 for r in slow}
        median = statistics.median(compute)
        for rank, ratio in sorted(slow.items()):
            if self._streaks[rank] == self.patience:
                self.record(
                    "straggler",
                    f"rank {rank} computes {ratio:.3g}x the median for {self.patience} "
                    f"measurements (threshold {1.0 + self.threshold:.3g}x)",
                    {"median_compute_time": median},
                    {"straggler_rank": rank, "ratio": ratio, "compute_time": compute[rank],
                     "median_compute_time": median})
