"""AdaptationPolicy: the base class of every policy (a Keras callback)."""

import json
import os

import keras

from keras_adapt import _hvd, _train_step
from keras_adapt.checks import check_int, invalid
from keras_adapt.optimizer import UpdateBoundary, require_distributed
from keras_adapt.record import events

_STAT_KEYS = ("gns", "grad_sqr", "grad_var", "grad_snr", "updates", "covered_updates")


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _changed_keys(before, after):
    """The keys of ``after`` whose value differs from ``before`` (all if none does)."""
    return [k for k in after if before.get(k) != after.get(k)] or list(after)


def _changes(before, after):
    """``key a -> b`` for the keys that changed, for the one-line printout.

    Example:

    >>> from keras_adapt.policies.base import _changes
    >>> _changes({"batch_size": 32, "accumulation": 1}, {"batch_size": 68, "accumulation": 1})
    'batch_size 32 -> 68'
    """
    keys = _changed_keys(before, after)
    return ", ".join(f"{k} {_short(before[k])} -> {_short(after[k])}" if k in before
                     else f"{k} {_short(after[k])}" for k in keys)


def _decision_line(event):
    """The line ``verbose=1`` prints for one event; the kind is named only
    when it is not already one of the changed keys.

    Example:

    >>> from keras_adapt.policies.base import _decision_line
    >>> _decision_line({"step": 40, "epoch": 1, "kind": "batch_size", "reason": "gns 70 > 2 x 32",
    ...                 "before": {"batch_size": 32}, "after": {"batch_size": 68}})
    '[keras-adapt] step 40 epoch 1: batch_size 32 -> 68 (gns 70 > 2 x 32)'
    >>> _decision_line({"step": 0, "epoch": 0, "kind": "resume", "reason": "restored",
    ...                 "before": {}, "after": {"batch_size": 64}})
    '[keras-adapt] step 0 epoch 0: resume batch_size 64 (restored)'
    """
    before, after = event["before"], event["after"]
    changes = _changes(before, after)
    prefix = "" if event["kind"] in _changed_keys(before, after) else f"{event['kind']} "
    return (f"[keras-adapt] step {event['step']} epoch {event['epoch']}: "
            f"{prefix}{changes} ({event['reason']})")


