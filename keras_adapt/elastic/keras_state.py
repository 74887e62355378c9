"""``KerasState``: the elastic state of a Keras model trained with keras-adapt.

Built on ``horovod.common.elastic.ObjectState`` (Horovod's ``KerasState``
calls ``optimizer.variables()``, a property on Keras 3). What it holds:

* the model's weights and the optimizer's variables (slots included),
  copied in memory by :meth:`KerasState.save` and broadcast from rank 0 by
  :meth:`KerasState.sync` with ``horovod.tensorflow`` broadcasts;
* keras-adapt's state of the optimizer: the variables of
  ``optimizer.adapt_state.checkpoint_variables()`` (the same list
  ``PreemptionCheckpoint`` writes: the gradient statistics' moving averages
  and counters, the update counter, the accumulation k, the learning-rate
  factor, the synchronisation strategy's index, count and parameters) and
  the strategy chosen on the host (``adapt_state.sync.get_state()``);
* the data position of an :class:`~keras_adapt.data.AdaptiveBatchDataset`
  given as ``dataset=``;
* the position: ``epoch`` (epochs completed) and ``batch`` (batches
  completed in the current epoch), plus any keyword given;
* the ``get_state()`` of the policies given as ``policies=``.

On every reset (a worker came or went) the train function is dropped, so
the next ``fit`` traces it again with the new worker count, the dataset is
re-sharded for the new workers at the same position, and the
:class:`~keras_adapt.elastic.ResizeRule` rescales the batch (through a
``GlobalBatchSize`` and the dataset when there are) or the learning rate;
after the sync the synchronisation strategy restarts its own models from
the synced one (:meth:`keras_adapt.sync.SyncState.rejoin`); the first step
after the reset records a ``resize`` event.
"""

import time

import tensorflow as tf

try:
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult
    import horovod.tensorflow as _hvd_tf
except ImportError as exc:  # pragma: no cover - both stacks have Horovod
    raise ImportError(
        "keras_adapt.elastic needs Horovod (horovod==0.28.1 with Gloo); see docs/install.md"
    ) from exc

from keras_adapt import _hvd
from keras_adapt import optimizer as _optimizer
from keras_adapt.checks import check_int
from keras_adapt.coordination import broadcast_variables
from keras_adapt.elastic.resize_rule import ResizeRule
from keras_adapt.record import events


def _signature(variables):
    return [tuple(int(d) for d in v.shape) for v in variables]


