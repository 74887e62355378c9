"""StragglerPolicy: flags a worker that computes persistently slower than the others."""

import math
import statistics
import warnings

from keras_adapt import _hvd
from keras_adapt.checks import check_choice, check_float, check_int
from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.policies.timing_driven import TimingDrivenPolicy


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


#: The MAD of normally distributed values times this is their standard deviation.
MAD_TO_SIGMA = 1.4826


def compute_ratios(compute_times):
    """Every worker's compute time over the median of all workers' (the
    ratio :func:`slow_ranks` compares with ``1 + threshold``); None when the
    median is not positive.

    Example:

    >>> from keras_adapt.policies.straggler import compute_ratios
    >>> compute_ratios([0.010, 0.030])
    [0.5, 1.5]
    """
    median = statistics.median(compute_times)
    if not median > 0.0:
        return None
    return [c / median for c in compute_times]


def noise_rule(ratios, threshold, patience, noise_multiple):
    """``(noise, threshold, patience)`` the policy judges with, from the
    compute ratios of its noise window (:func:`compute_ratios`, one list
    by rank per measurement, all workers healthy or not).

    ``noise`` is a robust standard deviation of the ratios: 1.4826 times
    the median absolute deviation of every worker's ratio from that worker's
    own median over the window (so a worker slow from the start shifts its
    own median, not the spread). The threshold is ``noise_multiple`` times
    it, at least ``threshold``. The patience is at least ``patience`` and
    longer than the longest run of consecutive window measurements in
    which one worker's ratio lay more than that threshold above its own
    median: a burst of load as long as one seen while healthy is not a
    straggler. No ratios (a window of 0): ``(0.0, threshold, patience)``.

    Example:

    >>> from keras_adapt.policies.straggler import noise_rule
    >>> # own medians .98 and 1.02; deviations 0, 0, .02, .02, .04 x 4, .06, .06
    >>> window = [[1.0, 1.0], [0.98, 1.02], [1.02, 0.98], [0.94, 1.06], [0.92, 1.08]]
    >>> noise, t, p = noise_rule(window, threshold=0.067, patience=3, noise_multiple=4.0)
    >>> round(noise, 5), round(t, 5), p       # 1.4826 x 0.04; 4 x that
    (0.0593, 0.23722, 3)
    >>> # quiet but for a burst of 3 measurements: the patience outlasts it
    >>> burst = [[1.0, 1.0]] + [[0.6, 1.4]] * 3 + [[1.0, 1.0]] * 3
    >>> noise_rule(burst, threshold=0.067, patience=3, noise_multiple=4.0)
    (0.0, 0.067, 4)
    """
    if not ratios:
        return 0.0, threshold, patience
    ranks = range(len(ratios[0]))
    own = [statistics.median(r[i] for r in ratios) for i in ranks]
    noise = MAD_TO_SIGMA * statistics.median(
        abs(r[i] - own[i]) for r in ratios for i in ranks)
    threshold = max(threshold, noise_multiple * noise)
    longest, run = 0, 0
    for r in ratios:
        run = run + 1 if any(r[i] - own[i] > threshold for i in ranks) else 0
        longest = max(longest, run)
    return noise, threshold, max(patience, longest + 1)


def proportional_batches(speeds, total):
    """Integer micro-batches proportional to ``speeds``, each >= 1, summing to ``total``.

    The rule of the rebalance: worker r gets about ``total * speeds[r] /
    sum(speeds)`` samples; the floors (at least 1) are completed by the
    largest remainders, ties to the lower rank, so every worker computes the
    same list from the same speeds.

    Example:

    >>> from keras_adapt.policies.straggler import proportional_batches
    >>> proportional_batches([1.0, 1.0 / 1.5], 64)   # rank 1 is 1.5x slower
    [38, 26]
    >>> proportional_batches([100.0, 1.0, 1.0], 5)
    [3, 1, 1]
    """
    n = len(speeds)
    if n == 0 or total < n or not all(math.isfinite(v) and v > 0.0 for v in speeds):
        raise ValueError(
            f"cannot split a batch of {total} by speeds {speeds}; need positive finite "
            f"speeds and a batch of at least one sample per worker")
    ideal = [total * v / sum(speeds) for v in speeds]
    out = [max(1, math.floor(x)) for x in ideal]
    by_remainder = sorted(range(n), key=lambda r: (-(ideal[r] - out[r]), r))
    k = 0
    while sum(out) < total:
        out[by_remainder[k % n]] += 1
        k += 1
    by_excess = sorted(range(n), key=lambda r: (ideal[r] - out[r], r))
    k = 0
    while sum(out) > total:
        r = by_excess[k % n]
        if out[r] > 1:
            out[r] -= 1
        k += 1
    return out


