"""PreemptionCheckpoint: stop every worker at the same step on SIGTERM or a cloud notice, checkpoint, resume there."""

import os
import sys
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.checkpointing import CheckpointFiles, epoch_ender
from keras_adapt.checks import check_float, check_int
from keras_adapt.coordination import (EXIT_CODE, SIGNALS, CheckInterval, SignalAgreement,
                                      as_notices)
from keras_adapt.data import AdaptiveBatchDataset
from keras_adapt.monitors import step_pauses
from keras_adapt.optimizer import UpdateBoundary, require_distributed
from keras_adapt.record import events

# The signals that request a checkpoint and a stop: SIGNALS (SIGTERM, SIGINT);
# the exit code after the checkpoint: EXIT_CODE (75, EX_TEMPFAIL).


def _policies(callbacks):
    """The callbacks that carry state to resume (``get_state`` /
    ``restore_at_train_begin``)."""
    return [cb for cb in callbacks if callable(getattr(cb, "get_state", None))
            and callable(getattr(cb, "restore_at_train_begin", None))]


class PreemptionCheckpoint(keras.callbacks.Callback):
    """Checkpoints on SIGTERM / SIGINT with every worker stopped at the same
    step, and resumes a rerun of the same command at that very step.

    A signal on any rank only sets a flag. Every ``check_interval`` steps the
    workers OR the flags together (one tiny allreduce of one number per
    worker, from the host, at the end of the step), so all of them see the
    request at the same step. By default (``"auto"``) the interval follows
    the measured cost: each agreement also averages the workers' median step
    time and agreement time (the shortest of their last 8 agreements: a
    longer one mostly waited for a slower worker), and the next interval is the smallest that keeps
    the agreements under 1% of the step time, capped so that the steps
    between two agreements take at most a quarter of ``deadline_s``
    (:func:`~keras_adapt.coordination.signal_agreement.auto_check_interval`,
    :class:`~keras_adapt.coordination.signal_agreement.CheckInterval`; the same on every rank), and at most twice
    the previous interval; at the next optimizer-update boundary (never in the
    middle of an accumulation) rank 0 writes a checkpoint with
    ``tf.train.CheckpointManager``, every rank waits until it is on disk,
    and the process exits with ``exit_code``. The checkpoint holds the model,
    the optimizer (slots, ``iterations``), keras-adapt's state
    (``optimizer.adapt_state.checkpoint_variables()``, the synchronisation
    strategy), the epoch and the step within it, the data position of the
    :class:`~keras_adapt.data.AdaptiveBatchDataset` and the ``get_state()``
    of every policy among the callbacks. It is written atomically: the data
    and index files under temporary names, then the ``checkpoint`` file that
    lists it.

    Resume with :meth:`fit` (it replaces ``model.fit``): it restores the
    newest readable checkpoint on every rank (all ranks must see
    ``directory``), falls back to the previous one with a warning naming a
    damaged one, and runs the rest of the interrupted epoch, then the next
    epochs, skipping the micro-batches already trained on. A batch-size
    policy among the callbacks may end the epochs on its own count
    (``epoch_end="samples"`` or ``"progress"``): its count is in the
    checkpoint, so the resumed run ends every epoch at the update where the
    uninterrupted run ends it. Events:
    ``preemption`` when the workers stop, ``checkpoint`` per periodic save,
    ``resume`` when a run restarts from a checkpoint.

    On preemptible or spot cloud VMs, ``notices`` also watches the
    provider's metadata service (:class:`~keras_adapt.coordination.RevocationNotices`,
    a thread from the beginning of ``fit`` to its end): a revocation notice
    is a stop request exactly like a signal, named by its source
    (``"gce"``, ``"aws"``, ``"azure"``), and must be answered before the
    deadline it gives: the ``deadline_s`` timer runs for the shorter of
    ``deadline_s`` and the notice's time left, and the ``"auto"`` interval
    is capped by the shorter of ``deadline_s`` and the provider's
    documented lead (30 s; AWS 120 s). The ``preemption`` event then holds
    the deadlines and the time left at the notice and when the checkpoint
    was on disk (docs/cloud_vms.md).

    Under Horovod Elastic pass it among the callbacks of
    :func:`keras_adapt.elastic.fit` instead: the elastic
    :class:`~keras_adapt.elastic.LeaveOnSignalCallback` then agrees on the
    signals, lets a signalled worker leave when others remain, and writes
    this checkpoint (then exits with ``exit_code``) only when every worker
    was signalled; its ``save_freq`` saves are written by rank 0 right after
    the elastic commits at those steps; the same command resumes from the
    newest, with any worker count (docs/elastic.md). A training loop other
    than :meth:`fit` drives it so: :meth:`attach` (what it saves),
    :meth:`save`, :meth:`stop` and :meth:`record_resume`; the files are
    :attr:`files` (a :class:`~keras_adapt.checkpointing.CheckpointFiles`).

    Args:
        directory: where the checkpoints go (made if missing).
        max_to_keep: checkpoints kept (>= 2 keeps a fallback).
        deadline_s: seconds from the signal within which the checkpoint must
            be on disk; if a step or the write is still running then, the
            process exits with ``exit_code`` anyway, leaving the previous
            checkpoint as the newest (set it below your platform's grace
            period, e.g. 30 s on Kubernetes and most clouds). None: no limit.
        exit_code: the process's exit code after the preemption checkpoint
            (default 75, ``EX_TEMPFAIL``); None: ``fit`` returns instead
            (:attr:`preempted` is then True).
        save_freq: ``"epoch"`` (a checkpoint at each epoch end), an int (every
            that many optimizer updates) or None (on preemption only).
        check_interval: steps between the agreements on the flag: an int
            (1: every step, the stop comes at the step in flight), or
            ``"auto"`` (see above). Steps run after a signal are not lost:
            they are in the checkpoint.
        log_dir: directory of ``adapt_events.jsonl``; None keeps the events in
            memory (:attr:`events`) and listeners (under elastic: the state's).
        notices: None (no watcher: the default), a provider (``"gce"``,
            ``"aws"``, ``"azure"``: its metadata service, or the one
            ``KERAS_ADAPT_METADATA_ENDPOINT`` names) or a
            :class:`~keras_adapt.coordination.RevocationNotices` (endpoint,
            poll interval, timeouts of your choice). Under elastic the
            :class:`~keras_adapt.elastic.LeaveOnSignalCallback` given this
            checkpoint watches them instead.

    Example:

    >>> import tempfile, numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import PreemptionCheckpoint
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp())
    >>> x = np.ones((8, 2), "float32"); y = np.ones((8, 1), "float32")
    >>> history = ckpt.fit(model, x, y, batch_size=4, epochs=2, verbose=0)
    >>> ckpt.position(), len(ckpt.checkpoints())
    ((2, 0), 2)
    """

    def __init__(self, directory, max_to_keep=2, deadline_s=25.0, exit_code=EXIT_CODE,
                 save_freq="epoch", check_interval="auto", log_dir=None, notices=None):
        super().__init__()
        #: The checkpoint files (:class:`~keras_adapt.checkpointing.CheckpointFiles`).
        self.files = CheckpointFiles(directory, max_to_keep)
        self.directory = self.files.directory
        self.max_to_keep = self.files.max_to_keep
        self.deadline_s = check_float("deadline_s", deadline_s, finite=False, none=True)
        self.exit_code = check_int("exit_code", exit_code, 0, 255, none=True,
                                   fix=f"use an int in [0, 255] (default {EXIT_CODE}) or None to "
                                       "return from fit")
        if save_freq != "epoch" and save_freq is not None:
            save_freq = check_int("save_freq", save_freq)
        self.save_freq = save_freq
        if check_interval != "auto":
            check_interval = check_int("check_interval", check_interval)
        self.check_interval = check_interval
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"log_dir must be a path or None, got {log_dir!r}")
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        #: The revocation-notice watcher (a RevocationNotices), or None.
        self.notices = as_notices(notices)
        #: True once the workers stopped for a signal.
        self.preempted = False
        #: Every event this callback recorded, in order.
        self.events = []
        #: Seconds from the first signal (on any rank) to the checkpoint on
        #: disk, on every rank (None before a preemption).
        self.signal_to_disk_s = None
        #: Seconds from the checkpoint on disk to the earliest deadline of
        #: the notices agreed on, on every rank (None: no notice).
        self.time_left_s = None
        self._signals = SignalAgreement("keras_adapt_preempt", SIGNALS, self.start_deadline)
        self._saved = threading.Event()
        self._dataset = None
        self._policy_list = []
        self._pending = None  # (path, meta) of the checkpoint to restore at set_model
        self._epoch = 0
        self._offset = 0  # steps of the current epoch done before this fit began
        self._step_in_epoch = 0
        self._steps_per_epoch = 0
        self._steps_since_check = 0
        self._ender = None  # the callback that ends the epochs on its count, if any
        self._stopping = False  # agreed to stop, at an update boundary
        self._save_at_epoch_end = False  # a periodic save due at the epoch's last step
        # A notice may give less time than deadline_s: the agreements must come sooner.
        spacing = self.deadline_s if self.notices is None else min(
            self.notices.lead_s, self.deadline_s or self.notices.lead_s)
        self._schedule = CheckInterval(check_interval, spacing)
        self._boundary = None  # which micro-step completes an update
        self._timer = None
        #: Seconds the running deadline timer was set to (None: none started).
        self.deadline_timer_s = None

    # -- reading the directory (the files') ---------------------------------
    def checkpoints(self):
        """The checkpoint paths listed in ``directory``, oldest first
        (:meth:`CheckpointFiles.checkpoints <keras_adapt.checkpointing.CheckpointFiles.checkpoints>`).

        Example:

        >>> import tempfile
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> PreemptionCheckpoint(tempfile.mkdtemp()).checkpoints()
        []
        """
        return self.files.checkpoints()

    read_meta = staticmethod(CheckpointFiles.read_meta)

    def latest(self):
        """``(path, meta)`` of the newest readable checkpoint, or None: a
        damaged newer one gives a warning naming it, and the one before is
        used (:meth:`CheckpointFiles.latest <keras_adapt.checkpointing.CheckpointFiles.latest>`)."""
        return self.files.latest()

    def position(self):
        """``(epoch, step in epoch)`` where a rerun resumes (``(0, 0)`` without a checkpoint)."""
        return self.files.position()

    # -- fit -------------------------------------------------------------
    def fit(self, model, x=None, y=None, batch_size=32, epochs=1, callbacks=(), shuffle=True,
            seed=0, **fit_kwargs):
        """``model.fit`` that resumes where the last run stopped.

        ``x`` is an :class:`~keras_adapt.data.AdaptiveBatchDataset` (``y``
        and ``batch_size`` unused) or in-memory arrays, which are streamed
        through one (each worker takes its share, order seeded by ``seed``,
        identical on every rank): the inputs whose position can be saved and
        restored. This callback is added after ``callbacks``; the policies
        among them have their state saved and restored. With a batch-size
        policy whose ``epoch_end`` is set among them, that policy ends the
        epochs (one ``model.fit`` over the endless stream) and the resumed
        epoch ends on its restored count. Returns a ``History`` of the
        epochs this call ran.
        """
        if "steps_per_epoch" in fit_kwargs or "initial_epoch" in fit_kwargs:
            raise ValueError("PreemptionCheckpoint.fit sets steps_per_epoch and initial_epoch "
                             "itself (from the data and the checkpoint); leave them out")
        if isinstance(x, AdaptiveBatchDataset):
            data = x
        elif isinstance(x, (tf.data.Dataset, keras.utils.Sequence)) or callable(
                getattr(x, "__next__", None)):
            raise TypeError(
                f"PreemptionCheckpoint.fit cannot save the position of a "
                f"{type(x).__name__}; pass in-memory arrays (x, y) or a "
                "keras_adapt.data.AdaptiveBatchDataset, whose position resumes mid-epoch")
        else:
            data = AdaptiveBatchDataset(x, y, micro_batch_size=batch_size, shuffle=shuffle,
                                        seed=seed)
        require_distributed(model, type(self).__name__)
        self.preempted, self.signal_to_disk_s = False, None
        self._dataset = data
        callbacks = list(callbacks)
        self._ender = epoch_ender(callbacks)
        self._policy_list = _policies(callbacks)
        found = self.latest()
        epoch, step = (0, 0) if found is None else (found[1]["epoch"], found[1]["step_in_epoch"])
        if found is not None:
            self._pending = found
        spe = self._steps_per_epoch = data.steps_per_epoch
        if self._ender is None and step >= spe:
            raise ValueError(f"checkpoint {found[0]} is at step {step} of epoch {epoch}, but an "
                             f"epoch of this data has {spe} steps; resume with the same data "
                             "and batch size")
        try:
            histories = []
            run = callbacks + [self]
            # The stream is shuffled already (Keras would warn that it ignores shuffle).
            fit_kwargs["shuffle"] = False
            if self._ender is not None:  # the policy ends each epoch on its count
                self._offset = step
                if epoch < epochs:
                    histories.append(model.fit(data.dataset, initial_epoch=epoch, epochs=epochs,
                                               callbacks=run, **fit_kwargs))
                return histories[-1] if histories else keras.callbacks.History()
            if step > 0 and epoch < epochs:  # the rest of the interrupted epoch
                self._offset = step
                histories.append(model.fit(data.dataset, steps_per_epoch=spe - step,
                                           initial_epoch=epoch, epochs=epoch + 1, callbacks=run,
                                           **fit_kwargs))
                epoch += 1
            if epoch < epochs and not self.preempted:
                histories.append(model.fit(data.dataset, steps_per_epoch=spe, initial_epoch=epoch,
                                           epochs=epochs, callbacks=run, **fit_kwargs))
            history = histories[-1] if histories else keras.callbacks.History()
            if len(histories) == 2:
                first, history.epoch = histories[0], histories[0].epoch + history.epoch
                history.history = {k: first.history.get(k, []) + v
                                   for k, v in history.history.items()}
            return history
        finally:  # the notice watcher ends with fit, however fit ends
            if self.notices is not None:
                self.notices.stop()

    # -- state -------------------------------------------------------------
    def _restore(self, path, meta):
        self.files.load(path, meta)
        if self._dataset is not None and meta.get("data") is not None:
            self._dataset.set_state(meta["data"])
        states = self.files.policy_states(path, meta, self._policy_list)
        for policy, saved in zip(self._policy_list, states):
            policy.restore_at_train_begin(saved)
        # Every rank must have restored the same checkpoint.
        number = float(path.rsplit("-", 1)[-1])
        agreed = _hvd.host_allreduce_mean([number, number ** 2], "keras_adapt_resume_check")
        if not np.isclose(agreed[1], agreed[0] ** 2):
            raise ValueError(f"rank {_hvd.rank()} restored {path} but the workers restored "
                             f"different checkpoints: put {self.directory} on a file system "
                             "every worker sees, unchanged between their reads")
        self.record_resume(path, meta)

    def record_resume(self, path, meta, before=None, after=None):
        """Records the ``resume`` event of a run restarted from checkpoint
        ``path`` (its :meth:`read_meta` is ``meta``), with what else changed
        (``before``, ``after``: dicts, e.g. the worker count); returns it.
        The run is in the checkpoint's epoch from then on.

        Example:

        >>> import tempfile, keras, keras_adapt
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp())
        >>> ckpt.attach(model)
        >>> path = ckpt.save(1, 2)
        >>> event = ckpt.record_resume(*ckpt.latest(), before={"workers": 2}, after={"workers": 1})
        >>> event["kind"], event["epoch"], event["before"], event["after"]["workers"]
        ('resume', 1, {'workers': 2}, 1)
        """
        self._epoch = meta["epoch"]
        return self._record("resume", f"resumed from {os.path.basename(path)}", before or {},
                            {**(after or {}), "epoch": meta["epoch"],
                             "step_in_epoch": meta["step_in_epoch"], "step": meta["step"],
                             "checkpoint": path})

    def _step(self):
        return int(self.model.optimizer.iterations.numpy())

    def _save(self, epoch, step_in_epoch):
        """Rank 0 writes a checkpoint at (epoch, step_in_epoch); returns its path (None elsewhere)."""
        # Every rank: the step timers leave out this update and the next,
        # at whose collective the others wait for rank 0's write.
        step_pauses.skip_update(2)
        return self.files.write(epoch, step_in_epoch, self._dataset, self._policy_list)

    def _record(self, kind, reason, before, after):
        event = events.emit(kind, step=self._step(), epoch=self._epoch,
                            policy=type(self).__name__, reason=reason, before=before,
                            after=after, log_dir=self.log_dir)
        self.events.append(event)
        return event

    # -- signals -----------------------------------------------------------
    def start_deadline(self, signal_name, deadline=None):
        """Starts the timer of a stop request: ``deadline_s``, or the time
        left to ``deadline`` (a notice's, ``time.time()``) when shorter.
        Called by the signal handler (or the notice watcher) after it
        recorded the request of ``signal_name`` (``"SIGTERM"``, ``"gce"``).

        Example:

        >>> import tempfile, time
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp(), deadline_s=25.0)
        >>> ckpt.start_deadline("aws", time.time() + 120.0)
        >>> ckpt.deadline_timer_s
        25.0
        >>> ckpt.cancel_deadline()
        """
        seconds = self.deadline_s
        if deadline is not None:
            left = max(0.0, deadline - time.time())
            seconds = left if seconds is None else min(seconds, left)
        if seconds is not None and self._timer is None:
            self.deadline_timer_s = seconds
            self._timer = threading.Timer(seconds, self._deadline_passed, [signal_name])
            self._timer.daemon = True
            self._timer.start()

    def cancel_deadline(self):
        """Stops the timer of :meth:`start_deadline` (no exit then)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    def _deadline_passed(self, signal_name):
        if self._saved.is_set():
            return
        within = (f"deadline_s={self.deadline_s} s" if self.deadline_timer_s == self.deadline_s
                  else f"{self.deadline_timer_s:.1f} s (the notice's time left, below "
                       f"deadline_s={self.deadline_s})")
        sys.stderr.write(
            f"[keras-adapt] rank {_hvd.rank()}: no checkpoint within {within} of {signal_name}; "
            f"exiting with {self.exit_code}, the newest checkpoint in {self.directory} is the "
            "previous one\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE if self.exit_code is None else self.exit_code)

    def _install_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionCheckpoint needs fit to run on the main thread "
                               "(signal handlers can only be set there)")
        self._signals.install()

    # -- Keras hooks ---------------------------------------------------------
    def set_model(self, model):
        super().set_model(model)
        self.files.attach(model)
        if self._pending is not None:
            (path, meta), self._pending = self._pending, None
            self._epoch = meta["epoch"]
            self._restore(path, meta)

    def on_train_begin(self, logs=None):
        if self._dataset is None:
            raise ValueError(
                "PreemptionCheckpoint resumes through its own fit: call "
                "ckpt.fit(model, x, y, ...) instead of model.fit(..., callbacks=[ckpt])")
        self._signals.clear()
        self._saved.clear()
        self._stopping = False
        self._save_at_epoch_end = False
        self._steps_since_check = 0
        self._schedule.start()
        self._boundary = UpdateBoundary(self.model.optimizer)
        self._install_handlers()
        if self.notices is not None:
            self.notices.start(self._signals.request)

    def on_train_end(self, logs=None):
        self._signals.remove()
        if self.notices is not None:
            self.notices.stop()
        if not self.preempted:
            self.cancel_deadline()  # training ended before the workers agreed to stop
        self._timer = None
        if self.preempted and self.exit_code is not None:
            raise SystemExit(self.exit_code)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        # The first epoch of a resumed fit starts after the steps done before.
        self._step_in_epoch, self._offset = self._offset, 0

    def on_train_batch_end(self, batch, logs=None):
        self._schedule.step_ended()
        self._step_in_epoch += 1
        boundary = self._boundary.step_ended()
        self._steps_since_check += 1
        if boundary and self.periodic_due(self._step()):
            if self._last_step_of_epoch():  # as "epoch E+1, step 0", after the epoch's end
                self._save_at_epoch_end = True
            else:
                self._periodic(self._epoch, self._step_in_epoch)
        if self._steps_since_check < self._schedule.interval and not self.preempted:
            return
        self._steps_since_check = 0
        if not self.preempted:
            self.preempted = self._agree()
        if self.preempted and boundary:
            self._stopping = True
            self.model.stop_training = True
            if not self._last_step_of_epoch():
                self._stop(self._epoch, self._step_in_epoch, self._signals.signalled,
                           self._schedule.interval, self._signals.deadlines)
            # else: on_epoch_end saves after the epoch-end callbacks

    def _last_step_of_epoch(self):
        """Whether the step that just ended is its epoch's last: the policy
        that ends the epochs says so, else the epoch's steps are done."""
        if self._ender is not None:
            return self._ender.ending_epoch
        return self._step_in_epoch >= self._steps_per_epoch

    def _agree(self):
        """The one collective per check (:meth:`CheckInterval.agree`): which
        ranks were signalled, and when, and the next interval."""
        return bool(self._schedule.agree(self._signals))

    def on_epoch_end(self, epoch, logs=None):
        periodic, self._save_at_epoch_end = self._save_at_epoch_end, False
        # Stopping: agreed at an update boundary, or another callback ends
        # the fit at this epoch's end.
        if self._stopping or (self.preempted and self.model.stop_training):
            if not self._saved.is_set():
                self._stop(epoch + 1, 0, self._signals.signalled, self._schedule.interval,
                           self._signals.deadlines)
            # A policy that ended this epoch cleared the flag in its on_epoch_end.
            self.model.stop_training = True
            return
        if self.preempted:  # agreed, but the update in progress has not ended
            return
        if self.save_freq == "epoch" or periodic:
            self._periodic(epoch + 1, 0)

    def periodic_due(self, updates):
        """Whether a periodic checkpoint falls after optimizer update number
        ``updates`` (an int ``save_freq`` divides it).

        Example:

        >>> import tempfile
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=25)
        >>> [ckpt.periodic_due(n) for n in (24, 25, 50)]
        [False, True, True]
        """
        return isinstance(self.save_freq, int) and updates % self.save_freq == 0

    def _periodic(self, epoch, step_in_epoch):
        path = self._save(epoch, step_in_epoch)
        self._record("checkpoint", "periodic checkpoint", {},
                     {"epoch": epoch, "step_in_epoch": step_in_epoch,
                      "checkpoint": path or ""})
        return path

    def _stop(self, epoch, step_in_epoch, signalled, check_interval, deadlines=None):
        """Writes the preemption checkpoint and the ``preemption`` event (rank
        0), then waits until every rank is there: no rank exits (which makes
        horovodrun end the job) before both are on disk. ``signalled``:
        ``{rank: (signal name, time)}`` as agreed; ``deadlines``: ``{rank:
        deadline}`` of their notices."""
        path = self._save(epoch, step_in_epoch)
        ranks = sorted(signalled)
        first = min(t for _, t in signalled.values())
        on_disk = time.time()
        since = on_disk - first
        deadlines = [deadlines.get(r) for r in ranks] if deadlines else [None] * len(ranks)
        known = [d for d in deadlines if d is not None]
        self._record("preemption", f"{', '.join(f'{signalled[r][0]} on rank {r}' for r in ranks)}"
                     f": all ranks stopped at epoch {epoch} step {step_in_epoch}, checkpoint "
                     "written", {},
                     {"epoch": epoch, "step_in_epoch": step_in_epoch, "checkpoint": path or "",
                      "signalled_ranks": ranks, "signals": [signalled[r][0] for r in ranks],
                      "signal_to_disk_s": since, "check_interval": check_interval,
                      "exit_code": self.exit_code, "deadlines": deadlines,
                      "time_left_at_notice_s": [None if d is None else d - signalled[r][1]
                                                for r, d in zip(ranks, deadlines)],
                      "time_left_at_disk_s": min(known) - on_disk if known else None})
        _hvd.host_allreduce_mean([0.0], "keras_adapt_preempt_saved")
        self._saved.set()
        self.signal_to_disk_s = time.time() - first
        self.time_left_s = min(known) - time.time() if known else None

    # -- driven by another training loop -------------------------------------
    def attach(self, model, dataset=None, policies=(), log_dir=None):
        """What the checkpoints hold when a training loop other than
        :meth:`fit` drives this callback (the elastic one:
        :func:`keras_adapt.elastic.fit`): ``model`` (and its optimizer), the
        position of ``dataset`` (an :class:`~keras_adapt.data.AdaptiveBatchDataset`
        or None) and the states of ``policies``; the events go to
        ``log_dir`` when this callback was given none.

        Example: see :meth:`save`.
        """
        self.set_model(model)
        self._dataset, self._policy_list = dataset, list(policies)
        if self.log_dir is None:
            self.log_dir = log_dir

    def save(self, epoch, step_in_epoch):
        """A periodic checkpoint at ``(epoch, step_in_epoch)``, now: rank 0
        writes it (what :meth:`attach` gave) and records a ``checkpoint``
        event; no collective. Returns the path written (None on other ranks).

        Example:

        >>> import tempfile, keras, keras_adapt
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=10)
        >>> ckpt.attach(model)
        >>> path = ckpt.save(1, 4)
        >>> ckpt.position(), ckpt.events[-1]["kind"]
        ((1, 4), 'checkpoint')
        """
        self._epoch = int(epoch)
        return self._periodic(int(epoch), int(step_in_epoch))

    def stop(self, epoch, step_in_epoch, signalled, check_interval, deadlines=None):
        """Every rank, once all have agreed to stop at ``(epoch,
        step_in_epoch)``: rank 0 writes the checkpoint (what :meth:`attach`
        gave) and the ``preemption`` event, and every rank waits until both
        are on disk (one host allreduce). ``signalled``: ``{rank: (signal
        name, time)}`` as agreed; ``check_interval``: the steps between the
        last two agreements; ``deadlines``: ``{rank: deadline}`` of the
        notices among them (:attr:`SignalAgreement.deadlines
        <keras_adapt.coordination.SignalAgreement>`). The caller then ends
        the process with :attr:`exit_code`.

        Example:

        >>> import tempfile, time, keras, keras_adapt
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=None)
        >>> ckpt.attach(model)
        >>> ckpt.stop(1, 4, {0: ("SIGTERM", time.time())}, check_interval=1)
        >>> ckpt.preempted, ckpt.position(), ckpt.events[-1]["after"]["signals"]
        (True, (1, 4), ['SIGTERM'])
        """
        self._epoch = int(epoch)
        self.preempted = True
        self._stop(int(epoch), int(step_in_epoch), signalled, check_interval, deadlines)