class AdaptationPolicy(keras.callbacks.Callback):
    """Base class of the policies: read measurements, decide, act, record.

    A policy is a Keras callback with three hooks to override:

    * :meth:`on_adapt_begin` -- once when training begins;
    * :meth:`adapt` -- every ``interval`` optimizer updates (only at update
      boundaries, never in the middle of an accumulation), counted across
      ``fit`` calls and restarts from a saved or committed state, so the
      calls fall where one uninterrupted ``fit`` puts them;
    * :meth:`on_epoch_adapt` -- at the end of every epoch.

    Each receives ``values``: the in-graph gradient statistics (``gns``,
    ``grad_sqr``, ``grad_var``, ``grad_snr``, ``updates``), merged with the
    epoch's logs at epoch end. :meth:`adapt` runs on the training thread
    just before the next step, so the change it makes applies from that step
    on; the policy is async-safe and does not make Keras 3 sync per step. The statistics derive from allreduced values, so they are
    identical on every rank; a policy that decides only from them (and from
    step and epoch counts) makes the same decision at the same step on every
    rank. Per-rank quantities such as the loss or host timings must be
    agreed first (see :func:`keras_adapt._hvd.host_allreduce_mean`).

    A policy acts only through actuators (:mod:`keras_adapt.actuators`) and
    reports each decision with :meth:`record`, which writes an adaptation
    event to ``<log_dir>/adapt_events.jsonl`` (rank 0) and to listeners such
    as the TensorBoard callback.

    Args:
        interval: optimizer updates between calls of :meth:`adapt`.
        log_dir: directory of the event log; None keeps events in memory
            (:attr:`events`) and listeners only.
        verbose: 1 prints each decision on rank 0.

    Example (a policy in a few lines: halve the learning rate when the
    gradient SNR drops below 0.1):

    >>> import keras_adapt
    >>> from keras_adapt.actuators import LearningRateScale
    >>> from keras_adapt.policies import AdaptationPolicy
    >>> class HalveOnLowSNR(AdaptationPolicy):
    ...     def on_attach(self, model):
    ...         self.lr = LearningRateScale(model)
    ...     def adapt(self, step, values):
    ...         if values.get("grad_snr", 1.0) < 0.1:
    ...             before = self.lr.factor
    ...             self.lr.set(before / 2)
    ...             self.record("lr", "snr < 0.1", {"lr_factor": before},
    ...                         {"lr_factor": before / 2})
    >>> policy = HalveOnLowSNR(interval=20)
    """

    #: Whether the policy reads the gradient statistics (the optimizer must
    #: then be created with ``gradient_stats=True``).
    needs_statistics = False

    def __init__(self, interval=10, log_dir=None, verbose=0):
        super().__init__()
        self.interval = check_int("interval", interval)
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"log_dir must be a path or None, got {log_dir!r}")
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        if verbose not in (0, 1) or not isinstance(verbose, (int, bool)):
            raise invalid("verbose", verbose, "use 0 (silent) or 1 (print each decision on "
                          "rank 0)")
        self.verbose = int(verbose)
        #: Every event this policy recorded, in order (on every rank).
        self.events = []
        self.epoch = 0
        self._last_adapt = None  # optimizer step of the last adapt() call (None: no run yet)
        self._updates_since = 0  # updates since then, counted on the host
        self._boundary = None  # which micro-step completes an update (host count)
        self._step_running = False  # a step began and its end is not yet counted
        self._log_cache = {}
        self._pending_state = None
        self._state_until_attached = None  # see keep_until_attached()
        self.async_safe = True  # see the Keras hooks below
        self._supports_tf_logs = True

    # -- wiring ------------------------------------------------------------
    def set_model(self, model):
        super().set_model(model)
        optimizer = require_distributed(model, type(self).__name__,
                                        statistics=self.needs_statistics)
        stats = optimizer.gradient_statistics
        if stats is not None and stats.fixed_batch_size is None:
            # The estimators need the micro-batch size of every step.
            _train_step.record_batch_size(model, stats)
        self.on_attach(model)
        if self._state_until_attached is not None:
            state, self._state_until_attached = self._state_until_attached, None
            self.restore(state)

    def keep_until_attached(self, state):
        """For a :meth:`restore` that needs what :meth:`on_attach` creates:
        before Keras has attached the policy to its model, keeps ``state``
        (applied by ``restore`` as soon as it is attached, before
        ``on_train_begin``) and returns True; once attached, returns False.
        A worker joining an elastic job gets the committed state in the
        sync that precedes its first ``fit``, so its policies are restored
        before they are attached.

        Example:

        >>> from keras_adapt.policies import AdaptationPolicy
        >>> policy = AdaptationPolicy()
        >>> policy.keep_until_attached({"last_adapt": 40}), policy.state_until_attached()
        (True, {'last_adapt': 40})
        """
        if self.model is not None:
            return False
        self._state_until_attached = dict(state)
        return True

    def state_until_attached(self):
        """The state :meth:`keep_until_attached` keeps for when the policy is
        attached, or None: what ``get_state`` reports meanwhile (a commit
        before the first ``fit`` keeps it).

        Example:

        >>> from keras_adapt.policies import AdaptationPolicy
        >>> print(AdaptationPolicy().state_until_attached())
        None
        """
        return None if self._state_until_attached is None else dict(self._state_until_attached)

    @property
    def optimizer(self):
        return self.model.optimizer

    @property
    def step(self):
        """Optimizer updates so far (``optimizer.iterations``)."""
        return int(self.model.optimizer.iterations.numpy())

    def measurements(self, result=None):
        """The gradient statistics now (a dict; empty without statistics);
        ``result``: a ``GradientStatistics.result()`` already read."""
        stats = self.model.optimizer.gradient_statistics
        if stats is None:
            return {}
        result = stats.result() if result is None else result
        return {k: result[k] for k in _STAT_KEYS}

    def _values(self, logs):
        values = dict(logs or {})
        values.update(self.measurements())
        return values

    def _check_one_step_per_call(self):
        spe = getattr(self.model, "steps_per_execution", None)
        if spe is None:  # tf.keras 2 keeps it in a variable
            spe = getattr(self.model, "_steps_per_execution", None)
        spe = int(spe.numpy()) if hasattr(spe, "numpy") else int(spe or 1)
        if spe != 1:
            raise ValueError(
                f"{type(self).__name__} needs one train step per call (it counts steps "
                f"and acts between them); the model was compiled with "
                f"steps_per_execution={spe}. Compile with steps_per_execution=1."
            )

    # -- Keras hooks -------------------------------------------------------
    # The per-step work happens in on_train_batch_begin, which Keras always
    # runs on the training thread between two steps: a decision made there
    # takes effect at the same step on every rank. on_train_batch_end only
    # copies cached floats into the logs, so the policy is async-safe and
    # Keras 3 need not sync the host after every step on its account.
    def on_train_begin(self, logs=None):
        self._check_one_step_per_call()
        self._step_running = False
        self._boundary = UpdateBoundary(self.model.optimizer)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self.restore(state)
            self.record("resume", "state restored from a checkpoint", {}, state)
        if self._last_adapt is None or self._last_adapt > self.step:
            self._last_adapt = self.step  # a new run: count from here
        # The updates since the last adapt() count, whether they ran in an
        # earlier fit or before a checkpoint or an elastic commit: the next
        # adapt() comes where it would have in one uninterrupted fit.
        self._updates_since = self.step - self._last_adapt
        self.on_adapt_begin(self._values(logs))
        if self._updates_since >= self.interval:  # one was due when the run stopped
            self._adapt_now()
        self._refresh_logs()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._step_ended()
        self._step_running = True

    def next_step_completes_update(self):
        """Whether the step about to run completes an optimizer update (False
        before training; host arithmetic, no variable is read). Between a
        step's end and the next step's begin, "the step" is the one that
        just ran, whose update :meth:`on_update_end` has not yet seen."""
        return self._boundary is not None and self._boundary.next_completes()

    def uncounted_update(self):
        """Whether the step that ran last completed an update not yet passed to
        :meth:`on_update_end` (it is, at the next step's begin or the epoch's
        end): true in a checkpoint taken at a step's end."""
        return self._step_running and self.next_step_completes_update()

    def _step_ended(self):
        """Accounts for the step that ran before (per step: host arithmetic
        only; the variables are read every ``interval`` updates)."""
        if not self._step_running:
            return
        self._step_running = False
        if not self._boundary.step_ended():
            return
        self._count_update()
        self.on_update_end()
        self._updates_since += 1
        if self._updates_since >= self.interval:
            self._adapt_now()

    def _count_update(self):
        """The framework's own accounting of a completed update, before
        :meth:`on_update_end` (which subclasses override freely)."""

    def _adapt_now(self):
        self._updates_since = 0
        step = self.step
        self._last_adapt = step
        self.adapt(step, self._values(None))
        self._refresh_logs()

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs.update(self._log_cache)

    def on_epoch_end(self, epoch, logs=None):
        self._step_ended()
        self.on_epoch_adapt(epoch, self._values(logs))
        self._refresh_logs()
        if logs is not None:
            logs.update(self._log_cache)

    def _refresh_logs(self):
        self._log_cache = dict(self.log_values())

    # -- to override -------------------------------------------------------
    def on_attach(self, model):
        """Called when Keras hands the policy its model: create actuators here."""

    def on_update_end(self):
        """Called after every micro-step that completed an optimizer update."""

    def on_adapt_begin(self, values):
        """Called once when training begins."""

    def adapt(self, step, values):
        """Called every ``interval`` updates with the current ``values``."""

    def on_epoch_adapt(self, epoch, values):
        """Called at the end of every epoch."""

    def log_values(self):
        """Extra logs keys this policy writes (e.g. ``batch_size``, ``lr``)."""
        return {}

    # -- events --------------------------------------------------------------
    def record(self, kind, reason, before, after):
        """Records one decision as an adaptation event and returns it.

        The step is the current optimizer update, at which the change takes
        effect on every rank.
        """
        event = events.emit(kind, step=self.step, epoch=self.epoch, policy=type(self).__name__,
                            reason=reason, before=before, after=after, log_dir=self.log_dir)
        self.events.append(event)
        if self.verbose and _hvd.rank() == 0:
            print(_decision_line(event), flush=True)
        return event

    # -- state ---------------------------------------------------------------
    def get_state(self):
        """What a resumed run needs to continue as this one would (JSON-able)."""
        return {"last_adapt": self._last_adapt}

    def restore(self, state):
        """Applies a state from :meth:`get_state` now (see also
        :meth:`restore_at_train_begin`)."""
        last = state.get("last_adapt")
        if last is not None:
            self._last_adapt = int(last)

    def restore_at_train_begin(self, state):
        """Keeps ``state`` (from :meth:`get_state`) and restores it when
        training (re)starts, then records a ``resume`` event.

        Example:

        >>> from keras_adapt.policies import AdaptationPolicy
        >>> policy = AdaptationPolicy()
        >>> policy.restore_at_train_begin({"last_adapt": 40})   # applied by the next fit
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from get_state(), got {type(state).__name__}")
        self._pending_state = dict(state)

    def save_state(self, path):
        """Writes :meth:`get_state` to ``path`` as JSON (rank 0 only).

        Example:

        >>> import os, tempfile
        >>> from keras_adapt.policies import AdaptationPolicy
        >>> p = AdaptationPolicy()
        >>> path = os.path.join(tempfile.mkdtemp(), "policy.json")
        >>> p.save_state(path); p.load_state(path)
        """
        if _hvd.rank() != 0:
            return
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.get_state(), f)
        os.replace(tmp, path)  # never a half-written state file

    def load_state(self, path):
        """Reads a state written by :meth:`save_state`; applied at train begin."""
        with open(path) as f:
            self.restore_at_train_begin(json.load(f))

    # -- config --------------------------------------------------------------
    def get_config(self):
        """Constructor arguments (JSON-able), for :meth:`from_config`."""
        return {"interval": self.interval, "log_dir": self.log_dir, "verbose": self.verbose}

    @classmethod
    def from_config(cls, config):
        """A new policy from :meth:`get_config` output."""
        return cls(**config)
