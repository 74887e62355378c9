"""AdaptTensorBoard: the ``adapt/*`` series, per-worker step times and events for TensorBoard."""

import os
import time
import warnings

import numpy as np
import tensorflow as tf

import keras
from keras_adapt import _hvd
from keras_adapt.checks import check_bool, check_int, check_interval, invalid
from keras_adapt.extras import require
from keras_adapt.optimizer import effective_learning_rate, is_distributed
from keras_adapt.record import events, metadata, summary

#: Logs keys copied from the logs when present (docs/design.md#logs-keys).
SERIES_KEYS = tuple(metadata.SCALAR_TAGS)
_STATS_KEYS = ("gns", "grad_sqr", "grad_var", "grad_snr")


def _check_args(log_dir, update_freq, batch_size, step_times):
    if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
        raise invalid(
            "log_dir", log_dir, "use a directory path such as "
            "'runs/exp1' (one run of TensorBoard's --logdir)"
        )
    check_interval("update_freq", update_freq, "writes")
    check_int("batch_size", batch_size, none=True,
              fix="use None or a positive int, the per-worker batch size passed to fit()")
    check_bool("step_times", step_times)


def _to_float(value):
    """A python float from a float, numpy value, tensor or variable; None if not a number."""
    try:
        if hasattr(value, "numpy"):
            value = value.numpy()
        value = float(np.asarray(value).reshape(()))
    except (TypeError, ValueError):
        return None
    return value if summary.is_writable_number(value) else None