def exclusion_decision(hosts, rank, leaving, min_workers):
    """Whether worker ``rank``'s host may be excluded: ``(excluded,
    workers_left, why)``.

    ``hosts``: every worker's host, by rank; ``leaving``: hosts already
    excluded whose workers still run. Excluding a host removes all its
    workers; it is refused when the host is already leaving
    (``workers_left`` None) or when fewer than ``min_workers`` workers
    would be left (never the last host: ``min_workers >= 1``).

    Example:

    >>> from keras_adapt.policies.straggler import exclusion_decision
    >>> exclusion_decision(["a", "b", "b"], 1, [], min_workers=1)
    (True, 1, '1 of 3 workers left')
    >>> exclusion_decision(["a", "b", "b"], 1, [], min_workers=2)[:2]
    (False, 1)
    >>> exclusion_decision(["a", "a"], 1, [], min_workers=1)
    (False, 0, 'that would leave 0 of 2 workers, fewer than min_workers=1')
    """
    host = hosts[rank]
    if host in leaving:
        return False, None, "it was already excluded"
    gone = set(leaving) | {host}
    left = sum(h not in gone for h in hosts)
    if left < min_workers:
        return False, left, (f"that would leave {left} of {len(hosts)} workers, fewer than "
                             f"min_workers={min_workers}")
    return True, left, f"{left} of {len(hosts)} workers left"


ACTIONS = ("record", "rebalance", "exclude")


