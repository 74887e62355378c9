"""Planning a training job from a run's logs: time and cost per worker count and batch size.

``keras-adapt plan LOGDIR --samples S`` (and :func:`make_plan`) answers
"how long, and at what price, would S samples of training take with N
workers at global batch B?" from what one run recorded:

1. **Observations.** Every write of ``AdaptTensorBoard`` gives each
   worker's mean time per micro-step over the last interval
   (``adapt/step_time/rank_<r>``) and the worker count (``adapt/workers``);
   the ``batch_size`` events give the per-worker micro-batch ``b`` and the
   accumulation ``k`` in effect between them (without events: ``k = 1``
   and ``b = batch / workers``, said in the plan's notes). An interval in
   which the configuration changed is dropped (:func:`run_observations`).
   One update takes ``k`` micro-steps, so its time is ``k`` x the mean
   over the workers.
2. **Throughput model.** Those update times fit
   :class:`keras_adapt.formulas.throughput.ThroughputModel` (the first interval of
   every visit to a configuration is dropped as warm-up, the median of the
   rest is the configuration's time). A fit that is not usable (too few
   configurations, or not better than a constant) stops the plan with its
   reason.
3. **Noise scale.** ``phi`` is the median of the last quarter of the
   ``adapt/gns`` points (late in the run, robust to single outliers), or
   the value given.
4. **Per worker count N and global batch B:** ``B = N*k*b`` with the
   largest micro-batch the run used (or ``max_micro_batch``) and the fewest
   micro-steps (:func:`split_batch`); the predicted update time ``T`` with
   its standard error; the throughput ``B/T``; the samples needed to make
   the progress of ``S`` samples at the base batch ``B0``
   (:func:`samples_needed`: ``S*(phi + B)/(phi + B0)``, Pollux's
   statistical efficiency); the time ``samples/B*T``; with a price per
   worker-hour the cost ``price*N*hours``; with a revocation rate the
   expected time and cost on preemptible machines
   (:func:`preemptible_time`).

A configuration the observations do not pin down (more workers than ever
ran, a micro-batch or accumulation outside the observed range, a
prediction resting on a split of costs the run could not separate, or an
uncertain one) is flagged in ``Row.flags``; the table marks it with ``*``.

Example:

>>> from keras_adapt import plan
>>> plan.split_batch(512, workers=4, max_micro_batch=64)      # b, k
(64, 2)
>>> round(plan.samples_needed(1000, batch=256, base_batch=64, noise_scale=192.0))
1750
>>> est = plan.preemptible_time(3600.0, workers=4, revocations_per_hour=0.5,
...                             checkpoint_seconds=100.0, restart_seconds=150.0)
>>> round(est.interval_seconds), round(est.wall_seconds)       # M = 1800 s
(600, 5600)
"""

import bisect
import dataclasses
import json
import math
import numbers

from keras_adapt.checks import check_float, check_int, invalid
from keras_adapt.formulas.goodput import statistical_efficiency
from keras_adapt.formulas.throughput import ThroughputModel
from keras_adapt.record import metadata
from keras_adapt.record.selection import select_runs

__all__ = ["NOISE_SCALE_TAIL", "Observation", "Plan", "PlanError", "PreemptibleEstimate", "Row",
           "RunObservations", "UNCERTAIN", "check_options", "format_table", "make_plan",
           "noise_scale", "plan_run", "preemptible_time", "run_observations", "samples_needed",
           "split_batch"]

#: The late part of the run whose median noise scale the plan uses: the
#: last quarter of the ``adapt/gns`` points.
NOISE_SCALE_TAIL = 0.25
#: A prediction whose relative standard error exceeds this is flagged.
UNCERTAIN = 0.10
#: Worker counts planned when none are given.
DEFAULT_WORKERS = (1, 2, 4, 8)


class PlanError(ValueError):
    """The logs or the options cannot give a plan; the message says why and what to do.

    Example:

    >>> from keras_adapt.plan import PlanError
    >>> isinstance(PlanError("no data"), ValueError)
    True
    """


# -- the formulas -------------------------------------------------------------

def samples_needed(samples, batch, base_batch, noise_scale):
    """Samples at global batch ``batch`` that make the progress of ``samples`` at ``base_batch``.

    ``samples / E(batch)`` with Pollux's statistical efficiency
    ``E(B) = (phi + B0)/(phi + B)``
    (docs/design.md#statistical-efficiency-and-goodput,
    :func:`keras_adapt.formulas.goodput.statistical_efficiency`), so
    ``samples * (phi + B)/(phi + B0)``: about the same samples while ``B``
    is well below the noise scale ``phi``, and ``B/B0`` times as many far
    above it.

    Example:

    >>> from keras_adapt.plan import samples_needed
    >>> samples_needed(1000, batch=64, base_batch=64, noise_scale=100.0)
    1000.0
    >>> samples_needed(1000, batch=300, base_batch=100, noise_scale=100.0)   # (100+300)/(100+100)
    2000.0
    """
    return float(samples) / statistical_efficiency(batch, base_batch, noise_scale)