class AdaptTensorBoard(keras.callbacks.Callback):
    """Writes what adaptive training measured and decided to TensorBoard's "Adapt" tab.

    Every ``update_freq`` steps (and at the end of each epoch) it writes, on
    rank 0 only, one point of each ``adapt/*`` series (docs/design.md#tensorboard):

    - ``gns``, ``grad_sqr``, ``grad_var``, ``grad_snr``: read from the
      optimizer's ``gradient_statistics`` (the values
      ``GradientStatsMonitor`` copies into the logs, read fresh, so the
      order of the callbacks does not matter), else from the logs.
    - ``lr``: the effective learning rate, read from the optimizer at the
      write (``keras_adapt.optimizer.effective_learning_rate``: the base
      rate times keras-adapt's factor; a schedule is evaluated at the
      current step), never from the logs, where tf.keras 2's own
      ``LearningRateScheduler`` and ``ReduceLROnPlateau`` put the base rate.
    - ``batch_size``, ``workers``, ``throughput``: taken from the
      logs when a callback put them there (the policies); otherwise
      derived: ``workers`` from ``keras_adapt.size()``, the global ``batch_size``
      (samples per update) from the statistics or ``batch_size`` x workers
      x accumulation steps, and ``throughput`` (samples/s) from its own
      timing of the steps (a step is a micro-step under accumulation).
    - ``sync_strategy``: with a keras-adapt optimizer, the index in
      ``keras_adapt.record.metadata.SYNC_STRATEGIES`` of the synchronisation
      strategy in use (``optimizer.adapt_state.sync.strategy``, a host
      copy), whether a policy or the user switched it: at
      every write, and also at the step where it changed (seen at a batch
      start, so a switch made before a batch by a callback placed before
      this one is dated exactly; one placed after it, one update later) and
      at the first step of each ``fit``. A step line of these points tells
      which strategy ran each update. Not written for other optimizers
      (unless the logs hold it).
    - ``compression``: once the optimizer's compression switch is enabled
      (``CommunicationPolicy``, ``GradientCompression``), the index in
      ``keras_adapt.record.metadata.COMPRESSIONS`` of what the gradients
      travel as (``none``, ``fp16``), at every write.
    - ``staleness``: under ``PairAveraging``, the mean staleness (updates)
      of the peer models rank 0 averaged with since the last write
      (``optimizer.adapt_state.sync.exchange.record`` has every worker's
      own). While it runs, the step times of the other workers are not
      gathered (that collective would make every worker wait for the
      slowest); rank 0's own is written.
    - ``adapt/step_time/rank_<i>``: each worker's mean step time over the
      interval. Every worker times its own steps (from one batch start to
      the next, the first step of a ``fit`` excluded because it includes
      tracing); one allgather of one number per worker every
      ``update_freq`` steps, at the same step on every rank, brings them
      to rank 0. When a ``WorkerTimingMonitor`` times the workers, its
      values are written instead (``step_time``, ``comm_fraction``,
      ``throughput`` and the per-worker ``step_time``, ``compute_time`` and
      ``wait_time`` in the logs) and this callback gathers nothing itself.
    - ``adapt/system/host_<h>/<metric>``: every ``system/...`` value in the
      logs (``SystemMonitor``'s host metrics; put that callback first).
    - every adaptation event (``keras_adapt.record.events.emit``) while training
      runs, under ``adapt/events``: all events of one step in one datum,
      written again with all of them when more arrive for that step (e.g.
      from a callback that runs after this one), so TensorBoard keeps
      every one (``keras_adapt.record.summary.EventWriter``). At the
      start of each ``fit`` the records already in
      ``<log_dir>/adapt_events.jsonl`` (a resumed run, or events emitted
      before this callback started) are written again as well, so the tab
      shows the same events as that file.

    Nothing runs per step but a clock read (and a Python attribute read of
    the strategy): no host sync and no collective between writes, and the
    batch hook is async-safe. Place it anywhere in the callback list (after
    the callbacks that switch strategies, to date their switches exactly);
    open TensorBoard on the parent directory of
    ``log_dir`` (``tensorboard --logdir runs``).

    Args:
        log_dir: the run's directory (e.g. ``runs/exp1``); same on all ranks.
        update_freq: steps between writes (positive int). Each write of
            step times costs one small collective on every worker.
        batch_size: per-worker batch size, used for ``batch_size`` and
            ``throughput`` only when neither the logs nor the gradient
            statistics give the global batch. None: those series are then
            not written (with one warning).
        step_times: gather and write the per-worker step times.

    Example:

    >>> import os, tempfile, numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import AdaptTensorBoard, GradientStatsMonitor
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    >>> log_dir = os.path.join(tempfile.mkdtemp(), "run1")
    >>> x, y = np.random.rand(256, 4), np.random.rand(256, 1)
    >>> _ = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[
    ...     GradientStatsMonitor(interval=4), AdaptTensorBoard(log_dir, update_freq=4)])
    >>> any(f.startswith("events.out.tfevents") for f in os.listdir(log_dir))
    True
    """

    def __init__(self, log_dir, update_freq=10, batch_size=None, step_times=True):
        super().__init__()
        _check_args(log_dir, update_freq, batch_size, step_times)
        require("tensorboard", "tensorboard", "AdaptTensorBoard")
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self.batch_size = batch_size
        self.step_times = step_times
        self._gather_step_times = step_times
        # The batch-end hook only keeps a reference to the logs: safe to run
        # off the training thread (Keras 3) and on tensor logs (tf.keras 2),
        # so this callback never forces a per-step host sync.
        self.async_safe = True
        self._supports_tf_logs = True
        self._writer = None
        self._events = summary.EventWriter()
        self._warned_batch = False
        self._reset()

    def _reset(self):
        self._begun = 0
        self._last_flushed = -1
        self._last_t = None
        self._timed_first = False
        self._durations = []
        self._batch_logs = None
        self._sync = None  # rank 0, keras-adapt optimizer: its SyncState
        self._sync_seen = None  # the strategy index at the last batch start
        self._sync_changes = []  # (optimizer step, index) seen, not yet written
        self._sync_written = None  # the last index written to the series
        self._staleness_seen = 0  # PairAveraging's averagings already written

    # -- events ---------------------------------------------------------------

    def _on_event(self, event):
        self._events.add(event)

    # -- Keras hooks ----------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._reset()
        self._rank, self._size = _hvd.rank(), _hvd.size()
        # A WorkerTimingMonitor in this fit (it says so in set_model, before
        # any on_train_begin, on every rank alike) gathers the step times.
        timing = getattr(getattr(self.model.optimizer, "adapt_state", None), "timing", None)
        self._gather_step_times = self.step_times and not (timing is not None and timing.monitored)
        if self._rank == 0:
            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = tf.summary.create_file_writer(self.log_dir)
            events.add_listener(self._on_event)
            # What the run's event log already holds (an earlier fit, a
            # resumed job, a callback that ran before this one) is written
            # again at the next write, with the new events of those steps.
            for event in events.read_events(self.log_dir):
                self._events.add(event)
            if is_distributed(self.model.optimizer):
                self._sync = self.model.optimizer.adapt_state.sync

    def on_epoch_begin(self, epoch, logs=None):
        # Epoch boundaries (validation, other callbacks) are not step time.
        self._last_t = None

    def on_train_batch_begin(self, batch, logs=None):
        # Runs on the training thread, in step order, on every rank: the
        # one place where timing and the collective's step are deterministic.
        now = time.perf_counter()
        if self._last_t is not None:
            if self._timed_first:
                self._durations.append(now - self._last_t)
            else:
                self._timed_first = True  # the first step of fit() includes tracing
        self._last_t = now
        completed = self._begun
        if self._sync is not None:
            # A python attribute read per step; the update count is read
            # (one small device read) only when the strategy changed.
            index = self._sync.strategy.index
            if index != self._sync_seen:
                self._sync_seen = index
                self._sync_changes.append(
                    (int(self.model.optimizer.iterations.numpy()), index))
        if completed > 0 and completed % self.update_freq == 0:
            self._flush(completed, self._batch_logs)
        self._begun += 1

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            self._batch_logs = logs

    def on_epoch_end(self, epoch, logs=None):
        self._flush(self._begun, logs if logs is not None else self._batch_logs)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            events.remove_listener(self._on_event)
            with self._writer.as_default():
                self._events.write()
            self._writer.flush()
            self._writer.close()
            self._writer = None

    # -- writing ----------------------------------------------------------------

    def _asynchronous(self):
        # The strategy in use (the same on every rank at the same step) meets
        # nobody: gathering the step times would make it wait for the slowest.
        optimizer = self.model.optimizer
        return is_distributed(optimizer) and optimizer.adapt_state.sync.asynchronous

    def _flush(self, completed, logs):
        if completed == self._last_flushed:
            return
        self._last_flushed = completed
        durations, self._durations = self._durations, []
        mean_step = float(np.mean(durations)) if durations else float("nan")
        gathered = None
        if self._gather_step_times and self._asynchronous():
            gathered = np.asarray([mean_step])  # this worker's own (rank 0's where written)
        elif self._gather_step_times:
            local = tf.constant([mean_step], dtype=tf.float64)
            gathered = np.asarray(_hvd.allgather(local, name="keras_adapt_step_times"))
        if self._writer is None:
            return
        step = int(self.model.optimizer.iterations.numpy())
        values = self._series(logs, durations)
        with self._writer.as_default():
            self._write_strategy_changes(step)
            for key, value in values.items():
                summary.scalar(key, value, step=step)
            if "sync_strategy" in values:
                self._sync_written = int(values["sync_strategy"])
            if gathered is not None:
                for rank, seconds in enumerate(gathered.reshape(-1).tolist()):
                    if summary.is_writable_number(seconds):
                        summary.step_time(rank, seconds, step=step)
            self._events.write()
        self._writer.flush()

    def _write_strategy_changes(self, step):
        """Writes each strategy change seen since the last write at the
        update it took effect (the optimizer step read when it was seen, so
        accumulation and any number of micro-steps per update date it
        right); this write's own value covers a change at ``step`` itself.
        """
        changes, self._sync_changes = self._sync_changes, []
        for at, index in changes:
            if at >= step or index == self._sync_written:
                continue
            summary.scalar("sync_strategy", float(index), step=at)
            self._sync_written = index

    def _series(self, logs, durations):
        """The values of the shared series at this write (finite floats only)."""
        values = {}
        optimizer = self.model.optimizer
        stats = getattr(optimizer, "gradient_statistics", None)
        result = stats.result() if stats is not None else None
        fresh = result is not None and result["updates"] > 0
        if fresh:
            # The same numbers GradientStatsMonitor copies into the logs, read
            # now: at an epoch end the logs may still hold the monitor's
            # previous read when it runs after this callback.
            for key in _STATS_KEYS:
                if summary.is_writable_number(result[key]):
                    values[key] = float(result[key])
        lr = _to_float(effective_learning_rate(optimizer))
        if lr is not None:
            values["lr"] = lr
        for key in SERIES_KEYS:
            if key in values or key == "lr" or logs is None or key not in logs:
                continue
            if fresh and key in _STATS_KEYS:
                continue  # a non-finite estimate is not replaced by a stale one
            v = _to_float(logs[key])
            if v is not None:
                values[key] = v
        for key, value in (logs or {}).items():
            if (metadata.parse_system_tag(key) is not None  # SystemMonitor's host metrics
                    or metadata.parse_worker_time_tag(key) is not None):  # WorkerTimingMonitor's
                v = _to_float(value)
                if v is not None:
                    values[metadata.TAG_PREFIX + key] = v
        if is_distributed(optimizer):
            # The strategy in use now: the host copy that sync.set() keeps,
            # so a hand switch without an event is recorded too.
            values["sync_strategy"] = float(optimizer.adapt_state.sync.strategy.index)
            exchange = optimizer.adapt_state.sync.exchange
            if exchange is not None:
                recent = exchange.record.staleness[self._staleness_seen:]
                self._staleness_seen += len(recent)
                if recent:  # this worker's averagings since the last write
                    values["staleness"] = float(np.mean(recent))
            switch = optimizer.adapt_state.compression
            if switch.enabled:
                # what the next update sends (index in metadata.COMPRESSIONS)
                values["compression"] = float(switch.index)
        values.setdefault("workers", float(self._size))
        # Micro-steps per update: the steps timed here are micro-steps.
        acc = optimizer.adapt_state.accumulation if is_distributed(optimizer) else None
        k = 1 if acc is None else acc.steps_value
        if "batch_size" not in values:
            if result is not None and result["batch_size"] > 0:
                values["batch_size"] = float(result["batch_size"])
            elif self.batch_size is not None:
                values["batch_size"] = float(self.batch_size * self._size * k)
            elif not self._warned_batch:
                self._warned_batch = True
                warnings.warn(
                    "keras-adapt: AdaptTensorBoard does not know the global batch size, "
                    "so adapt/batch_size and adapt/throughput are not written; use "
                    "keras_adapt.DistributedOptimizer with GradientStatsMonitor, or "
                    "pass AdaptTensorBoard(..., batch_size=<per-worker batch size>)",
                    RuntimeWarning, stacklevel=3,
                )
        if "throughput" not in values and "batch_size" in values and durations:
            elapsed = float(np.sum(durations))
            if elapsed > 0:
                # batch_size is per update, a duration per micro-step
                values["throughput"] = values["batch_size"] / k * len(durations) / elapsed
        return values
