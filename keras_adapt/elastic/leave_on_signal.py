"""``LeaveOnSignalCallback``: a signalled worker leaves; the others go on without rollback."""

import os
import sys
import time

import keras

try:
    from horovod.common.exceptions import HostsUpdatedInterrupt
    import horovod.tensorflow as _hvd_tf
except ImportError as exc:  # pragma: no cover - both stacks have Horovod
    raise ImportError(
        "keras_adapt.elastic needs Horovod (horovod==0.28.1 with Gloo); see docs/install.md"
    ) from exc

from keras_adapt import _hvd
from keras_adapt.checks import check_float, check_int
from keras_adapt.coordination import (EXIT_CODE, SIGNALS, CheckInterval, SignalAgreement,
                                      as_notices)
from keras_adapt.elastic import disk_checkpoint
from keras_adapt.optimizer import UpdateBoundary
from keras_adapt.record import events


class LeaveOnSignalCallback(keras.callbacks.Callback):
    """On SIGTERM or SIGINT, the signalled workers of an elastic job leave
    at an agreed step and the others continue from exactly that step: no
    rollback, no step lost and none run twice.

    The signal handler only sets a flag. Every ``check_interval`` optimizer
    updates, at the end of the step, the workers agree on which ranks were
    signalled (one host allreduce of a few numbers,
    :class:`~keras_adapt.callbacks.SignalAgreement`). Once one was, at the
    start of the next step (or epoch, or at the end of ``fit``), when the
    elastic callbacks have recorded the position, every rank commits the
    state (``state.commit()``) and the lowest-ranked survivor writes a
    ``preemption`` event naming the signalled ranks and signals. Then the
    signalled processes shut Horovod down and exit with ``exit_code``
    (non-zero: Horovod's elastic driver records a failure and removes
    their host; an exit code of 0 would end the whole job), and the others
    leave ``fit`` with Horovod's ``HostsUpdatedInterrupt``, so
    :func:`~keras_adapt.elastic.run` re-forms the job without them and
    without restoring anything; the :class:`~keras_adapt.elastic.ResizeRule`
    applies and the first step after records the ``resize`` event with its
    pause.

    If every rank was signalled (the whole job is stopping, e.g. a spot
    cluster reclaimed), the in-memory commit would die with the job: with
    a ``checkpoint`` (a :class:`~keras_adapt.callbacks.PreemptionCheckpoint`,
    which :func:`~keras_adapt.elastic.fit` hands over when it is among its
    callbacks), rank 0 writes it at the agreed step (its format: the same
    command resumes at that step), every rank waits until it is on disk,
    the checkpoint records the ``preemption`` event and every process exits
    with the checkpoint's ``exit_code``; its ``deadline_s`` timer starts at
    the signal. Without one, all exit with ``exit_code`` after the commit
    and the position is lost (see docs/preemption.md).

    With ``notices`` a cloud VM's revocation notice
    (:class:`~keras_adapt.coordination.RevocationNotices`, watched while
    ``fit`` runs) is a request like a signal, named by its provider: the
    noticed VM's workers leave at the agreed step, and the ``preemption``
    event holds the deadlines and the time left (docs/cloud_vms.md).

    Horovod removes the whole host of a worker that fails: give a
    preemptible machine's slots to one worker each, or all of them leave.
    :func:`keras_adapt.elastic.fit` adds this callback (SIGTERM and SIGINT)
    when none is given. A signal that comes while no ``fit`` runs (during
    a reset) ends the process as usual, and the others roll back to the
    last commit, as after a failure.

    Args:
        state: the :class:`~keras_adapt.elastic.KerasState`.
        check_interval: optimizer updates between agreements: an int, or
            ``"auto"`` (the default): the fewest that keep the agreements
            under 1% of the step time, capped so that they are at most a
            quarter of ``deadline_s`` apart
            (:class:`~keras_adapt.coordination.signal_agreement.CheckInterval`,
            from the workers' averaged measurements: the same on every rank).
        deadline_s: the platform's grace period after SIGTERM (30 s on most
            clouds and Kubernetes); only bounds the ``"auto"`` interval.
        exit_code: the leaving process's exit code (default 75,
            ``EX_TEMPFAIL``; 1 to 255).
        signals: the signals that make a worker leave.
        log_dir: directory of ``adapt_events.jsonl`` (default: the state's).
        checkpoint: a :class:`~keras_adapt.callbacks.PreemptionCheckpoint`
            with an exit code, written when every rank is signalled (None:
            none; its periodic saves are the commit callback's). It is not a Keras callback of the
            fit then: this callback's agreement is the only one.
        notices: None (the default: the ``checkpoint``'s, if any), a
            provider (``"gce"``, ``"aws"``, ``"azure"``) or a
            :class:`~keras_adapt.coordination.RevocationNotices`: its notices
            count as signals; the ``"auto"`` interval is capped by the
            shorter of ``deadline_s`` and the provider's lead.

    Attributes:
        leaving: after the agreement, ``{rank: (signal name, signal time)}``
            of the ranks that leave (empty before).
        events: the events this process recorded.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt import elastic
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> cb = elastic.LeaveOnSignalCallback(elastic.KerasState(model))
    >>> cb.check_interval, cb.exit_code, cb.leaving, cb.checkpoint
    ('auto', 75, {}, None)
    """

    def __init__(self, state, check_interval="auto", deadline_s=25.0, exit_code=EXIT_CODE,
                 signals=SIGNALS, log_dir=None, checkpoint=None, notices=None):
        super().__init__()
        if not hasattr(state, "commit"):
            raise TypeError(f"state must be an elastic state (KerasState), got {state!r}")
        if check_interval != "auto":
            check_interval = check_int("check_interval", check_interval, fix="use a positive "
                                       "int or 'auto' (the default)")
        check_float("deadline_s", deadline_s, low_open=True, finite=False, fix="use a number of "
                    "seconds > 0 (the grace period after SIGTERM, e.g. 25)")
        check_int("exit_code", exit_code, 1, 255, fix=f"use an int in [1, 255] "
                  f"(default {EXIT_CODE}): with 0 Horovod ends the whole job")
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"log_dir must be a path or None, got {log_dir!r}")
        if checkpoint is not None:
            disk_checkpoint.checked(checkpoint)
        if notices is None and checkpoint is not None:
            notices = checkpoint.notices  # the checkpoint's watcher, which it does not run here
        self.notices = as_notices(notices)
        self.state = state
        self.checkpoint = checkpoint
        self.check_interval = check_interval
        self.deadline_s = float(deadline_s)
        self.exit_code = exit_code
        self.log_dir = os.fspath(log_dir) if log_dir is not None else getattr(
            state, "log_dir", None)
        self.agreement = SignalAgreement(
            "keras_adapt_leave", signals,
            on_signal=None if checkpoint is None else checkpoint.start_deadline)
        self.leaving = {}
        self.events = []
        self._schedule = CheckInterval(check_interval, self.deadline_s if self.notices is None
                                       else min(self.deadline_s, self.notices.lead_s))
        self._agreed_interval = 1  # updates between the last two agreements
        self._since = 0
        self._boundary = None

    # -- Keras hooks -------------------------------------------------------
    def on_train_begin(self, logs=None):
        # A signal recorded in the previous fit of the same run still counts.
        self._boundary = UpdateBoundary(self.model.optimizer)
        self._since = 0
        self._schedule.start()
        self.agreement.install()
        if self.notices is not None:
            self.notices.start(self.agreement.request)

    def on_train_batch_end(self, batch, logs=None):
        self._schedule.step_ended()
        if self.leaving or not self._boundary.step_ended():
            return
        self._since += 1
        if self._since < self._schedule.interval:
            return
        self._agreed_interval = self._schedule.interval
        self._since = 0
        self.leaving = dict(self._schedule.agree(self.agreement))

    def on_train_batch_begin(self, batch, logs=None):
        self._leave_if_agreed()

    def on_epoch_begin(self, epoch, logs=None):
        self._leave_if_agreed()

    def on_train_end(self, logs=None):
        try:
            self._leave_if_agreed()
        finally:
            self.agreement.remove()
            if self.notices is not None:
                self.notices.stop()

    # -- the agreement and the leave ---------------------------------------
    def _leave_if_agreed(self):
        if not self.leaving:
            return
        size, rank = _hvd.size(), _hvd.rank()
        leavers = sorted(self.leaving)
        stay = [r for r in range(size) if r not in self.leaving]
        try:
            self.state.commit()
        except HostsUpdatedInterrupt:
            pass  # hosts changed too: the job re-forms below anyway
        if not stay and self.checkpoint is not None:
            # The whole job stops: to disk (its event), then every process ends.
            self.agreement.remove()
            disk_checkpoint.stop(self.checkpoint, self.state, self.leaving, self._agreed_interval)
            self._exit(self.checkpoint.exit_code)
        first = min(t for _, t in self.leaving.values())
        deadlines = [self.agreement.deadlines.get(r) for r in leavers]
        known = [d for d in deadlines if d is not None]
        names = ", ".join(f"{self.leaving[r][0]} on rank {r}" for r in leavers)
        where = f"epoch {self.state.epoch} step {self.state.batch}"
        reason = (f"{names}: leaves at {where}; {len(stay)} of {size} workers go on without "
                  "rollback" if stay else f"{names}: every worker stops at {where}")
        event = events.emit(
            "preemption", step=int(self.model.optimizer.iterations.numpy()),
            epoch=int(self.state.epoch), policy=type(self).__name__, reason=reason,
            before={"workers": size},
            after={"workers": len(stay), "signalled_ranks": leavers,
                   "signals": [self.leaving[r][0] for r in leavers],
                   "epoch": int(self.state.epoch), "step_in_epoch": int(self.state.batch),
                   "signal_to_leave_s": time.time() - first,
                   "check_interval": self._agreed_interval,
                   "exit_code": self.exit_code, "deadlines": deadlines,
                   "time_left_at_notice_s": [None if d is None else d - self.leaving[r][1]
                                             for r, d in zip(leavers, deadlines)],
                   "time_left_at_leave_s": min(known) - time.time() if known else None},
            log_dir=self.log_dir, write=rank == (stay[0] if stay else 0))
        self.events.append(event)
        self.agreement.remove()
        if rank in self.leaving or not stay:
            self._exit(self.exit_code)
        self.leaving = {}
        self.agreement.clear()
        # Leaves fit; the elastic run re-forms the job and syncs, no restore.
        raise HostsUpdatedInterrupt(False)

    @staticmethod
    def _exit(code):
        # os._exit: a normal interpreter exit (TensorFlow's teardown) held
        # the others 3-5 s longer; the driver re-forms the job only once
        # this process has ended. The events are on disk already.
        _hvd_tf.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