@dataclasses.dataclass(frozen=True)
class PreemptibleEstimate:
    """Expected wall time of a job on machines that can be revoked.

    Attributes:
        wall_seconds: expected wall time, ``inf`` when revocations come
            faster than the job can checkpoint and restart.
        interval_seconds: checkpoint interval (Young's optimum), None
            without revocations.
        mtbr_seconds: the cluster's mean time between revocations, None
            without revocations.
        revocations: expected number of revocations during the job.
        checkpoints: number of checkpoints written (``work / interval``).

    Example:

    >>> from keras_adapt.plan import PreemptibleEstimate
    >>> PreemptibleEstimate(100.0, None, None, 0.0, 0.0).overhead(80.0)
    0.25
    """

    wall_seconds: float
    interval_seconds: float
    mtbr_seconds: float
    revocations: float
    checkpoints: float

    def overhead(self, work_seconds):
        """Extra time relative to ``work_seconds``: ``wall / work - 1``."""
        return self.wall_seconds / work_seconds - 1.0


def preemptible_time(work_seconds, workers, revocations_per_hour, checkpoint_seconds,
                     restart_seconds):
    """Expected wall time of ``work_seconds`` of training on N revocable workers.

    Each worker is revoked at rate ``lambda`` per hour (independently), so
    the cluster of N loses a worker every ``M = 1/(N*lambda)`` hours on
    average; a synchronous job then restarts from its last checkpoint (a
    replacement machine joins). Checkpoints cost ``C`` seconds and come every
    ``tau = sqrt(2*C*M)`` seconds of work: the interval that minimises the
    first-order waste ``C/tau + tau/(2*M)`` (Young 1974, "A first order
    approximation to the optimum checkpoint interval"; Daly 2006 refines it
    for C comparable to M). Each revocation loses on average half an
    interval of work plus the restart ``X``. Over the wall time ``W`` there
    are ``W/M`` revocations, so::

        W = work*(1 + C/tau) + (W/M)*(tau/2 + X)
        W = work*(1 + C/tau) / (1 - (tau/2 + X)/M)

    ``W`` is infinite when ``tau/2 + X >= M`` (the job never gets ahead).
    Without revocations (``lambda = 0``) there are no checkpoints and ``W =
    work``.

    Example:

    >>> from keras_adapt.plan import preemptible_time
    >>> est = preemptible_time(7200.0, workers=2, revocations_per_hour=0.25,
    ...                        checkpoint_seconds=36.0, restart_seconds=60.0)
    >>> est.mtbr_seconds, est.interval_seconds        # M = 1/(2*0.25) h, sqrt(2*36*7200)
    (7200.0, 720.0)
    >>> round(est.wall_seconds, 1)                    # 7200*1.05 / (1 - 420/7200)
    8028.3
    """
    for name, value in (("work_seconds", work_seconds), ("revocations_per_hour",
                        revocations_per_hour), ("checkpoint_seconds", checkpoint_seconds),
                        ("restart_seconds", restart_seconds)):
        _check_number(name, value, minimum=0.0)
    check_int("workers", workers, fix="pass the worker count as an int >= 1")
    work = float(work_seconds)
    if revocations_per_hour == 0:
        return PreemptibleEstimate(work, None, None, 0.0, 0.0)
    mtbr = 3600.0 / (workers * float(revocations_per_hour))
    tau = math.sqrt(2.0 * float(checkpoint_seconds) * mtbr)
    lost = tau / 2.0 + float(restart_seconds)
    if tau == 0.0:  # free checkpoints: checkpoint continuously, lose only the restarts
        busy = work
    else:
        busy = work * (1.0 + float(checkpoint_seconds) / tau)
    if lost >= mtbr:
        return PreemptibleEstimate(math.inf, tau, mtbr, math.inf, math.inf)
    wall = busy / (1.0 - lost / mtbr)
    return PreemptibleEstimate(wall, tau, mtbr, wall / mtbr, work / tau if tau else math.inf)