class StragglerPolicy(TimingDrivenPolicy, AdaptationPolicy):
    """Flags a worker whose compute time stays above the others' (a ``straggler`` event).

    Reads the agreed per-worker compute times of a
    :class:`~keras_adapt.callbacks.WorkerTimingMonitor` (its
    :meth:`~keras_adapt.callbacks.WorkerTimingMonitor.result`; compute time
    is a worker's step time minus its wait in the collectives, so it does
    not include waiting for the straggler). After a warm-up of
    ``warmup_s`` seconds of timed training, the next ``noise_window``
    measurements measure the noise of this machine's compute times
    (:func:`noise_rule`): the threshold becomes ``noise_multiple`` times a
    robust standard deviation of every worker's ratio to the median, at
    least ``threshold``, and the patience outlasts any burst seen in the
    window, at least ``patience``. Each measurement after that marks the
    workers whose compute time exceeds the median of all workers' by more
    than that threshold (:func:`slow_ranks`); a worker marked in that
    many consecutive measurements is flagged: one ``straggler`` event
    (``after``: ``straggler_rank``, ``ratio`` to the median, its
    ``compute_time`` and the ``median_compute_time``). It is flagged again
    only after a measurement that does not mark it. :attr:`noise`,
    :attr:`judged_threshold` and :attr:`judged_patience` hold what was
    measured and derived. The warm-up and the floor follow CM-DARE's
    bottleneck detection (30 s, 6.7 %).

    The measurements come from the monitor's allgather and the warm-up is
    counted in the measured step time, so every worker makes the same
    decisions at the same step.

    ``action="record"`` (default) only records. ``action="rebalance"``
    also gives every worker a micro-batch proportional to its speed (its
    micro-batch / its compute time) when a worker is flagged, keeping the
    global batch (:func:`proportional_batches`), through
    :class:`~keras_adapt.actuators.RankBatchSizes` on ``dataset``: the
    update stays the mean gradient of the global batch and the gradient
    statistics stay unbiased. The event's ``before`` and ``after`` then hold
    the per-rank ``batch_sizes``. The measurement that follows a change
    mixes old and new batches and is not judged. A worker still (or newly)
    slower after a rebalance is flagged again after the patience, and the
    batches are split again from the new speeds -- unless the step got
    longer by more than the threshold since the last rebalance (a worker's
    compute time does not grow with its batch: fixed costs dominate, and
    rebalancing cannot help): then the last split is undone and the policy
    stops rebalancing (it still records). Speeds and step times are the
    means over the last patience's measurements.

    ``action="exclude"`` (jobs under :mod:`keras_adapt.elastic`, started
    by ``horovodrun --host-discovery-script`` running ``keras-adapt
    discover --exclude-file F``) leaves the flagged worker's *host* out of
    the job: rank 0 appends it to the exclusion file
    (:class:`~keras_adapt.actuators.HostExclusion`), the next discovery
    omits it, and Horovod Elastic stops the workers there (all of that
    host's workers); the others continue from the last commit, and the
    elastic state records a ``resize`` event. The event's ``after`` holds
    ``action`` (``"exclude"``, or ``"record"`` when the host was not
    excluded) and the ``host``. The ranks' hosts are gathered (one
    allgather) when a worker is first flagged in a ``fit`` (after a change
    of membership, ``keras_adapt.elastic.fit`` starts a new one). A host
    is never excluded when that would leave fewer than ``min_workers``
    workers (never the last host): the event then says why and a warning
    is issued. Excluded hosts stay out for the rest of the run; remove a
    host's line from the file to bring it back.

    Args:
        monitor: the run's ``WorkerTimingMonitor`` (in the same callback
            list, before this policy).
        warmup_s: seconds of timed training before the first decision
            (>= 0; the sum of the measured step times).
        threshold: the least excess over the median (a fraction, > 0) that
            counts as slow, whatever the noise.
        patience: the fewest consecutive slow measurements before a worker
            is flagged.
        noise_window: measurements after the warm-up that measure the
            noise and are not judged (int >= 0; 0: judge with
            ``threshold`` and ``patience`` as they are).
        noise_multiple: the threshold in robust standard deviations of the
            compute ratios (> 0).
        interval: optimizer updates between checks for a new measurement
            (default: the monitor's interval).
        action: ``"record"`` (default), ``"rebalance"`` or ``"exclude"``.
        dataset: with ``action="rebalance"``: the
            :class:`~keras_adapt.data.AdaptiveBatchDataset` that feeds ``fit``.
        exclude_file: with ``action="exclude"``: the exclusion file
            ``keras-adapt discover`` reads (default: the environment
            variable ``KERAS_ADAPT_EXCLUDE_FILE``).
        min_workers: with ``action="exclude"``: the fewest workers an
            exclusion may leave (default 1; match ``horovodrun --min-np``).
        log_dir, verbose: see :class:`AdaptationPolicy`.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import WorkerTimingMonitor
    >>> from keras_adapt.policies import StragglerPolicy
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    >>> monitor = WorkerTimingMonitor(interval=2)
    >>> policy = StragglerPolicy(monitor, warmup_s=0.0, patience=2, noise_window=2)
    >>> _ = model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, verbose=0,
    ...               callbacks=[monitor, policy])
    >>> policy.events  # one worker: never slower than itself
    []
    >>> policy.noise, policy.judged_threshold, policy.judged_patience
    (0.0, 0.067, 2)
    """

    def __init__(self, monitor, warmup_s=30.0, threshold=0.067, patience=3, noise_window=10,
                 noise_multiple=4.0, interval=None, action="record", dataset=None,
                 exclude_file=None, min_workers=None, log_dir=None, verbose=0):
        from keras_adapt.callbacks.worker_timing_monitor import WorkerTimingMonitor

        self.follow(monitor, "StragglerPolicy(m)", WorkerTimingMonitor)
        super().__init__(interval=monitor.interval if interval is None else interval,
                         log_dir=log_dir, verbose=verbose)
        self.warmup_s = check_float("warmup_s", warmup_s, fix="use seconds >= 0 (e.g. 30)")
        self.threshold = check_float("threshold", threshold, low_open=True,
                                     fix="use a fraction > 0 (e.g. 0.067 for 6.7 %)")
        self.patience = check_int("patience", patience)
        self.noise_window = check_int("noise_window", noise_window, 0)
        self.noise_multiple = check_float("noise_multiple", noise_multiple, low_open=True,
                                          fix="use a multiple > 0 of the noise (e.g. 4)")
        check_choice("action", action, ACTIONS)
        if action == "rebalance" and not hasattr(dataset, "rank_micro_batch_sizes"):
            raise ValueError(
                f"action='rebalance' needs the AdaptiveBatchDataset that feeds fit "
                f"(dataset=...), got dataset={dataset!r}; e.g. ds = AdaptiveBatchDataset(x, y, "
                "micro_batch_size=64); StragglerPolicy(m, action='rebalance', dataset=ds); "
                "model.fit(ds.dataset, steps_per_epoch=ds.steps_per_epoch, ...)")
        if action == "record" and dataset is not None:
            raise ValueError("dataset= is only used with action='rebalance'; drop it or "
                             "pass action='rebalance'")
        if action != "exclude" and (exclude_file is not None or min_workers is not None):
            raise ValueError("exclude_file= and min_workers= are only used with "
                             "action='exclude'; drop them or pass action='exclude'")
        self.action = action
        self.dataset = dataset
        self.batches = None  # the RankBatchSizes actuator (rebalance), made in on_attach
        #: The HostExclusion actuator (action="exclude"), else None.
        self.exclusion = None
        self.min_workers = None
        if action == "exclude":
            from keras_adapt.actuators import HostExclusion

            self.min_workers = check_int(
                "min_workers", 1 if min_workers is None else min_workers)
            self.exclusion = HostExclusion(exclude_file)
        self._reset()

    def on_attach(self, model):
        if self.action == "rebalance" and self.batches is None:
            from keras_adapt.actuators import RankBatchSizes

            self.batches = RankBatchSizes(model, self.dataset)

    def _reset(self):
        self.skip_past_measurements()
        self._timed_s = 0.0
        self._streaks = {}
        self._settling = False
        self._undo = None  # (sizes, step time) before the last rebalance
        self._recent = []  # (compute times, step time) judged since the last change
        self._stopped = False
        self._hosts = None  # every rank's host (exclude), gathered once per fit
        self._leaving = []  # hosts excluded in this fit (their workers may still run)
        self._window = []  # the noise window's compute ratios
        #: The optimizer step of the measurement that completed the warm-up
        #: and the noise window (the measurements after it are judged); None before.
        self.warmup_end_step = None
        #: The noise measured in the window (a robust standard deviation of
        #: the compute ratios, :func:`noise_rule`); None before.
        self.noise = None
        #: The threshold and patience of the judged measurements (None before).
        self.judged_threshold = None
        self.judged_patience = None

    def _rebalance(self, sizes):
        """Splits the global batch by speed (micro-batch / compute time, the
        means over the last ``patience`` measurements); returns a note for
        the event. A rebalance after which the step got longer by more than
        the threshold (compute time that does not grow with the batch: fixed
        costs dominate) is undone, and the policy stops rebalancing."""
        compute = [statistics.fmean(c[r] for c, _ in self._recent) for r in range(len(sizes))]
        step_time = statistics.fmean(t for _, t in self._recent)
        if self._stopped:
            return "; not rebalanced (an earlier rebalance did not help)"
        if self._undo is not None and step_time > (1.0 + self.judged_threshold) * self._undo[1]:
            previous, previous_time = self._undo
            self._undo = None
            self._stopped = True
            self._change(previous)
            return (f"; micro-batches {sizes} made the step longer ({step_time:.4g} s vs "
                    f"{previous_time:.4g} s): back to {previous}, rebalancing stopped")
        if not all(c > 0.0 and math.isfinite(c) for c in compute):
            return ""
        new = proportional_batches([b / c for b, c in zip(sizes, compute)], sum(sizes))
        if new == sizes:
            return f"; micro-batches {sizes} already proportional to speed"
        self._undo = (sizes, step_time)
        self._change(new)
        return f"; micro-batches {sizes} -> {new} (proportional to speed)"

    def _change(self, sizes):
        self.batches.set(sizes)
        self._streaks = {}
        self._recent = []
        self._settling = True

    def _exclude(self, ranks):
        """Excludes the hosts of the flagged ``ranks`` as far as ``min_workers``
        allows (:func:`exclusion_decision`); ``{rank: (event after-values,
        note for the reason)}``."""
        if self._hosts is None:
            self._hosts = self.exclusion.worker_hosts()  # one collective, on every rank alike
        out = {}
        for rank in ranks:
            host = self._hosts[rank]
            excluded, left, why = exclusion_decision(self._hosts, rank, self._leaving,
                                                     self.min_workers)
            if not excluded:
                if left is not None and _hvd.rank() == 0:
                    warnings.warn(f"StragglerPolicy: host {host} not excluded: {why}",
                                  RuntimeWarning, stacklevel=2)
                out[rank] = ({"action": "record", "host": host},
                             f"; host {host} not excluded: {why}")
                continue
            self.exclusion.exclude(host)
            self._leaving.append(host)
            out[rank] = ({"action": "exclude", "host": host, "workers_left": left},
                         f"; host {host} excluded ({why})")
        return out

    def on_adapt_begin(self, values):
        self._reset()
        if self.exclusion is not None and _hvd.size() > 1:
            self.exclusion.this_host()  # not an elastic job: a clear error before any step
        if self.warmup_s == 0.0:
            self._warm()

    def _warm(self):
        """The warm-up is over: the noise window starts (or, without one, judging)."""
        if self.noise_window == 0:
            self._judge()

    def _judge(self):
        """The noise window is complete: derive the threshold and patience."""
        self.noise, self.judged_threshold, self.judged_patience = noise_rule(
            self._window, self.threshold, self.patience, self.noise_multiple)
        self.warmup_end_step = self.step

    def on_measurement(self, result):
        warm = self._timed_s >= self.warmup_s
        self._timed_s += result["step_time"] * result["steps"]
        if not warm:
            if self._timed_s >= self.warmup_s:
                self._warm()
            return
        compute = result["compute_time"]
        if self.judged_threshold is None:
            ratios = compute_ratios(compute)
            if ratios is not None:
                self._window.append(ratios)
            if len(self._window) >= self.noise_window:
                self._judge()
            return
        if self._settling:
            # This interval mixes the batches before and after a rebalance.
            self._settling = False
            return
        patience = self.judged_patience
        self._recent = (self._recent + [(compute, result["step_time"])])[-patience:]
        slow = slow_ranks(compute, self.judged_threshold)
        self._streaks = {r: self._streaks.get(r, 0) + 1 for r in slow}
        median = statistics.median(compute)
        flagged = [(r, ratio) for r, ratio in sorted(slow.items())
                   if self._streaks[r] == patience]
        before, after, note, hosts = {"median_compute_time": median}, {}, "", {}
        if flagged and self.batches is not None:
            sizes = self.batches.sizes
            note = self._rebalance(sizes)
            before["batch_sizes"], after["batch_sizes"] = sizes, self.batches.sizes
        if flagged and self.exclusion is not None:
            hosts = self._exclude([rank for rank, _ in flagged])
        for rank, ratio in flagged:
            host_after, host_note = hosts.get(rank, ({}, ""))
            self.record(
                "straggler",
                f"rank {rank} computes {ratio:.3g}x the median for {patience} "
                f"measurements (threshold {1.0 + self.judged_threshold:.3g}x){note}{host_note}",
                dict(before),
                {"straggler_rank": rank, "ratio": ratio, "compute_time": compute[rank],
                 "median_compute_time": median, **after, **host_after})
