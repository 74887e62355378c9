"""WorkerTimingMonitor: every worker's compute time and wait in the collectives."""

import math
import time

import numpy as np
import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.callbacks._common import CachedLogs
from keras_adapt.checks import check_int, check_interval
from keras_adapt.record import metadata

_COLUMNS = 5  # rank, steps, step time, wait time, samples per step


def timing_of(model):
    """The :class:`~keras_adapt.monitors.worker_timing.CollectiveTiming` of
    ``model``'s optimizer; a ``ValueError`` naming the fix when the model
    was not compiled with a keras-adapt optimizer.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.callbacks.worker_timing_monitor import timing_of
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> timing_of(model) is model.optimizer.adapt_state.timing
    True
    """
    optimizer = getattr(model, "optimizer", None)
    timing = getattr(getattr(optimizer, "adapt_state", None), "timing", None)
    if timing is None:
        raise ValueError(
            f"WorkerTimingMonitor times the collectives of keras-adapt's optimizer, but "
            f"the model's optimizer is {type(optimizer).__name__}; compile the model with "
            "keras_adapt.DistributedOptimizer(<your optimizer>)"
        )
    return timing


class WorkerTimingMonitor(CachedLogs):
    """Measures every worker's compute time and its wait in the collectives.

    Each worker times its steps on the host (from one batch start to the
    next; the first step of a ``fit``, which includes tracing, and the last
    step of each epoch are left out) and, in-graph, the seconds its
    optimizer updates spend in their collectives
    (:class:`~keras_adapt.monitors.worker_timing.CollectiveTiming`: two
    ``tf.timestamp()`` ops around each gradient allreduce, or model
    averaging under a local synchronisation strategy). Per step, a worker's
    ``wait_time`` is that time and its ``compute_time`` the rest of its step
    time. A worker that waits long is fast: the others are still computing.
    The straggler is the worker that computes most and waits least.

    Every ``interval`` steps one small allgather (5 numbers per worker)
    brings every worker's mean times over the interval to every worker, so
    all workers log and return the same values:

    - ``step_time``: mean step time over the workers (s);
    - ``comm_fraction``: mean over the workers of wait_time / step_time, in
      [0, 1]: the share of a step spent in collectives, waiting for slower
      workers included;
    - ``throughput``: global samples/s, the sum of the workers' batch sizes
      divided by ``step_time`` (only when the batch size is known: from the
      gradient statistics -- ``GradientStatsMonitor`` records it -- or from
      ``batch_size``);
    - ``step_time/rank_<r>``, ``compute_time/rank_<r>``,
      ``wait_time/rank_<r>`` per worker (``keras_adapt.record.metadata.WORKER_TIMES``).

    ``AdaptTensorBoard`` writes them as ``adapt/...`` series (the Adapt
    tab's Worker timing charts; ``keras-adapt report``) and then uses these
    per-worker step times instead of gathering its own. Between measurements
    the last values are repeated in the logs. :meth:`result` gives them to
    policies (``StragglerPolicy``, ``SyncStrategyPolicy``'s ``timing``);
    :attr:`measurements` counts them and :meth:`new_measurement` tells a
    policy whether one came since it last looked.

    The timestamps are added to the update when this callback is set on the
    model, before the train function is traced (a train function traced
    earlier is dropped and traced again); without the callback the update
    holds none. The variables are read once per interval: no per-step host
    sync. With one worker there is no collective: wait_time is 0.

    Args:
        interval: steps between measurements (positive int); the same on
            every worker (the allgather must match).
        batch_size: per-worker batch size, for ``throughput`` when the
            optimizer's gradient statistics have not recorded it. None: use
            the statistics only.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import WorkerTimingMonitor
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    >>> monitor = WorkerTimingMonitor(interval=3, batch_size=8)
    >>> monitor.result()["steps"], monitor.measurements
    (0, 0)
    >>> h = model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, verbose=0, callbacks=[monitor])
    >>> r = monitor.result()
    >>> r["comm_fraction"], r["wait_time"], r["compute_time"][0] == r["step_time"] > 0
    (0.0, [0.0], True)
    >>> round(r["throughput"] * r["step_time"], 6), "compute_time/rank_0" in h.history
    (8.0, True)
    """

    def __init__(self, interval=10, batch_size=None):
        super().__init__()
        self.interval = check_interval("interval", interval, "measurements")
        self.batch_size = check_int(
            "batch_size", batch_size, none=True,
            fix="use None or a positive int, the per-worker batch size passed to fit()")
        # The collective and the host reads run in on_train_batch_begin, on
        # the training thread in step order on every worker; the batch-end
        # hook only copies cached floats, so Keras need not sync per step.
        self.async_safe = True
        self._supports_tf_logs = True
        self._timing = None
        self._result = None
        #: Number of measurements made so far (all fits), the same on every worker.
        self.measurements = 0
        self._values = {}
        self._reset()

    def _reset(self):
        self._begun = 0
        self._start = None
        self._wait0 = 0.0
        self._steps = 0

    def set_model(self, model):
        super().set_model(model)
        self._timing = timing_of(model)
        self._timing.monitored = True
        if self._timing.enable():
            # A train function traced before has no timestamps: trace again.
            model.train_function = None

    def on_train_begin(self, logs=None):
        self._reset()
        self._rank = _hvd.rank()
        self._values = {}

    def on_train_end(self, logs=None):
        self._timing.monitored = False

    def on_epoch_begin(self, epoch, logs=None):
        # Epoch boundaries (validation, other callbacks) are not step time.
        self._start = None

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self._start is not None:
            self._steps += 1
        if self._begun > 0 and self._begun % self.interval == 0:
            self._gather(now)
        if self._start is None and self._begun > 0:  # the first step of fit() includes tracing
            self._start, self._wait0, self._steps = now, self._timing.read()[0], 0
        self._begun += 1

    def _samples_per_step(self):
        stats = getattr(self.model.optimizer, "gradient_statistics", None)
        if stats is not None:
            recorded = int(stats.batch_size.numpy())
            if recorded > 0:
                return float(recorded)
        return float(self.batch_size) if self.batch_size is not None else math.nan

    def _gather(self, now):
        row = [float(self._rank)] + [math.nan] * (_COLUMNS - 1)
        if self._start is not None and self._steps > 0:
            wait = self._timing.read()[0]
            row = [float(self._rank), float(self._steps), (now - self._start) / self._steps,
                   (wait - self._wait0) / self._steps, self._samples_per_step()]
            self._wait0, self._steps = wait, 0
        gathered = np.asarray(_hvd.allgather(tf.constant([row], dtype=tf.float64),
                                             name="keras_adapt_worker_timing"))
        if self._start is not None:
            # The next interval starts after this allgather: its wait for
            # the other workers is the monitor's cost, not a step's.
            self._start = time.perf_counter()
        rows = sorted(gathered.reshape(-1, _COLUMNS).tolist())
        if not all(math.isfinite(r[1]) for r in rows):
            return  # no step timed yet (the same on every worker)
        step = [r[2] for r in rows]
        wait = [r[3] for r in rows]
        step_time = float(np.mean(step))
        samples = float(np.sum([r[4] for r in rows]))
        self.measurements += 1
        self._result = {
            "step_time": step_time,
            "comm_fraction": float(np.mean([w / s for w, s in zip(wait, step)])),
            "throughput": samples / step_time if math.isfinite(samples) else math.nan,
            "compute_time": [s - w for s, w in zip(step, wait)],
            "wait_time": wait,
            "steps": int(rows[0][1]),
        }
        values = {"step_time": step_time, "comm_fraction": self._result["comm_fraction"]}
        if math.isfinite(self._result["throughput"]):
            values["throughput"] = self._result["throughput"]
        for r, (s, c, w) in enumerate(zip(step, self._result["compute_time"], wait)):
            values[metadata.worker_time_key("step_time", r)] = s
            values[metadata.worker_time_key("compute_time", r)] = c
            values[metadata.worker_time_key("wait_time", r)] = w
        self._values = values

    def new_measurement(self, since):
        """``(count, result)`` when a measurement was made after the first
        ``since`` ones, else None.

        ``count`` is :attr:`measurements` now (pass it as ``since`` next
        time) and ``result`` is :meth:`result`. A policy that must act on each
        measurement once (``StragglerPolicy``, ``ThroughputScalingPolicy``)
        keeps the count; a check that finds no new measurement gets None.
        Every worker gets the same answer at the same step.

        Example:

        >>> from keras_adapt.callbacks import WorkerTimingMonitor
        >>> monitor = WorkerTimingMonitor(interval=5)
        >>> monitor.new_measurement(since=monitor.measurements) is None
        True
        """
        if self.measurements == since:
            return None
        return self.measurements, self.result()

    def result(self):
        """The last measurement, the same on every worker.

        A dict: ``step_time`` (s, mean over workers), ``comm_fraction``,
        ``throughput`` (global samples/s; NaN when the batch size is
        unknown), ``compute_time`` and ``wait_time`` (s per step, lists by
        rank) and ``steps`` (the steps each worker timed in the interval).
        Before the first measurement: NaN values, empty lists and
        ``steps`` 0.
        """
        if self._result is None:
            return {"step_time": math.nan, "comm_fraction": math.nan, "throughput": math.nan,
                    "compute_time": [], "wait_time": [], "steps": 0}
        return {k: list(v) if isinstance(v, list) else v for k, v in self._result.items()}
