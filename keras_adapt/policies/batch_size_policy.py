"""BatchSizePolicy: the shared machinery of the batch-size policies."""

import warnings

from keras_adapt.actuators import GlobalBatchSize
from keras_adapt.checks import check_int, invalid
from keras_adapt.formulas import scaling_rules
from keras_adapt.policies._lr_follower import LRFollower
from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.policies.progress import COUNTS, TrainingProgress


class BatchSizePolicy(AdaptationPolicy):
    """Base class of the batch-size policies: bounds, actuator, LR following.

    Subclasses decide a target global batch and call :meth:`change_batch`,
    which realises it through :class:`keras_adapt.actuators.GlobalBatchSize`
    (micro-batch of an ``AdaptiveBatchDataset`` and/or accumulation steps),
    records a ``batch_size`` event and, with a ``scaling_rule``, moves the
    learning rate with it (an ``lr`` event).

    :attr:`progress` (:class:`TrainingProgress`) counts the samples trained
    and their statistical progress; every step's logs carry both as
    ``samples`` and ``progress`` (the counts after that step), which
    ``AdaptTensorBoard`` writes as ``adapt/samples`` and ``adapt/progress``
    and the Adapt tab draws. With ``epoch_end`` the policy also ends
    ``fit``'s epochs, as AdaptDL does: an epoch ends at the first update
    after which the count reaches ``(epoch + 1) x samples_per_epoch``.
    ``"samples"`` makes an epoch one pass over the data whatever the batch;
    ``"progress"`` makes it one pass's worth of statistical progress, so a
    run at a batch beyond the noise scale trains on more samples per epoch,
    and epoch-keyed schedules (``LearningRateScheduleCallback``, Keras'
    ``LearningRateScheduler``) and ``epochs`` follow the progress
    unchanged. Give ``fit`` the endless ``ds.dataset`` *without*
    ``steps_per_epoch`` (a ``steps_per_epoch`` caps every epoch, and a
    warning says when it ended one early). The policy ends an epoch by
    setting ``model.stop_training`` for its last step and clears it in its
    own ``on_epoch_end``: put callbacks that stop training at an epoch's end
    (``EarlyStopping``) *after* the policy in ``callbacks``.

    A subclass that prices step times sets :attr:`update_timer` (an
    :class:`UpdateTimer`) in its ``__init__``: the policy then times every
    update and feeds the timer's throughput model the agreed mean at every
    ``adapt()``, before ``decide``; :attr:`throughput_model` is that model
    and :meth:`configuration` the ``(micro_batch, accumulation, workers)``
    of a global batch, to price with ``update_timer.time_ratio``. The
    model's observations are part of :meth:`get_state`, so a worker joining
    an elastic job (which restores the committed state) and a resumed run
    price with the model the other workers have.

    Args:
        min_batch, max_batch: bounds of the global batch (samples per update).
        dataset: an ``AdaptiveBatchDataset`` feeding ``fit`` (optional).
        micro_batch_size: the ``batch_size`` given to ``fit`` without one.
        max_micro_batch_size: the largest micro-batch per worker.
        scaling_rule: ``None`` (leave the learning rate alone), a rule name
            (``"linear"``, ``"sqrt"``, ``"adascale"``, ``"none"``) or a
            :class:`ScalingRule`.
        base_batch: the global batch the configured learning rate was tuned
            for (default: the global batch when training begins); progress
            is counted in samples at this batch.
        epoch_end: ``None`` (``fit``'s own epochs), ``"samples"`` or
            ``"progress"``: end each epoch on that count (see above).
        samples_per_epoch: the count of one epoch (default with an
            ``AdaptiveBatchDataset``: one pass, ``dataset.samples_per_pass``).
        interval, log_dir, verbose: see :class:`AdaptationPolicy`.

    Example:

    >>> from keras_adapt.policies import BatchSizePolicy
    >>> class Double(BatchSizePolicy):   # double the batch every epoch
    ...     def on_epoch_adapt(self, epoch, values):
    ...         self.change_batch(2 * self.batch.value, "next epoch")
    >>> policy = Double(min_batch=32, max_batch=1024, micro_batch_size=32)
    """

    def __init__(self, min_batch, max_batch, dataset=None, micro_batch_size=None,
                 max_micro_batch_size=None, scaling_rule=None, base_batch=None,
                 epoch_end=None, samples_per_epoch=None, interval=10, log_dir=None, verbose=0):
        super().__init__(interval=interval, log_dir=log_dir, verbose=verbose)
        self.min_batch = check_int("min_batch", min_batch)
        self.max_batch = check_int("max_batch", max_batch)
        if min_batch > max_batch:
            raise ValueError(
                f"min_batch={min_batch} is larger than max_batch={max_batch}; "
                "min_batch must be <= max_batch"
            )
        if micro_batch_size is not None:
            check_int("micro_batch_size", micro_batch_size)
        if max_micro_batch_size is not None:
            check_int("max_micro_batch_size", max_micro_batch_size)
        if base_batch is not None:
            check_int("base_batch", base_batch)
        if epoch_end is not None and epoch_end not in COUNTS:
            raise invalid(
                "epoch_end", epoch_end, "use None (fit's own epochs), "
                "'samples' (one pass over the data) or 'progress' (one pass's worth of "
                "statistical progress)")
        if samples_per_epoch is not None:
            check_int("samples_per_epoch", samples_per_epoch)
        elif epoch_end is not None and getattr(dataset, "samples_per_pass", None) is None:
            raise ValueError(
                f"epoch_end={epoch_end!r} needs the samples of one epoch: pass "
                "samples_per_epoch=len(x), or dataset=an AdaptiveBatchDataset (one pass)")
        self.epoch_end = epoch_end
        self.samples_per_epoch = samples_per_epoch
        #: Samples trained and their statistical progress (:class:`TrainingProgress`).
        self.progress = TrainingProgress()
        self._ending_epoch = False
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.max_micro_batch_size = max_micro_batch_size
        self.scaling_rule = None if scaling_rule is None else scaling_rules.get(scaling_rule)
        self.base_batch = base_batch
        self.batch = None
        self.lr_follower = None
        self._last_change = None
        self._lr_value = None
        #: The :class:`UpdateTimer` of a policy that prices step times (None: it does not).
        self.update_timer = None

    @property
    def throughput_model(self):
        """The :class:`~keras_adapt.formulas.throughput.ThroughputModel` this policy
        feeds (None when it does not price step times).

        Example:

        >>> from keras_adapt.policies import GNSBatchSizePolicy
        >>> print(GNSBatchSizePolicy(16, 64, micro_batch_size=16).throughput_model)
        None
        >>> policy = GNSBatchSizePolicy(16, 64, micro_batch_size=16, price_step_times=True)
        >>> policy.throughput_model.configurations()
        {}
        """
        return None if self.update_timer is None else self.update_timer.model

    def configuration(self, global_batch):
        """``(micro_batch, accumulation, workers)`` that would make ``global_batch``
        (the actuator's plan, kept within ``[min_batch, max_batch]`` where a
        batch that can be made lies there; after the model is attached).

        Example:

        >>> import keras, keras_adapt
        >>> from keras_adapt.policies import GNSBatchSizePolicy
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        >>> policy = GNSBatchSizePolicy(16, 256, micro_batch_size=16)
        >>> policy.set_model(model)
        >>> policy.configuration(64)    # one worker: 4 micro-batches of 16 per update
        (16, 4, 1)
        """
        b, k = self.batch.plan(global_batch, self.min_batch, self.max_batch)
        return b, k, self.batch.workers

    def on_train_begin(self, logs=None):
        self._ending_epoch = False  # a fit left by an exception (an elastic reset)
        if self.update_timer is not None:
            self.update_timer.begin_fit(self.model)
        super().on_train_begin(logs)

    def on_attach(self, model):
        self.batch = GlobalBatchSize.of(model, dataset=self.dataset,
                                        micro_batch_size=self.micro_batch_size,
                                        max_micro_batch_size=self.max_micro_batch_size)
        if self.scaling_rule is not None:
            self.lr_follower = LRFollower(model, self.scaling_rule)

    def on_adapt_begin(self, values):
        if self.batch.value is None:
            return  # the micro-batch is read from the data at the first step
        self._clamp()

    def _clamp(self):
        unreachable = self._unreachable_bounds()
        # At the start of a job (on every rank alike: nothing trained, or
        # no batch known yet) such bounds are bad arguments; later -- a
        # resize, a resume on another worker count -- the job goes on.
        if unreachable and (self.base_batch is None or self.step == 0):
            raise ValueError(unreachable)
        if unreachable:
            warnings.warn(f"{type(self).__name__}: {unreachable}; training at "
                          f"{self.batch.value}", RuntimeWarning, stacklevel=2)
        if self.base_batch is None:
            self.base_batch = self.batch.value
        current = self.batch.value
        if current < self.min_batch:
            self.change_batch(self.min_batch, f"batch {current} < min_batch {self.min_batch}")
        elif current > self.max_batch:
            self.change_batch(self.max_batch, f"batch {current} > max_batch {self.max_batch}")

    def _unreachable_bounds(self):
        """Why no global batch between the bounds can be made by the workers
        and micro-batches of now, or None when one can."""
        if self.batch.within(self.min_batch, self.max_batch):
            return None
        nearest = sorted({self.batch.workers * b * k for b, k in (
            self.batch.plan(self.min_batch), self.batch.plan(self.max_batch))})
        made = (f"micro-batches of up to {self.batch.max_micro_batch_size}"
                if self.batch.dataset is not None
                else f"micro-batch {self.batch.micro_batch_size}")
        return (
            f"no global batch between min_batch={self.min_batch} and "
            f"max_batch={self.max_batch} can be made by {self.batch.workers} worker(s) "
            f"with {made} and any accumulation (global = workers x micro-batch x k); "
            f"the nearest {'are' if len(nearest) > 1 else 'is'} "
            f"{' and '.join(map(str, nearest))}: widen the bounds to include one, or "
            "change the micro-batch")

    def adapt(self, step, values):
        self._lr_value = None  # refreshed once per interval (also during a ramp)
        if self.update_timer is not None and self.batch.value is not None:
            self.update_timer.observe(self.batch)
        if self.base_batch is None:
            if self.batch.value is None:
                return
            self._clamp()
        self.decide(step, values)
        if self.lr_follower is not None and self.lr_follower.rule.continuous:
            self._follow_lr(values, "gradient statistics changed")
        self.progress.set_gain(self.batch.value, self.base_batch, values)

    def decide(self, step, values):
        """Override: choose a target and call :meth:`change_batch`."""

    def change_batch(self, target, reason, values=None):
        """Moves the global batch toward ``target`` (clipped to the bounds).

        Returns the new global batch, or None when nothing changed.
        """
        target = int(min(max(round(target), self.min_batch), self.max_batch))
        before = self.batch.state()
        new = self.batch.set(target, self.min_batch, self.max_batch)
        if new == before["batch_size"]:
            return None
        self._last_change = self.step
        if self.update_timer is not None:
            self.update_timer.reset_interval()
        self.record("batch_size", reason, before, self.batch.state())
        values = values if values is not None else self.measurements()
        if self.lr_follower is not None:
            self._follow_lr(values, f"batch {before['batch_size']} -> {new}")
        if self.base_batch is not None:
            self.progress.set_gain(new, self.base_batch, values)
        return new

    def _follow_lr(self, values, reason):
        change = self.lr_follower.update(self.batch.value, self.base_batch, values)
        self._lr_value = None
        if change is not None:
            rule = type(self.lr_follower.rule).__name__
            self.record("lr", f"{rule}: {reason}", *change)

    def _count_update(self):
        # Here, not in on_update_end, so an override cannot skip it.
        if self.update_timer is not None:
            self.update_timer.end_update()
        if self.batch.value is not None:
            self.progress.add_update(self.batch.value, self.base_batch or self.batch.value)

    # -- epochs on samples or progress ------------------------------------------
    def epoch_boundary(self, epoch):
        """The count (samples or progress) at which ``epoch`` ends, or None
        without ``epoch_end``."""
        if self.epoch_end is None:
            return None
        per_epoch = self.samples_per_epoch or self.dataset.samples_per_pass
        return float((epoch + 1) * per_epoch)

    @property
    def ending_epoch(self):
        """True from the begin of the step after which this policy ends the
        epoch (``epoch_end``) until its ``on_epoch_end``: that step is the
        epoch's last.

        Example:

        >>> from keras_adapt.policies import GNSBatchSizePolicy
        >>> GNSBatchSizePolicy(16, 64, micro_batch_size=16).ending_epoch
        False
        """
        return self._ending_epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.update_timer is not None:
            # First: the step that ran before ends its update in super().
            self.update_timer.begin_step(self._step_running)
        super().on_train_batch_begin(batch, logs)
        if self.batch.value is None:
            return
        completes = self.next_step_completes_update()
        # The logs of this step carry the counts after it (host floats, set
        # here on the training thread, copied at the step's end).
        self._log_cache.update(self._counts(completes))
        if self.epoch_end is None or not completes:
            return
        after = self.progress.count_after_update(self.epoch_end, self.batch.value,
                                                 self.base_batch or self.batch.value)
        if after >= self.epoch_boundary(self.epoch) and not self.model.stop_training:
            # Keras ends the epoch after this step; on_epoch_end clears it.
            self.model.stop_training = True
            self._ending_epoch = True

    def on_epoch_end(self, epoch, logs=None):
        if self.update_timer is not None:
            self.update_timer.end_epoch()
        super().on_epoch_end(epoch, logs)
        if self._ending_epoch:
            self._ending_epoch = False
            self.model.stop_training = False
        elif self.epoch_end is not None and not self.model.stop_training:
            warnings.warn(
                f"{type(self).__name__}: epoch {epoch} ended at "
                f"{self.epoch_end} {self.progress.count(self.epoch_end):.0f}, before its end at "
                f"{self.epoch_boundary(epoch):.0f}: fit's steps_per_epoch (or the end of the "
                f"data) cut it short. With epoch_end={self.epoch_end!r} give fit an endless "
                "stream and no steps_per_epoch.",
                RuntimeWarning, stacklevel=2)

    def _counts(self, pending):
        """``samples`` and ``progress`` as logs values, with one more update
        at the current batch when ``pending``."""
        state = self.progress.get_state(
            (self.batch.value, self.base_batch or self.batch.value) if pending else None)
        return {"samples": float(state["samples"]), "progress": float(state["progress"])}

    def log_values(self):
        out = {}
        if self.batch is not None and self.batch.value is not None:
            out["batch_size"] = float(self.batch.value)
            out.update(self._counts(False))
        if self.lr_follower is not None:
            if self._lr_value is None:
                self._lr_value = self.lr_follower.lr.current_lr()
            out["lr"] = self._lr_value
        return out

    def get_state(self):
        kept = self.state_until_attached()
        if kept is not None:
            return kept
        state = super().get_state()
        # A checkpoint at a step's end holds that step's update: the
        # resumed run starts after it and never counts it.
        pending = None
        if self.batch is not None and self.batch.value is not None and self.uncounted_update():
            pending = (self.batch.value, self.base_batch or self.batch.value)
        state.update(batch_size=self.batch.value if self.batch else None,
                     base_batch=self.base_batch, last_change=self._last_change,
                     training_progress=self.progress.get_state(pending))
        if self.lr_follower is not None:
            lr = self.lr_follower.lr
            state.update(lr_factor=lr.target, progress=lr.progress, gain=lr.gain)
        if self.update_timer is not None:
            # Every rank prices with the same model only if a worker that
            # joins (or a resumed run) gets the observations too.
            state.update(throughput_model=self.update_timer.model.get_state())
        return state

    def restore(self, state):
        if self.keep_until_attached(state):
            return  # no actuators yet: applied when Keras attaches the policy
        super().restore(state)
        if state.get("base_batch"):
            self.base_batch = int(state["base_batch"])
        self._last_change = state.get("last_change")
        self.progress.restore(state.get("training_progress", {}))
        if state.get("batch_size"):
            self.batch.set(int(state["batch_size"]))
        if self.update_timer is not None and "throughput_model" in state:
            self.update_timer.model.set_state(state["throughput_model"])
            self.update_timer.reset_interval()
        if self.lr_follower is not None and "lr_factor" in state:
            lr = self.lr_follower.lr
            lr.set(float(state["lr_factor"]))
            lr.progress = float(state.get("progress", lr.progress))
            lr.gain = float(state.get("gain", 1.0))

    def get_config(self):
        config = super().get_config()
        config.update(min_batch=self.min_batch, max_batch=self.max_batch,
                      micro_batch_size=self.micro_batch_size,
                      max_micro_batch_size=self.max_micro_batch_size,
                      scaling_rule=scaling_rules.serialize(self.scaling_rule),
                      base_batch=self.base_batch, epoch_end=self.epoch_end,
                      samples_per_epoch=self.samples_per_epoch)
        return config