class KerasState(ObjectState):
    """Elastic state of a Keras model, its optimizer and the training
    position, for :func:`keras_adapt.elastic.run`.

    Make it after the model is built and compiled, and before ``run``: it
    creates the optimizer's slots without any collective (a worker that
    joins a running job must not run collectives the others do not), so the
    first ``sync`` finds the same variables on every rank.

    Any Keras optimizer can be held, as with Horovod's ``KerasState``: its
    variables are saved, restored and synced with the model's. keras-adapt's
    own state (gradient statistics, accumulation, learning-rate factor,
    synchronisation strategy) and a resize ``rule`` need
    ``keras_adapt.DistributedOptimizer``, which is also what averages the
    gradients in ``fit``; with another optimizer they are simply not there.

    Args:
        model: a built Keras model (compiled with
            ``keras_adapt.DistributedOptimizer`` to train it elastically).
        optimizer: the optimizer, if not ``model.optimizer``.
        batch: batches completed in the current epoch (0 to start).
        epoch: epochs completed (0 to start).
        rule: a :class:`~keras_adapt.elastic.ResizeRule` (or its mode,
            ``"keep"`` / ``"scale"``, with ``global_batch`` or ``batch_size``):
            how the batch and the learning rate follow the worker count. None:
            neither changes.
        log_dir: where rank 0 appends the ``resize`` events
            (``adapt_events.jsonl``); None: listeners only.
        policies: keras-adapt policies whose ``get_state()`` is committed and
            restored with the rest.
        dataset: the :class:`~keras_adapt.data.AdaptiveBatchDataset` that
            feeds ``fit`` (give it to :func:`~keras_adapt.elastic.fit` as
            ``data``): its position is committed, restored and synced, and
            every reset re-shards it for the new workers and applies the rule
            to it (and to the model's ``GlobalBatchSize``, if any).
        **kwargs: more values to commit, restore and sync (any picklable
            python object), exposed as attributes.

    Attributes:
        workers: the number of workers now.
        batch_size: the per-worker batch under the rule now (None without a
            rule that sets it); build the data with it.
        resizes: the ``resize`` events this process recorded.
        dataset: the ``dataset`` argument (None without one).
        sync_choice: the synchronisation strategy's host choice at the last
            commit (``adapt_state.sync.get_state()``; None without a
            keras-adapt optimizer), taken back on restore and sync.
        data_state: the dataset's position at the last commit
            (``dataset.get_state()``; None without a dataset).

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.elastic import KerasState
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    >>> state = KerasState(model, rule=keras_adapt.elastic.ResizeRule("keep", global_batch=32))
    >>> state.epoch, state.batch, state.workers, state.batch_size
    (0, 0, 1, 32)
    """

    def __init__(self, model, optimizer=None, batch=0, epoch=0, rule=None, log_dir=None,
                 policies=(), dataset=None, **kwargs):
        if not getattr(model, "built", False) or not model.weights:
            raise ValueError(
                "KerasState needs a built model: give it an Input (keras.Input(shape)) or call "
                "model.build(input_shape) first, so every worker has the same weights to sync"
            )
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is None or not hasattr(optimizer, "iterations"):
            raise ValueError(
                f"optimizer={optimizer!r} is not valid; use a Keras optimizer: compile the model "
                "with keras_adapt.DistributedOptimizer(...) or pass optimizer=")
        for name, value in (("batch", batch), ("epoch", epoch)):
            check_int(name, value, 0)
        self.model = model
        self.optimizer = optimizer
        # keras-adapt's state of the optimizer (None: another optimizer)
        self._adapt_state = optimizer.adapt_state if _optimizer.is_distributed(optimizer) else None
        self.rule = ResizeRule.get(rule)
        if self.rule.mode != "none" and (self._adapt_state is None
                                         or getattr(model, "optimizer", None) is not optimizer):
            raise ValueError(
                f"rule={rule!r} is not valid with the optimizer {type(optimizer).__name__}: a "
                "resize rule acts through the model's keras-adapt optimizer; compile the model "
                "with keras_adapt.DistributedOptimizer(...), or use rule=None")
        self.log_dir = log_dir
        self.policies = list(policies)
        for p in self.policies:
            if not (hasattr(p, "get_state") and hasattr(p, "restore")):
                raise TypeError(f"policies must have get_state() and restore(), got {p!r}")
        self.resizes = []
        self.dataset = self._check_dataset(dataset)
        # Slots now, without a collective (Horovod #2652: a new worker that
        # makes them in its first step runs collectives nobody matches).
        _optimizer.build_slots(optimizer, model.trainable_variables)
        self.workers = _hvd.size()
        self.batch_size = None
        self._last_step_end = None
        self._pending = None
        # This process left training only because hosts were removed, at the
        # same commit as every other survivor: it holds the job's state.
        self._holds_committed_state = False
        self.adapt = {}
        self.policy_states = []
        self.sync_choice = None
        self.data_state = None
        self.signature = _signature(self._tensors())
        self._snapshot_host()
        self._save_tensors()
        super().__init__(bcast_object=_hvd_tf.broadcast_object, get_rank=_hvd.rank,
                         batch=batch, epoch=epoch, adapt=self.adapt,
                         policy_states=self.policy_states, signature=self.signature,
                         sync_choice=self.sync_choice, data_state=self.data_state, **kwargs)
        self.rescaled = self._apply_rule(self.workers, self.workers)
        self.batch_size = self._batch_size()

    def _apply_rule(self, before, after):
        """The resize rule from ``before`` to ``after`` workers (nothing
        without keras-adapt's optimizer: no rule, no batch machinery)."""
        if self._adapt_state is None:
            return {"before": {}, "after": {}}
        return self.rule.apply(self.model, before, after, self.dataset)

    def _check_dataset(self, dataset):
        if dataset is None:
            return None
        if not (hasattr(dataset, "reshard") and hasattr(dataset, "get_state")):
            raise TypeError(
                f"KerasState(dataset=...) takes a keras_adapt.data.AdaptiveBatchDataset, got "
                f"{type(dataset).__name__}; with other data give fit a data(epoch, batch) "
                "function built with state.batch_size")
        if (dataset.num_workers, dataset.rank) != (_hvd.size(), _hvd.rank()):
            raise ValueError(
                f"the AdaptiveBatchDataset is sharded for rank {dataset.rank} of "
                f"{dataset.num_workers} but this is rank {_hvd.rank()} of {_hvd.size()}; make "
                "it with the default num_workers and rank (Horovod's)")
        if self.rule.mode != "none" and self._adapt_state.batch_size_actuator is None:
            want = self.rule.per_worker_batch(_hvd.size())
            if dataset.micro_batch_size != want:
                raise ValueError(
                    f"AdaptiveBatchDataset(micro_batch_size={dataset.micro_batch_size}) does "
                    f"not match ResizeRule({self.rule.mode!r}), which gives {want} per worker "
                    f"with {_hvd.size()} workers; make the dataset with micro_batch_size={want}")
        return dataset

    def _batch_size(self):
        """Each worker's batch now: the actuator's or the dataset's
        micro-batch when there is one, else the rule's."""
        actuator = None if self._adapt_state is None else self._adapt_state.batch_size_actuator
        if actuator is not None and actuator.micro_batch_size is not None:
            return actuator.micro_batch_size
        if self.dataset is not None:
            return self.dataset.micro_batch_size
        return self.rule.per_worker_batch(self.workers)

    # -- what is saved --------------------------------------------------------
    def _tensors(self):
        return list(self.model.weights) + _optimizer.optimizer_variables(self.optimizer)

    def _snapshot_host(self):
        adapt_state = self._adapt_state
        if adapt_state is not None:
            self.adapt = {k: v.numpy() for k, v in adapt_state.checkpoint_variables().items()}
            control = adapt_state.lr_control
            self.adapt["lr_control/use_progress"] = (None if control is None
                                                     else control.use_progress)
            self.adapt["compression/state"] = adapt_state.compression.get_state()
            self.sync_choice = adapt_state.sync.get_state()
        self.data_state = None if self.dataset is None else self.dataset.get_state()
        self.policy_states = [p.get_state() for p in self.policies]

    def _save_tensors(self):
        self._saved_tensors = [tf.identity(tf.convert_to_tensor(v)) for v in self._tensors()]

    def _load_host(self):
        if self._adapt_state is not None:
            self._load_adapt_state()
        if self.dataset is not None:
            if self.data_state["num_workers"] == self.dataset.num_workers:
                self.dataset.set_state(self.data_state)
            else:
                self.dataset.reshard(self.dataset.num_workers, self.dataset.rank,
                                     self.data_state["micro_batch_size"], state=self.data_state)
        for p, s in zip(self.policies, self.policy_states):
            p.restore(s)
        self.batch_size = self._batch_size()

    def _load_adapt_state(self):
        adapt_state = self._adapt_state
        use_progress = self.adapt.get("lr_control/use_progress")
        if use_progress is not None:
            _optimizer.enable_lr_control(self.optimizer, bool(use_progress))
            self.model.train_function = None
        if "accumulation_steps" in self.adapt and adapt_state.accumulation is None:
            _optimizer.enable_accumulation(self.optimizer, int(self.adapt["accumulation_steps"]))
            self.model.train_function = None
        if adapt_state.compression.set_state(self.adapt.get("compression/state")):
            self.model.train_function = None  # the same reductions as the other workers
        local = adapt_state.checkpoint_variables()
        for key, value in self.adapt.items():
            if key in local:
                local[key].assign(value)
        if adapt_state.accumulation is not None:
            adapt_state.accumulation.steps_value = int(adapt_state.accumulation.steps.numpy())
        adapt_state.sync.set_state(self.sync_choice)

    def load(self, epoch, batch, data_state=None, policy_states=None):
        """Moves this rank's state to a position saved elsewhere (a disk
        checkpoint whose tensors are already restored into the model and the
        optimizer) and commits it here: ``epoch`` and ``batch``, the data
        position (``AdaptiveBatchDataset.get_state()``, re-sharded when it
        was saved with another worker count) and the policies' states. Run
        on rank 0 before a :meth:`sync`, which gives it to every rank.

        Example:

        >>> import keras, keras_adapt
        >>> from keras_adapt.elastic import KerasState
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> state = KerasState(model)
        >>> state.load(2, 5)
        >>> state.epoch, state.batch
        (2, 5)
        """
        for name, value in (("epoch", epoch), ("batch", batch)):
            check_int(name, value, 0)
        self._snapshot_host()  # keras-adapt's variables and the strategy as restored
        if data_state is not None:
            if self.dataset is None:
                raise ValueError("the saved state has a data position but the state has no "
                                 "dataset; give the AdaptiveBatchDataset as KerasState(..., "
                                 "dataset=ds), as in the run that saved it")
            self.data_state = data_state
        if policy_states is not None:
            if len(policy_states) != len(self.policies):
                raise ValueError(f"{len(policy_states)} policy states saved but the state has "
                                 f"{len(self.policies)} policies; give the same policies=")
            self.policy_states = list(policy_states)
        self.epoch, self.batch = epoch, batch
        self._load_host()
        self._save_tensors()
        super().save()

    def rescale_from(self, before):
        """Applies the resize rule for a change from ``before`` workers to the
        workers now, after a disk checkpoint written by ``before`` workers was
        restored and synced (every rank calls it: no collective), and commits
        the result here; returns what was rescaled, ``{"before": {...},
        "after": {...}}`` as in a ``resize`` event (empty when the count is the
        same: nothing changes).

        Example:

        >>> import keras, keras_adapt
        >>> from keras_adapt.elastic import KerasState, ResizeRule
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        >>> state = KerasState(model, rule=ResizeRule("scale", batch_size=8, base_workers=2))
        >>> out = state.rescale_from(2)   # saved by 2 workers, resumed by 1
        >>> out["after"]["lr_factor"], round(state.lr, 6), state.batch_size
        (0.5, 0.05, 8)
        """
        check_int("before", before, fix="use the worker count (>= 1) "
                  "of the run that wrote the checkpoint")
        if before == self.workers:
            return {"before": {}, "after": {}}
        actuator = None if self._adapt_state is None else self._adapt_state.batch_size_actuator
        if actuator is not None:
            actuator.workers = before  # the global batch the checkpoint's run had
        self.rescaled = self._apply_rule(before, self.workers)
        self.batch_size = self._batch_size()
        self.save()
        return self.rescaled

    def check_host_updates(self):
        """Raises ``HostsUpdatedInterrupt`` on every rank at the same commit
        when the driver announced hosts added or removed to any of them.

        Horovod's version broadcasts rank 0's view as a pickled object (two
        broadcasts); this agrees with one host allreduce (max) of three
        numbers: the newest announcement's time, and whether any rank heard
        of a removal or an addition.

        Horovod's interrupt skips the next sync when hosts were only
        removed. That deadlocks when the job fell below ``--min-np`` and a
        new worker joins in the same re-form (Horovod #3494): the new worker
        syncs, the survivors do not. Here every rank always enters
        :meth:`sync`, which agrees there whether anyone needs the state: a
        removal alone still costs no broadcast.
        """
        newest, removed, added = self._last_updated_timestamp, 0.0, 0.0
        while not self._host_messages.empty():
            timestamp, update = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
                removed = max(removed, float(bool(update & HostUpdateResult.removed)))
                added = max(added, float(bool(update & HostUpdateResult.added)))
        prev, newest, removed, added = _hvd.host_allreduce_max(
            [self._last_updated_timestamp, newest, removed, added], "keras_adapt_host_updates")
        self._last_updated_timestamp = newest
        if newest > prev:
            self._holds_committed_state = bool(removed) and not bool(added)
            raise HostsUpdatedInterrupt(False)

    def save(self):
        """Copies everything into host memory (called by ``commit``)."""
        self._save_tensors()
        self._snapshot_host()
        super().save()

    def restore(self):
        """Returns to the last committed state (after a worker failed)."""
        for v, saved in zip(self._tensors(), self._saved_tensors):
            v.assign(saved)
        super().restore()
        self._load_host()

    def sync(self):
        """Makes every rank hold rank 0's state: the position, keras-adapt's
        state, the data position and the policies' by one object broadcast,
        then the weights and the optimizer's variables by tensor broadcasts.
        The synchronisation strategy then rejoins: its next update restarts
        its own models (BMUF's, EASGD's) from the synced model.

        First the ranks agree (one host allreduce) whether any of them needs
        the state: when every rank is a survivor of a removal (it left at
        the same commit as the others), nothing is broadcast, as Horovod
        skips the sync then; a worker that has just joined makes all of them
        sync, however many hosts were also removed."""
        holds, self._holds_committed_state = self._holds_committed_state, False
        (needed,) = _hvd.host_allreduce_max([0.0 if holds else 1.0], "keras_adapt_sync_needed")
        if self._pending is not None:  # after a reset: the resize event says which
            self._pending["synced"] = bool(needed)
        if not needed:
            return
        mine = _signature(self._tensors())
        # Broadcast the state as it is now, not as last committed: a reset
        # has just applied the resize rule (the learning-rate factor).
        self._snapshot_host()
        super().save()
        super().sync()
        if self.signature != mine:
            raise ValueError(
                f"rank {_hvd.rank()} has variables of shapes {mine} but rank 0 has "
                f"{self.signature}: every worker must build the same model and optimizer "
                "before KerasState (use the same script everywhere)"
            )
        broadcast_variables(self._tensors(), root_rank=0)
        self._load_host()
        if self._adapt_state is not None:
            self._adapt_state.sync.rejoin()
        self._save_tensors()
        self._snapshot_host()
        super().save()

    def reset(self):
        """After a worker came or went, before the sync: drops the compiled
        functions (the worker count is read when they are traced), drops a
        partly accumulated update and this worker's previous gradient (they
        belong to the old membership), re-shards the dataset for the new
        workers at the position it has reached, and applies the resize rule."""
        before, after = self.workers, _hvd.size()
        self.model.train_function = None
        self.model.test_function = None
        self.model.predict_function = None
        adapt_state = self._adapt_state
        acc = None if adapt_state is None else adapt_state.accumulation
        if acc is not None and acc.grads is not None:
            acc.reset()
        if adapt_state is not None and adapt_state.previous is not None:
            adapt_state.previous.stored.assign(False)
        self.workers = after
        if self.dataset is not None:
            self.dataset.reshard(after, _hvd.rank(), self.dataset.micro_batch_size)
        self.rescaled = self._apply_rule(before, after)
        self.batch_size = self._batch_size()
        self._pending = {"before": before, "after": after, "since": self._last_step_end,
                         "reset_at": time.time(), "synced": False}

    # -- the resize event ------------------------------------------------------
    def step_finished(self):
        """Marks the end of a training step (called by the elastic callbacks).

        The first step that ends after a reset records the ``resize`` event:
        workers before and after, the pause ``pause_s`` (from the end of the
        last step before the change to the end of this one: the training
        time the change cost, the new trace included) in two parts,
        ``reform_s`` (leaving ``fit`` and re-forming the Horovod job) and
        ``resume_s`` (the sync, the new trace and the step), ``synced``
        (whether the state was broadcast: not after a removal alone), and
        what was rescaled. Returns that event, else None.
        """
        now = time.time()
        pending, self._pending = self._pending, None
        self._last_step_end = now
        if pending is None:
            return None
        since = pending["since"] if pending["since"] is not None else pending["reset_at"]
        pause = now - since
        before, after = pending["before"], pending["after"]
        change = "shrank" if after < before else "grew" if after > before else "restarted"
        event = events.emit(
            "resize", step=int(self.optimizer.iterations.numpy()), epoch=int(self.epoch),
            policy="KerasState", reason=f"workers {before} -> {after} ({change})",
            before={"workers": before, **self.rescaled["before"]},
            after={"workers": after, "pause_s": round(pause, 6),
                   "reform_s": round(pending["reset_at"] - since, 6),
                   "resume_s": round(now - pending["reset_at"], 6),
                   "synced": pending["synced"], **self.rescaled["after"]},
            log_dir=self.log_dir)
        self.resizes.append(event)
        return event

    @property
    def lr(self):
        """The effective learning rate now (base x keras-adapt's factor)."""
        return _optimizer.effective_learning_rate(self.optimizer)
