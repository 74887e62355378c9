"""PreemptionCheckpoint: stop every worker at the same step on SIGTERM, checkpoint, resume there."""

import json
import os
import sys
import threading
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

from keras_adapt import _hvd, events
from keras_adapt.callbacks._common import epoch_ender
from keras_adapt.callbacks.signal_agreement import SIGNALS, CheckInterval, SignalAgreement
from keras_adapt.checks import check_float, check_int
from keras_adapt.data import AdaptiveBatchDataset
from keras_adapt.optimizer import UpdateBoundary, build_slots, require_distributed

#: Default exit code after a preemption checkpoint: ``EX_TEMPFAIL`` of
#: ``sysexits.h``, "a temporary failure, the user is invited to retry".
EXIT_CODE = 75
# The signals that request a checkpoint and a stop: SIGNALS (SIGTERM, SIGINT).


def _policies(callbacks):
    """The callbacks that carry state to resume (``get_state`` / ``set_state``)."""
    return [cb for cb in callbacks if callable(getattr(cb, "get_state", None))
            and callable(getattr(cb, "set_state", None))]


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
    (:func:`~keras_adapt.callbacks.signal_agreement.auto_check_interval`,
    :class:`~keras_adapt.callbacks.signal_agreement.CheckInterval`; the same on every rank), and at most twice
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

    Under Horovod Elastic pass it among the callbacks of
    :func:`keras_adapt.elastic.fit` instead: the elastic
    :class:`~keras_adapt.elastic.LeaveOnSignalCallback` then agrees on the
    signals, lets a signalled worker leave when others remain, and writes
    this checkpoint (then exits with ``exit_code``) only when every worker
    was signalled; its ``save_freq`` saves are written by rank 0 right after
    the elastic commits at those steps (:meth:`save_elastic`); the same
    command resumes from the newest, with any worker count
    (:meth:`resume_elastic`; docs/elastic.md).

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
                 save_freq="epoch", check_interval="auto", log_dir=None):
        super().__init__()
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path, got {directory!r}")
        self.directory = os.fspath(directory)
        self.max_to_keep = check_int("max_to_keep", max_to_keep)
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
        #: True once the workers stopped for a signal.
        self.preempted = False
        #: Every event this callback recorded, in order.
        self.events = []
        #: Seconds from the first signal (on any rank) to the checkpoint on
        #: disk, on every rank (None before a preemption).
        self.signal_to_disk_s = None
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
        self._schedule = CheckInterval(check_interval, self.deadline_s)
        self._boundary = None  # which micro-step completes an update
        self._timer = None
        self._manager = None
        self._checkpoint = None
        self._meta = None
        self._epoch_var = None
        self._step_var = None
        self._elastic_entered = False  # this process has entered elastic.fit

    # -- reading the directory ---------------------------------------------
    def checkpoints(self):
        """The checkpoint paths listed in ``directory``, oldest first.

        Example:

        >>> import tempfile
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> PreemptionCheckpoint(tempfile.mkdtemp()).checkpoints()
        []
        """
        state = tf.train.get_checkpoint_state(self.directory)
        if state is None:
            return []
        return [p if os.path.isabs(p) else os.path.join(self.directory, p)
                for p in state.all_model_checkpoint_paths]

    @staticmethod
    def read_meta(path):
        """The position and host state stored in checkpoint ``path`` (a dict),
        after reading every tensor of it: a damaged checkpoint raises here.

        Example:

        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> PreemptionCheckpoint.read_meta("/nonexistent/ckpt-1")
        Traceback (most recent call last):
        ...
        ValueError: checkpoint /nonexistent/ckpt-1 cannot be read: NotFoundError
        """
        try:
            reader = tf.train.load_checkpoint(path)
            meta = None
            for key in reader.get_variable_to_shape_map():
                value = reader.get_tensor(key)  # checks each tensor's checksum
                if key.startswith("meta/"):
                    meta = value
        except Exception as exc:  # noqa: BLE001 - any damage means "not usable"
            raise ValueError(f"checkpoint {path} cannot be read: {type(exc).__name__}") from exc
        if meta is None:
            raise ValueError(f"checkpoint {path} holds no keras-adapt position (not written "
                             "by PreemptionCheckpoint)")
        return json.loads(meta.decode() if isinstance(meta, bytes) else meta)

    def latest(self):
        """``(path, meta)`` of the newest readable checkpoint, or None.

        A damaged newer one gives a warning naming it, and the one before is
        used. Every rank reads ``directory`` itself.
        """
        for path in reversed(self.checkpoints()):
            try:
                return path, self.read_meta(path)
            except ValueError as exc:
                warnings.warn(f"keras-adapt: {exc}; using the checkpoint before it",
                              RuntimeWarning, stacklevel=2)
        return None

    def position(self):
        """``(epoch, step in epoch)`` where a rerun resumes (``(0, 0)`` without a checkpoint)."""
        found = self.latest()
        if found is None:
            return 0, 0
        return found[1]["epoch"], found[1]["step_in_epoch"]

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
            history.history = {k: first.history.get(k, []) + v for k, v in history.history.items()}
        return history

    # -- state -------------------------------------------------------------
    def _make_checkpoint(self):
        optimizer = self.model.optimizer
        with tf.init_scope():
            self._epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._meta = tf.Variable("", dtype=tf.string, trainable=False)
        adapt = tf.train.Checkpoint(**optimizer.adapt_state.checkpoint_variables())
        self._checkpoint = tf.train.Checkpoint(model=self.model, optimizer=optimizer, adapt=adapt,
                                               epoch=self._epoch_var, step=self._step_var,
                                               meta=self._meta)
        self._manager = None  # made by the rank that writes, when it first does

    def _restore(self, path, meta):
        self._load(path, meta)
        if self._dataset is not None and meta.get("data") is not None:
            self._dataset.set_state(meta["data"])
        states = self._policy_states(path, meta)
        for policy, saved in zip(self._policy_list, states):
            policy.set_state(saved)
        # Every rank must have restored the same checkpoint.
        number = float(path.rsplit("-", 1)[-1])
        agreed = _hvd.host_allreduce_mean([number, number ** 2], "keras_adapt_resume_check")
        if not np.isclose(agreed[1], agreed[0] ** 2):
            raise ValueError(f"rank {_hvd.rank()} restored {path} but the workers restored "
                             f"different checkpoints: put {self.directory} on a file system "
                             "every worker sees, unchanged between their reads")
        self._record_resume(path, meta)

    def _load(self, path, meta):
        """Restores the model, the optimizer and keras-adapt's variables and
        the synchronisation strategy's choice from ``path`` (no collective)."""
        model = self.model
        if not getattr(model, "built", True) or not model.trainable_variables:
            raise ValueError(
                f"cannot resume from {path}: the model has no weights yet (built lazily). "
                "Give it a keras.Input or call model.build(input_shape) before fit")
        optimizer = model.optimizer
        # The choice first (its variables are then overwritten by the saved ones).
        optimizer.adapt_state.sync.set_state(meta["sync"])
        build_slots(optimizer, model.trainable_variables)
        try:
            self._checkpoint.restore(path).assert_existing_objects_matched()
        except AssertionError as exc:
            message = str(exc).strip()
            first = message.splitlines()[0] if message else type(exc).__name__
            raise ValueError(
                f"checkpoint {path} does not hold all of this run's state ({first}): resume "
                "with the model, the DistributedOptimizer settings (gradient_stats, "
                "backward_passes_per_step, sync_strategy) and the keras-adapt version that "
                f"wrote it, or start afresh with another directory than {self.directory}"
            ) from exc
        acc = optimizer.adapt_state.accumulation
        if acc is not None:
            acc.steps_value = int(acc.steps.numpy())
        # As after an elastic sync: the next update enters the strategy again
        # from the restored model (BMUF's and EASGD's own models restart there).
        optimizer.adapt_state.sync.rejoin()

    def _policy_states(self, path, meta):
        states = meta.get("policies", [])
        if len(states) != len(self._policy_list):
            raise ValueError(
                f"checkpoint {path} holds the state of {len(states)} policies "
                f"({', '.join(s['class'] for s in states) or 'none'}) but "
                f"{len(self._policy_list)} are given; resume with the same callbacks")
        return [saved["state"] for saved in states]

    def _record_resume(self, path, meta, rescaled=None):
        before, after = {}, {}
        if rescaled is not None:  # under elastic: the workers, and what the rule changed
            before = {"workers": meta["workers"], **rescaled["before"]}
            after = {"workers": _hvd.size(), **rescaled["after"]}
        self._record("resume", f"resumed from {os.path.basename(path)}", before,
                     {**after, "epoch": meta["epoch"], "step_in_epoch": meta["step_in_epoch"],
                      "step": meta["step"], "checkpoint": path})

    def _host_state(self, epoch, step_in_epoch):
        sync = self.model.optimizer.adapt_state.sync
        return {
            "epoch": int(epoch), "step_in_epoch": int(step_in_epoch),
            "step": self._step(), "workers": _hvd.size(), "wall_time": time.time(),
            "sync": sync.get_state(),
            "data": None if self._dataset is None else self._dataset.get_state(),
            "policies": [{"class": type(p).__name__, "state": p.get_state()}
                         for p in self._policy_list],
        }

    def _step(self):
        return int(self.model.optimizer.iterations.numpy())

    def _save(self, epoch, step_in_epoch):
        """Rank 0 writes a checkpoint at (epoch, step_in_epoch); returns its path (None elsewhere)."""
        if _hvd.rank() != 0:
            return None
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory,
                                                       max_to_keep=self.max_to_keep)
        self._epoch_var.assign(epoch)
        self._step_var.assign(step_in_epoch)
        self._meta.assign(json.dumps(self._host_state(epoch, step_in_epoch)))
        return self._manager.save(checkpoint_number=self._step())

    def _record(self, kind, reason, before, after):
        event = events.emit(kind, step=self._step(), epoch=self._epoch,
                            policy=type(self).__name__, reason=reason, before=before,
                            after=after, log_dir=self.log_dir)
        self.events.append(event)

    # -- signals -----------------------------------------------------------
    def start_deadline(self, signal_name):
        """Starts the ``deadline_s`` timer of a signal (``"SIGTERM"``): called
        by the signal handler, after it recorded the signal."""
        if self.deadline_s is not None and self._timer is None:
            self._timer = threading.Timer(self.deadline_s, self._deadline_passed, [signal_name])
            self._timer.daemon = True
            self._timer.start()

    def _deadline_passed(self, signal_name):
        if self._saved.is_set():
            return
        sys.stderr.write(
            f"[keras-adapt] rank {_hvd.rank()}: no checkpoint within deadline_s="
            f"{self.deadline_s} s of {signal_name}; exiting with {self.exit_code}, the "
            f"newest checkpoint in {self.directory} is the previous one\n")
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
        if self._checkpoint is None or self._checkpoint.model is not model:
            self._make_checkpoint()
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

    def on_train_end(self, logs=None):
        self._signals.remove()
        if self._timer is not None and not self.preempted:
            self._timer.cancel()  # training ended before the workers agreed to stop
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
                           self._schedule.interval)
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
                self._stop(epoch + 1, 0, self._signals.signalled, self._schedule.interval)
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

    def _stop(self, epoch, step_in_epoch, signalled, check_interval):
        """Writes the preemption checkpoint and the ``preemption`` event (rank
        0), then waits until every rank is there: no rank exits (which makes
        horovodrun end the job) before both are on disk. ``signalled``:
        ``{rank: (signal name, time)}`` as agreed."""
        path = self._save(epoch, step_in_epoch)
        ranks = sorted(signalled)
        first = min(t for _, t in signalled.values())
        since = time.time() - first
        self._record("preemption", f"{', '.join(f'{signalled[r][0]} on rank {r}' for r in ranks)}"
                     f": all ranks stopped at epoch {epoch} step {step_in_epoch}, checkpoint "
                     "written", {},
                     {"epoch": epoch, "step_in_epoch": step_in_epoch, "checkpoint": path or "",
                      "signalled_ranks": ranks, "signals": [signalled[r][0] for r in ranks],
                      "signal_to_disk_s": since, "check_interval": check_interval,
                      "exit_code": self.exit_code})
        _hvd.host_allreduce_mean([0.0], "keras_adapt_preempt_saved")
        self._saved.set()
        self.signal_to_disk_s = time.time() - first

    # -- under keras_adapt.elastic -------------------------------------------
    def elastic_problem(self):
        """Why this checkpoint cannot serve an elastic job, with the fix (a
        string), or None. Under :func:`keras_adapt.elastic.fit` it is written
        only when every worker is signalled, and the processes must end.

        Example:

        >>> import tempfile
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=None).elastic_problem() is None
        True
        >>> print(PreemptionCheckpoint(tempfile.mkdtemp(), exit_code=None, save_freq=None)
        ...       .elastic_problem())
        exit_code=None (fit returns) cannot work under elastic: ...; use an exit code (default 75)
        """
        if self.exit_code is None:
            return ("exit_code=None (fit returns) cannot work under elastic: the workers of a "
                    f"stopped elastic job must end; use an exit code (default {EXIT_CODE})")
        return None

    def _bind(self, state):
        self.set_model(state.model)
        self._dataset, self._policy_list = state.dataset, list(state.policies)
        if self.log_dir is None:
            self.log_dir = state.log_dir

    def resume_elastic(self, state):
        """At every entry of :func:`keras_adapt.elastic.fit`, on every rank
        (one host allreduce): at the first entry of a fresh job (no process
        of it has trained yet), rank 0 restores the newest readable
        checkpoint (falling back past a damaged one, with a warning) into the
        model, the optimizer and ``state`` (a
        :class:`~keras_adapt.elastic.KerasState`: position, data position,
        policies), records a ``resume`` event, and ``state.sync()`` gives it
        to every rank. A checkpoint written by another worker count gets the
        state's :class:`~keras_adapt.elastic.ResizeRule` as at a change of
        workers (:meth:`~keras_adapt.elastic.KerasState.rescale_from`: the
        per-worker batch, the learning rate); the ``resume`` event records the
        workers before and after and what was rescaled. Only rank 0 reads
        ``directory``. A worker joining a
        running job restores nothing: the job's state reaches it by the
        elastic sync. Returns the checkpoint's path, or None.

        Example (one process: a stop written, then a fresh job resumes):

        >>> import tempfile, time, keras, keras_adapt
        >>> from keras_adapt import elastic
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> state, directory = elastic.KerasState(model, epoch=1, batch=4), tempfile.mkdtemp()
        >>> PreemptionCheckpoint(directory, save_freq=None).stop_elastic(
        ...     state, {0: ("SIGTERM", time.time())}, check_interval=1)
        >>> state.epoch, state.batch = 0, 0
        >>> path = PreemptionCheckpoint(directory, save_freq=None).resume_elastic(state)
        >>> path.endswith("ckpt-0"), (state.epoch, state.batch)
        (True, (1, 4))
        """
        self._bind(state)
        fresh, self._elastic_entered = float(not self._elastic_entered), True
        if _hvd.host_allreduce_mean([fresh], "keras_adapt_resume_fresh")[0] < 1.0:
            return None  # a running job: its state is the elastic one
        found = self.latest() if _hvd.rank() == 0 else None
        number, saved_workers = -1.0, -1.0
        if found is not None:
            path, meta = found
            self._load(path, meta)
            state.load(meta["epoch"], meta["step_in_epoch"], data_state=meta.get("data"),
                       policy_states=self._policy_states(path, meta))
            self._epoch = meta["epoch"]
            number, saved_workers = float(path.rsplit("-", 1)[-1]), float(meta["workers"])
        number, saved_workers = _hvd.host_allreduce_max([number, saved_workers],
                                                        "keras_adapt_resume_found")
        if number < 0.0:
            return None
        state.sync()
        # Written by another worker count: the resize rule applies as at a
        # change of workers (every rank; the sync gave them the saved state).
        rescaled = state.rescale_from(int(saved_workers))
        if found is not None:
            self._record_resume(path, meta, rescaled)
        return os.path.join(self.directory, f"ckpt-{int(number)}")

    def save_elastic(self, state):
        """A periodic checkpoint under elastic, on every rank right after a
        commit (:class:`~keras_adapt.elastic.CommitStateCallback` calls it at
        the commits of ``save_freq``): rank 0 writes the checkpoint at the
        committed position of ``state`` and records a ``checkpoint`` event;
        no collective (a worker that joins later runs nothing the others do
        not). Returns the path written (None on other ranks).

        Example:

        >>> import tempfile, keras, keras_adapt
        >>> from keras_adapt import elastic
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> state = elastic.KerasState(model, epoch=1, batch=4)
        >>> ckpt = PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=10)
        >>> path = ckpt.save_elastic(state)
        >>> ckpt.position(), ckpt.events[-1]["kind"]
        ((1, 4), 'checkpoint')
        """
        self._bind(state)
        self._epoch = int(state.epoch)
        return self._periodic(int(state.epoch), int(state.batch))

    def stop_elastic(self, state, signalled, check_interval):
        """Every rank of an elastic job whose every rank was signalled, at the
        agreed step, after ``state.commit()``: rank 0 writes the checkpoint at
        the state's position and the ``preemption`` event, and every rank
        waits until both are on disk. The caller then ends the process with
        :attr:`exit_code`."""
        self._bind(state)
        self._epoch = int(state.epoch)
        self.preempted = True
        self._stop(int(state.epoch), int(state.batch), signalled, check_interval)