def split_batch(global_batch, workers, max_micro_batch):
    """``(b, k)`` with ``workers*k*b == global_batch``: the largest ``b <= max_micro_batch``.

    The fewest micro-steps ``k`` whose micro-batch fits, as
    :class:`keras_adapt.actuators.GlobalBatchSize` splits a batch (bigger
    micro-batches use the hardware better). None when ``global_batch`` is
    not a multiple of ``workers``.

    Example:

    >>> from keras_adapt.plan import split_batch
    >>> split_batch(96, 2, 32), split_batch(96, 2, 64), split_batch(100, 8, 64)
    ((24, 2), (48, 1), None)
    """
    if global_batch % workers:
        return None
    per_worker = global_batch // workers
    k = max(1, -(-per_worker // max_micro_batch))
    while per_worker % k:
        k += 1
    return per_worker // k, k


# -- reading a run ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Observation:
    """One write interval's update time and the configuration it ran at.

    ``step`` is the optimizer update of the write, ``update_seconds`` the
    mean over the workers of their mean micro-step time, times ``k``.

    Example:

    >>> from keras_adapt.plan import Observation
    >>> Observation(40, 32, 2, 1, 0.01).global_batch
    64
    """

    step: int
    micro_batch: int
    workers: int
    accumulation: int
    update_seconds: float

    @property
    def global_batch(self):
        """``workers * accumulation * micro_batch``."""
        return self.workers * self.accumulation * self.micro_batch


@dataclasses.dataclass(frozen=True)
class RunObservations:
    """What :func:`run_observations` read: the observations and what it left out.

    Attributes:
        observations: the usable :class:`Observation` s in step order.
        mixed: intervals dropped because the configuration changed in them.
        unknown: intervals dropped because their configuration could not be
            told (no batch size or worker count recorded for them).
        notes: assumptions made, one sentence each.
        other_sync: intervals dropped because a synchronisation strategy
            other than S-SGD (``allreduce_sgd``) ran in them (the
            ``adapt/sync_strategy`` series): the model prices one allreduce
            per update.

    Example:

    >>> from keras_adapt.plan import RunObservations
    >>> RunObservations([], 0, 0, []).configurations()
    []
    """

    observations: list
    mixed: int
    unknown: int
    notes: list
    other_sync: int = 0

    def configurations(self):
        """The distinct ``(b, N, k)`` observed, sorted."""
        return sorted({(o.micro_batch, o.workers, o.accumulation) for o in self.observations})


class _Steps:
    """A series' finite points by step: the value in effect at a step, the values in a range."""

    def __init__(self, points):
        kept = sorted((p[0], p[2]) for p in points if p[2] is not None)
        self.steps = [s for s, _ in kept]
        self.values = [v for _, v in kept]

    def at(self, step):
        """Value of the latest point at or before ``step`` (None if none)."""
        i = bisect.bisect_right(self.steps, step)
        return self.values[i - 1] if i else None

    def between(self, after, upto):
        """Values of the points with ``after < step <= upto``."""
        return self.values[bisect.bisect_right(self.steps, after):
                           bisect.bisect_right(self.steps, upto)]


def _batch_events(events):
    """The ``batch_size`` events that say what the configuration became, in step order."""
    return [e for e in events if e.get("kind") == "batch_size"
            and isinstance(e.get("after"), dict) and isinstance(e.get("before"), dict)
            and any(key in e["after"] for key in ("micro_batch_size", "accumulation",
                                                   "batch_size"))]


def _state_before(step, changes):
    """The batch state (a dict) that governs update ``step``: after the last change before it."""
    state = changes[0]["before"]
    for e in changes:
        if e["step"] < step:
            state = e["after"]
        else:
            break
    return state


def _positive_int(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    if value < 1 or float(value) != int(value):
        return None
    return int(value)


def run_observations(run):
    """The run's update times with their configurations (see the module doc).

    ``run`` is a :class:`keras_adapt.record.runs.RunData` (``load_runs``). A
    write at update ``w`` covers the updates after the previous write
    ``w0`` up to ``w``; a ``batch_size`` event at step ``s`` governs the
    updates after ``s``, so the interval is dropped as mixed when
    ``w0 < s < w`` or when the worker count differs between the two writes
    (without events, also when the global batch does); an interval in
    which a strategy other than S-SGD ran is dropped too (``other_sync``).

    Example:

    >>> from keras_adapt.plan import run_observations
    >>> from keras_adapt.record.runs import RunData
    >>> t = [(s, 0.0, 0.01) for s in (10, 20, 30)]
    >>> run = RunData("r", {"adapt/step_time/rank_0": t, "adapt/step_time/rank_1": t,
    ...                     "adapt/workers": [(s, 0.0, 2.0) for s in (10, 20, 30)],
    ...                     "adapt/batch_size": [(s, 0.0, 64.0) for s in (10, 20, 30)]}, [])
    >>> obs = run_observations(run)
    >>> obs.observations[0]
    Observation(step=10, micro_batch=32, workers=2, accumulation=1, update_seconds=0.01)
    >>> obs.notes[0][:41]
    'no batch_size event gives the micro-batch'
    """
    series = run.series
    prefix = metadata.STEP_TIME_TAG_PREFIX
    by_step = {}
    for tag, points in series.items():
        if tag.startswith(prefix):
            for s, _wall, v in points:
                if v is not None and v > 0:
                    by_step.setdefault(s, []).append(v)
    workers = _Steps(series.get(metadata.SCALAR_TAGS["workers"], []))
    batch = _Steps(series.get(metadata.SCALAR_TAGS["batch_size"], []))
    changes = _batch_events(run.events)
    notes = []
    if not changes:
        notes.append("no batch_size event gives the micro-batch and accumulation, so every "
                     "interval is taken as accumulation 1 and micro-batch = batch / workers")
    strategy = _Steps(series.get(metadata.SCALAR_TAGS["sync_strategy"], []))
    allreduce = float(metadata.SYNC_STRATEGIES.index("allreduce_sgd"))
    out, mixed, unknown, other_sync, previous = [], 0, 0, 0, None
    for w in sorted(by_step):
        n = _positive_int(workers.at(w))
        n0 = _positive_int(workers.at(previous)) if previous is not None else n
        global_batch = _positive_int(batch.at(w))
        w0 = previous if previous is not None else -1
        previous = w
        if n is None:
            unknown += 1
            continue
        if n0 != n:
            mixed += 1
            continue
        # A strategy point at step s governs the updates after s.
        if any(v != allreduce for v in [strategy.at(w0) or allreduce]
               + strategy.between(w0, w - 1)):
            other_sync += 1
            continue
        if changes:
            if any(w0 < e["step"] < w for e in changes):
                mixed += 1
                continue
            state = _state_before(w, changes)
            k = _positive_int(state.get("accumulation", 1))
            b = _positive_int(state.get("micro_batch_size"))
            if b is None and k is not None:
                total = _positive_int(state.get("batch_size")) or global_batch
                b = _positive_int(total / (n * k)) if total else None
        else:
            b0 = _positive_int(batch.at(w0)) if w0 >= 0 else global_batch
            if global_batch is None or b0 != global_batch:
                if global_batch is None:
                    unknown += 1
                else:
                    mixed += 1
                continue
            k, b = 1, _positive_int(global_batch / n)
        if b is None or k is None:
            unknown += 1
            continue
        times = by_step[w]
        out.append(Observation(w, b, n, k, k * sum(times) / len(times)))
    return RunObservations(out, mixed, unknown, notes, other_sync)


def noise_scale(run):
    """``(phi, source)``: the median of the last quarter of the run's ``adapt/gns`` points.

    The noise scale grows during training; the late value is the one that
    governs most of a longer run, and the median ignores single outliers.
    ``source`` says which points were used. None when the run has no
    finite positive noise scale.

    Example:

    >>> from keras_adapt.plan import noise_scale
    >>> from keras_adapt.record.runs import RunData
    >>> values = [50.0, 80.0, 90.0, 100.0, 110.0, 900.0, 105.0, 100.0]
    >>> pts = [(s, 0.0, v) for s, v in enumerate(values)]
    >>> noise_scale(RunData("r", {"adapt/gns": pts}, []))
    (102.5, 'median of the last 2 of 8 adapt/gns points, steps 6-7 of a run recorded to step 7')
    """
    tag = metadata.SCALAR_TAGS["gns"]
    last = max((p[0] for points in run.series.values() for p in points), default=None)
    points = [(s, v) for s, _w, v in run.series.get(tag, []) if v is not None and v > 0]
    if not points:
        return None
    tail = points[-max(1, int(round(len(points) * NOISE_SCALE_TAIL))):]
    values = sorted(v for _s, v in tail)
    mid = len(values) // 2
    phi = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0
    return float(phi), (f"median of the last {len(tail)} of {len(points)} {tag} points, "
                        f"steps {tail[0][0]}-{tail[-1][0]} of a run recorded to step {last}")


# -- the plan -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
    """One planned configuration; times in seconds, costs in the prices' currency.

    Values are None where they cannot be given (``status`` says why) or
    were not asked for (no price, no revocation rate). ``flags`` lists why
    the prediction is not sure; empty when it is.

    Example:

    >>> from keras_adapt.plan import Row
    >>> Row(2, 64, 32, 1, "ok").sure
    True
    """

    workers: int
    batch_size: int
    micro_batch: int
    accumulation: int
    status: str
    step_seconds: float = None
    step_std: float = None
    throughput: float = None
    efficiency: float = None
    samples: float = None
    updates: float = None
    seconds: float = None
    cost: float = None
    preemptible_seconds: float = None
    preemptible_cost: float = None
    checkpoint_interval: float = None
    revocations: float = None
    flags: tuple = ()

    @property
    def sure(self):
        """A prediction with no flag."""
        return self.status == "ok" and not self.flags


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :func:`make_plan` returns: its inputs, the model, one :class:`Row` per configuration.

    Example:

    >>> import dataclasses
    >>> from keras_adapt.plan import Plan
    >>> [f.name for f in dataclasses.fields(Plan)][:4]
    ['run', 'samples', 'base_batch', 'base_batch_source']
    """

    run: str
    samples: float
    base_batch: int
    base_batch_source: str
    noise_scale: float
    noise_scale_source: str
    max_micro_batch: int
    fit: object
    observations: object
    prices: dict
    preemption: dict
    rows: list

    def to_dict(self):
        """One JSON-able document (non-finite numbers become None)."""
        fit, obs = self.fit, self.observations
        configs = obs.configurations()
        return _clean({
            "run": self.run,
            "samples": self.samples,
            "base_batch": {"value": self.base_batch, "source": self.base_batch_source},
            "noise_scale": {"value": self.noise_scale, "source": self.noise_scale_source},
            "max_micro_batch": self.max_micro_batch,
            "model": {"kind": fit.model, "identified": list(fit.identified),
                      "params": fit.params, "stderr": fit.stderr, "mape": fit.mape,
                      "constant_mape": fit.constant_mape, "heldout": fit.heldout,
                      "reason": fit.reason},
            "observations": {"used": fit.num_observations, "intervals": len(obs.observations),
                             "mixed_dropped": obs.mixed, "unknown_dropped": obs.unknown,
                             "other_sync_dropped": obs.other_sync,
                             "configurations": [list(c) for c in configs], "notes": obs.notes},
            "prices": self.prices,
            "preemption": self.preemption,
            "rows": [dataclasses.asdict(r) | {"flags": list(r.flags), "sure": r.sure}
                     for r in self.rows],
        })

    def to_json(self):
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def _clean(value):
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _check_number(name, value, minimum=0.0, strict=False):
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    return check_float(name, value, minimum, low_open=strict, fix=f"pass a finite number {bound}",
                       error=PlanError)


def _check_ints(name, values):
    label = name
    if isinstance(values, (str, bytes)) or not values:
        raise invalid(label, values, "pass a non-empty list of ints >= 1, e.g. 1,2,4,8",
                      error=PlanError)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise PlanError(f"{label}: {v!r} is not valid; every value must be an int >= 1")
        out.append(int(v))
    return sorted(set(out))


def _pick_run(runs, logdir, run):
    """The run to plan from ``runs`` (:func:`select_runs`' answer, named ``run`` or not)."""
    timed = [r for r in runs
             if any(t.startswith(metadata.STEP_TIME_TAG_PREFIX) for t in r.series)]
    if run is not None:
        if runs[0] not in timed:
            raise PlanError(f"run {run!r} recorded no step times (adapt/step_time/rank_<r>); "
                            "train with AdaptTensorBoard(log_dir=..., step_times=True)")
        return runs[0]
    if not timed:
        raise PlanError(f"no run under {logdir!r} recorded step times (adapt/step_time/rank_<r>); "
                        "train with AdaptTensorBoard(log_dir=..., step_times=True)")
    if len(timed) > 1:
        raise PlanError(f"{len(timed)} runs under {logdir!r} recorded step times "
                        f"({', '.join(r.name for r in timed)}); choose one with --run RUN")
    return timed[0]


def _fit(run, obs, warmup, min_observations):
    model = ThroughputModel(warmup=warmup, min_observations=min_observations, statistic="median")
    for o in obs.observations:
        model.observe(o.micro_batch, o.update_seconds, workers=o.workers,
                      accumulation=o.accumulation)
    fit = model.fit()
    if fit.usable:
        return fit
    configs = obs.configurations()
    seen = ", ".join(f"b={b} N={n} k={k}" for b, n, k in configs) or "none"
    if fit.params is not None and fit.heldout >= 3:  # fitted, and lost to the constant model
        raise PlanError(
            f"run {run.name!r}: the throughput model cannot be used: {fit.reason}. Its "
            f"configurations ({seen}) do not show how step time depends on the batch and the "
            "workers; record a run over batch sizes further apart (e.g. a factor 8) or with "
            "longer intervals between writes (AdaptTensorBoard(update_freq=...))")
    raise PlanError(
        f"run {run.name!r}: too few observations to fit the throughput model: "
        f"{len(obs.observations)} usable write intervals in {len(configs)} configuration(s) "
        f"({seen}); {obs.mixed} mixed and {obs.unknown} unknown intervals dropped; each "
        f"configuration needs {warmup + min_observations} intervals ({warmup} warm-up). "
        f"{fit.reason}. Record a run that visits at least 4-6 batch sizes (and, to plan "
        "worker counts, 1 and 2 workers or more), e.g. with ScheduledBatchSizePolicy, "
        "for several AdaptTensorBoard(update_freq=...) intervals each")


def _flags(fit, b, n, k, prediction, configs):
    flags = []
    seen_n = sorted({c[1] for c in configs})
    seen_b = sorted({c[0] for c in configs})
    seen_k = sorted({c[2] for c in configs})
    if not prediction.determined:
        flags.append("not determined: the observed configurations cannot separate the costs "
                     f"this one depends on (identified: {', '.join(fit.identified)})")
    if not seen_n[0] <= n <= seen_n[-1]:
        flags.append(f"workers {n} outside the observed {seen_n[0]}-{seen_n[-1]}")
    if not seen_b[0] <= b <= seen_b[-1]:
        flags.append(f"micro-batch {b} outside the observed {seen_b[0]}-{seen_b[-1]}")
    if not seen_k[0] <= k <= seen_k[-1]:
        flags.append(f"accumulation {k} outside the observed {seen_k[0]}-{seen_k[-1]}")
    if prediction.relative_std > UNCERTAIN:
        flags.append(f"uncertain: standard error {prediction.relative_std:.0%} of the prediction")
    return tuple(flags)


def _options(samples, workers, batch_sizes, price_on_demand, price_preemptible,
             revocations_per_hour, checkpoint_seconds, restart_seconds, noise_scale_value,
             base_batch, max_micro_batch, warmup, min_observations):
    """Checks the options, before any log is read; returns them cleaned."""
    samples = _check_number("samples", samples, 0.0, strict=True)
    workers = _check_ints("workers", workers)
    if batch_sizes is not None:
        batch_sizes = _check_ints("batch_sizes", batch_sizes)
    prices = {}
    for name, value in (("on_demand", price_on_demand), ("preemptible", price_preemptible)):
        if value is not None:
            prices[name] = _check_number(f"price_{name}", value)
    preempt = {"revocations_per_hour": revocations_per_hour,
               "checkpoint_seconds": checkpoint_seconds, "restart_seconds": restart_seconds}
    given = {k: v for k, v in preempt.items() if v is not None}
    if given and len(given) < 3:
        missing = ", ".join(k for k in preempt if k not in given)
        raise PlanError(f"preemptible planning needs revocations_per_hour, checkpoint_seconds "
                        f"and restart_seconds; missing: {missing}")
    if "preemptible" in prices and not given:
        raise PlanError("price_preemptible needs revocations_per_hour, checkpoint_seconds and "
                        "restart_seconds (the revocation rate per worker-hour and the seconds "
                        "one checkpoint and one restart take)")
    preempt = {k: _check_number(k, v) for k, v in given.items()}
    if noise_scale_value is not None:
        noise_scale_value = _check_number("noise_scale", noise_scale_value, 0.0, strict=True)
    for name, value in (("base_batch", base_batch), ("max_micro_batch", max_micro_batch)):
        if value is not None:
            _check_ints(name, [value])
    return dict(samples=samples, workers=workers, batch_sizes=batch_sizes, prices=prices,
                preempt=preempt, noise_scale_value=noise_scale_value, base_batch=base_batch,
                max_micro_batch=max_micro_batch, warmup=warmup,
                min_observations=min_observations)


def make_plan(logdir, samples, run=None, workers=DEFAULT_WORKERS, batch_sizes=None,
              price_on_demand=None, price_preemptible=None, revocations_per_hour=None,
              checkpoint_seconds=None, restart_seconds=None, noise_scale_value=None,
              base_batch=None, max_micro_batch=None, warmup=1, min_observations=2):
    """Plans ``samples`` of training at each worker count and global batch; returns a :class:`Plan`.

    Args:
        logdir: the log directory (a run's or its parent's).
        samples: samples to train, at the base batch (> 0).
        run: the run's name under ``logdir`` (needed when several runs
            recorded step times).
        workers: worker counts to plan (ints >= 1).
        batch_sizes: global batches to plan (default: the run's global
            batches and the base batch x 1, 2, 4, 8, 16).
        price_on_demand, price_preemptible: price per worker-hour (>= 0).
        revocations_per_hour: revocations per worker-hour of preemptible
            machines (>= 0); with ``checkpoint_seconds`` and
            ``restart_seconds`` (>= 0) it gives the preemptible columns
            (:func:`preemptible_time`). All three or none.
        noise_scale_value: the noise scale to use instead of the run's.
        base_batch: the batch ``samples`` refers to (default: the run's
            first global batch).
        max_micro_batch: largest per-worker micro-batch (default: the
            largest the run used).
        warmup, min_observations: write intervals dropped at the start of
            each visit to a configuration, and needed after it
            (:class:`keras_adapt.formulas.throughput.ThroughputModel`).

    Raises :class:`PlanError` (a ``ValueError``) naming the bad value and
    the fix: bad options, no adapt data, too few observations, a fit that
    does not beat a constant.

    Example:

    >>> import tempfile
    >>> from keras_adapt.plan import make_plan
    >>> make_plan(tempfile.mkdtemp(), samples=1e6)
    Traceback (most recent call last):
    ...
    keras_adapt.plan.PlanError: no run under ... has adapt data; train with ...
    """
    options = _options(samples, workers, batch_sizes, price_on_demand, price_preemptible,
                       revocations_per_hour, checkpoint_seconds, restart_seconds,
                       noise_scale_value, base_batch, max_micro_batch, warmup, min_observations)
    if run is not None and not isinstance(run, str):
        raise invalid("run", run, "pass one run's name; a plan is made from one run",
                      error=PlanError)
    found = select_runs(logdir, None if run is None else [run], max_points=None, error=PlanError)
    run_data = _pick_run(found, logdir, run)
    return _plan(run_data, **options)


def check_options(samples, workers=DEFAULT_WORKERS, batch_sizes=None, price_on_demand=None,
                  price_preemptible=None, revocations_per_hour=None, checkpoint_seconds=None,
                  restart_seconds=None, noise_scale_value=None, base_batch=None,
                  max_micro_batch=None, warmup=1, min_observations=2):
    """Checks :func:`make_plan`'s options without reading any log.

    Raises the :class:`PlanError` that :func:`make_plan` would raise for
    them, so a command can tell a bad option from logs that cannot give a
    plan before it reads anything.

    Example:

    >>> from keras_adapt.plan import check_options
    >>> check_options(1e6, workers=[1, 2])
    >>> check_options(1e6, revocations_per_hour=0.1)
    Traceback (most recent call last):
    ...
    keras_adapt.plan.PlanError: preemptible planning needs revocations_per_hour, checkpoint_seconds and restart_seconds; missing: checkpoint_seconds, restart_seconds
    """
    _options(samples, workers, batch_sizes, price_on_demand, price_preemptible,
             revocations_per_hour, checkpoint_seconds, restart_seconds, noise_scale_value,
             base_batch, max_micro_batch, warmup, min_observations)


def plan_run(run_data, samples, workers=DEFAULT_WORKERS, batch_sizes=None,
             price_on_demand=None, price_preemptible=None, revocations_per_hour=None,
             checkpoint_seconds=None, restart_seconds=None, noise_scale_value=None,
             base_batch=None, max_micro_batch=None, warmup=1, min_observations=2):
    """:func:`make_plan` for a run already read (a :class:`keras_adapt.record.runs.RunData`).

    Example (a run at one worker whose update takes ``0.004 + 1e-4*b``
    seconds, written every 10 updates, the global batch doubling every 40
    updates, no ``batch_size`` events, so ``k = 1`` is assumed):

    >>> from keras_adapt import plan
    >>> from keras_adapt.record.runs import RunData
    >>> steps = range(10, 210, 10)
    >>> batch = {s: 16 * 2 ** ((s - 10) // 40) for s in steps}     # 16 ... 256
    >>> run = RunData("demo", {
    ...     "adapt/step_time/rank_0": [(s, 0.0, 0.004 + 1e-4 * batch[s]) for s in steps],
    ...     "adapt/workers": [(s, 0.0, 1.0) for s in steps],
    ...     "adapt/batch_size": [(s, 0.0, float(batch[s])) for s in steps],
    ...     "adapt/gns": [(s, 0.0, 200.0) for s in steps]}, [])
    >>> p = plan.plan_run(run, samples=1e6, workers=[1], batch_sizes=[64, 512],
    ...                   price_on_demand=2.0)
    >>> [(r.batch_size, r.micro_batch, r.accumulation, round(r.step_seconds, 4),
    ...   round(r.seconds, 1), round(r.cost, 3)) for r in p.rows]
    [(64, 64, 1, 0.0104, 198.6, 0.11), (512, 256, 2, 0.0592, 381.1, 0.212)]
    >>> [f.split(":")[0] for f in p.rows[1].flags]   # k = 1 only: its fixed cost is a guess
    ['not determined', 'accumulation 2 outside the observed 1-1']
    """
    options = _options(samples, workers, batch_sizes, price_on_demand, price_preemptible,
                       revocations_per_hour, checkpoint_seconds, restart_seconds,
                       noise_scale_value, base_batch, max_micro_batch, warmup, min_observations)
    return _plan(_pick_run([run_data], run_data.name, run_data.name), **options)


def _plan(run_data, samples, workers, batch_sizes, prices, preempt, noise_scale_value,
          base_batch, max_micro_batch, warmup, min_observations):
    obs = run_observations(run_data)
    fit = _fit(run_data, obs, warmup, min_observations)
    configs = obs.configurations()
    if noise_scale_value is not None:
        phi, source = noise_scale_value, "given"
    else:
        found = noise_scale(run_data)
        if found is None:
            raise PlanError(f"run {run_data.name!r} recorded no noise scale (adapt/gns); train "
                            "with GradientStatsMonitor and AdaptTensorBoard, or give the noise "
                            "scale (--noise-scale)")
        phi, source = found
    if base_batch is None:
        base_batch = obs.observations[0].global_batch
        base_note = "the run's first global batch"
    else:
        base_note = "given"
    if max_micro_batch is None:
        max_micro_batch = max(c[0] for c in configs)
    if batch_sizes is None:
        batch_sizes = sorted({o.global_batch for o in obs.observations}
                             | {base_batch * 2 ** i for i in range(5)})
    rows = []
    for n in workers:
        for big_b in batch_sizes:
            split = split_batch(big_b, n, max_micro_batch)
            if split is None:
                rows.append(Row(n, big_b, None, None, f"batch {big_b} is not a multiple of "
                                f"{n} workers"))
                continue
            b, k = split
            try:
                pred = fit.predict_step_time(b, workers=n, accumulation=k)
            except ValueError as exc:
                rows.append(Row(n, big_b, b, k, f"no prediction: {exc}"))
                continue
            t = pred.value
            needed = samples_needed(samples, big_b, base_batch, phi)
            updates = needed / big_b
            seconds = updates * t
            row = dict(step_seconds=t, step_std=pred.std, throughput=big_b / t,
                       efficiency=statistical_efficiency(big_b, base_batch, phi),
                       samples=needed, updates=updates, seconds=seconds,
                       flags=_flags(fit, b, n, k, pred, configs))
            if "on_demand" in prices:
                row["cost"] = prices["on_demand"] * n * seconds / 3600.0
            if preempt:
                est = preemptible_time(seconds, n, preempt["revocations_per_hour"],
                                       preempt["checkpoint_seconds"],
                                       preempt["restart_seconds"])
                row.update(preemptible_seconds=est.wall_seconds,
                           checkpoint_interval=est.interval_seconds,
                           revocations=est.revocations)
                if "preemptible" in prices:
                    row["preemptible_cost"] = prices["preemptible"] * n * est.wall_seconds / 3600.0
            rows.append(Row(n, big_b, b, k, "ok", **row))
    return Plan(run_data.name, samples, base_batch, base_note, phi, source, max_micro_batch, fit,
                obs, prices, preempt, rows)


# -- output -------------------------------------------------------------------

def _duration(seconds):
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return "never"
    if seconds < 90:
        return f"{seconds:.1f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"


def _num(value, fmt):
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return format(value, fmt)


def format_table(plan):
    """The plan as aligned text: a header on the inputs and the model, then one line per row.

    Flagged predictions end in ``*`` with their flags listed below the
    table.

    Example:

    >>> from keras_adapt import plan
    >>> from keras_adapt.record.runs import RunData
    >>> steps = range(10, 210, 10)
    >>> batch = {s: 16 * 2 ** ((s - 10) // 40) for s in steps}     # 16 ... 256
    >>> run = RunData("demo", {
    ...     "adapt/step_time/rank_0": [(s, 0.0, 0.004 + 1e-4 * batch[s]) for s in steps],
    ...     "adapt/workers": [(s, 0.0, 1.0) for s in steps],
    ...     "adapt/batch_size": [(s, 0.0, float(batch[s])) for s in steps],
    ...     "adapt/gns": [(s, 0.0, 200.0) for s in steps]}, [])
    >>> p = plan.plan_run(run, samples=1e6, workers=[1, 2], batch_sizes=[64, 512])
    >>> print(plan.format_table(p))
    run: demo
    samples: 1,000,000 at base batch 16 (the run's first global batch)
    noise scale: 200 (median of the last 5 of 20 adapt/gns points, steps 160-200 of ...)
    throughput model (base): held-out MAPE 0.00% over 5 configurations (constant model 86.47%), ...
    dropped: 4 intervals with a configuration change, 0 without a known configuration, ...
    note: no batch_size event gives the micro-batch and accumulation, ...
    <BLANKLINE>
    workers  batch    b x k     update (s)  samples/s  effic.    samples  time
          1     64   64 x 1   0.0104 ±0.0%      6,154   0.818  1,222,222  3.3m
          1    512  256 x 2  0.0592 ±0.0%*      8,649   0.303  3,296,296  6.4m
    <BLANKLINE>
    * not sure, or not planned:
      N=1 B=512: not determined: ...; accumulation 2 outside the observed 1-1
      N=2 B=64,512: no prediction: workers=2: no multi-worker configuration was observed, ...
    """
    fit, obs = plan.fit, plan.observations
    configs = obs.configurations()
    lines = [
        f"run: {plan.run}",
        f"samples: {plan.samples:,.0f} at base batch {plan.base_batch} "
        f"({plan.base_batch_source})",
        f"noise scale: {plan.noise_scale:.4g} ({plan.noise_scale_source})",
        f"throughput model ({fit.model}): held-out MAPE {fit.mape:.2f}% over {fit.heldout} "
        f"configurations (constant model {fit.constant_mape:.2f}%), from {fit.num_observations} "
        f"intervals in {len(configs)} configurations: workers "
        f"{sorted({c[1] for c in configs})}, micro-batch {sorted({c[0] for c in configs})}, "
        f"accumulation {sorted({c[2] for c in configs})}",
    ]
    if obs.mixed or obs.unknown or obs.other_sync:
        lines.append(f"dropped: {obs.mixed} intervals with a configuration change, "
                     f"{obs.unknown} without a known configuration, {obs.other_sync} under "
                     "a synchronisation strategy other than S-SGD")
    lines.extend(f"note: {n}" for n in obs.notes)
    if plan.preemption:
        p = plan.preemption
        lines.append(f"preemptible: {p['revocations_per_hour']:g} revocations per worker-hour, "
                     f"checkpoint {p['checkpoint_seconds']:g}s, restart {p['restart_seconds']:g}s "
                     "(checkpoint interval sqrt(2*C*M), Young 1974)")
    head = ["workers", "batch", "b x k", "update (s)", "samples/s", "effic.", "samples",
            "time"]
    if "on_demand" in plan.prices:
        head.append(f"cost @{plan.prices['on_demand']:g}")
    if plan.preemption:
        head += ["ckpt every", "preempt. time"]
        if "preemptible" in plan.prices:
            head.append(f"cost @{plan.prices['preemptible']:g}")
    table, footnotes = [head], {}
    for r in plan.rows:
        if r.status != "ok":
            footnotes.setdefault((r.workers, r.status), []).append(r.batch_size)
            continue
        mark = ""
        if r.flags:
            footnotes.setdefault((r.workers, "; ".join(r.flags)), []).append(r.batch_size)
            mark = "*"
        cells = [str(r.workers), str(r.batch_size), f"{r.micro_batch} x {r.accumulation}",
                 f"{r.step_seconds:.4g} ±{r.step_std / r.step_seconds:.1%}{mark}",
                 f"{r.throughput:,.0f}",
                 f"{r.efficiency:.3f}", f"{r.samples:,.0f}", _duration(r.seconds)]
        if "on_demand" in plan.prices:
            cells.append(_num(r.cost, ",.2f"))
        if plan.preemption:
            cells += [_duration(r.checkpoint_interval), _duration(r.preemptible_seconds)]
            if "preemptible" in plan.prices:
                cells.append(_num(r.preemptible_cost, ",.2f"))
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines.append("")
    for row in table:
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip())
    if footnotes:
        lines.append("")
        lines.append("* not sure, or not planned:")
        lines.extend(f"  N={n} B={','.join(map(str, batches))}: {text}"
                     for (n, text), batches in footnotes.items())
    return "\n".join(lines)
