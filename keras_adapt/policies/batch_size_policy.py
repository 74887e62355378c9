"""BatchSizePolicy: the shared machinery of the batch-size policies."""

from keras_adapt.actuators import GlobalBatchSize
from keras_adapt.policies import scaling_rules
from keras_adapt.policies._lr_follower import LRFollower
from keras_adapt.policies.base import AdaptationPolicy, _check_positive_int


class BatchSizePolicy(AdaptationPolicy):
    """Base class of the batch-size policies: bounds, actuator, LR following.

    Subclasses decide a target global batch and call :meth:`change_batch`,
    which realises it through :class:`keras_adapt.actuators.GlobalBatchSize`
    (micro-batch of an ``AdaptiveBatchDataset`` and/or accumulation steps),
    records a ``batch_size`` event and, with a ``scaling_rule``, moves the
    learning rate with it (an ``lr`` event).

    Args:
        min_batch, max_batch: bounds of the global batch (samples per update).
        dataset: an ``AdaptiveBatchDataset`` feeding ``fit`` (optional).
        micro_batch_size: the ``batch_size`` given to ``fit`` without one.
        max_micro_batch_size: the largest micro-batch per worker.
        scaling_rule: ``None`` (leave the learning rate alone), a rule name
            (``"linear"``, ``"sqrt"``, ``"adascale"``, ``"none"``) or a
            :class:`ScalingRule`.
        base_batch: the global batch the configured learning rate was tuned
            for (default: the global batch when training begins).
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
                 interval=10, log_dir=None, verbose=0):
        super().__init__(interval=interval, log_dir=log_dir, verbose=verbose)
        self.min_batch = _check_positive_int("min_batch", min_batch)
        self.max_batch = _check_positive_int("max_batch", max_batch)
        if min_batch > max_batch:
            raise ValueError(
                f"min_batch={min_batch} is larger than max_batch={max_batch}; "
                "min_batch must be <= max_batch"
            )
        if micro_batch_size is not None:
            _check_positive_int("micro_batch_size", micro_batch_size)
        if max_micro_batch_size is not None:
            _check_positive_int("max_micro_batch_size", max_micro_batch_size)
        if base_batch is not None:
            _check_positive_int("base_batch", base_batch)
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.max_micro_batch_size = max_micro_batch_size
        self.scaling_rule = None if scaling_rule is None else scaling_rules.get(scaling_rule)
        self.base_batch = base_batch
        self.batch = None
        self.lr_follower = None
        self._last_change = None
        self._lr_value = None

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
        if self.base_batch is None:
            self.base_batch = self.batch.value
        current = self.batch.value
        if current < self.min_batch:
            self.change_batch(self.min_batch, f"batch {current} < min_batch {self.min_batch}")
        elif current > self.max_batch:
            self.change_batch(self.max_batch, f"batch {current} > max_batch {self.max_batch}")

    def adapt(self, step, values):
        self._lr_value = None  # refreshed once per interval (also during a ramp)
        if self.base_batch is None:
            if self.batch.value is None:
                return
            self._clamp()
        self.decide(step, values)
        if self.lr_follower is not None and self.lr_follower.rule.continuous:
            self._follow_lr(values, "gradient statistics changed")

    def decide(self, step, values):
        """Override: choose a target and call :meth:`change_batch`."""

    def change_batch(self, target, reason, values=None):
        """Moves the global batch toward ``target`` (clipped to the bounds).

        Returns the new global batch, or None when nothing changed.
        """
        target = int(min(max(round(target), self.min_batch), self.max_batch))
        before = self.batch.state()
        new = self.batch.set(target)
        if new == before["batch_size"]:
            return None
        self._last_change = self.step
        self.record("batch_size", reason, before, self.batch.state())
        if self.lr_follower is not None:
            self._follow_lr(values if values is not None else self.measurements(),
                            f"batch {before['batch_size']} -> {new}")
        return new

    def _follow_lr(self, values, reason):
        change = self.lr_follower.update(self.batch.value, self.base_batch, values)
        self._lr_value = None
        if change is not None:
            rule = type(self.lr_follower.rule).__name__
            self.record("lr", f"{rule}: {reason}", *change)

    def log_values(self):
        out = {}
        if self.batch is not None and self.batch.value is not None:
            out["batch_size"] = float(self.batch.value)
        if self.lr_follower is not None:
            if self._lr_value is None:
                self._lr_value = self.lr_follower.lr.current_lr()
            out["lr"] = self._lr_value
        return out

    def get_state(self):
        state = super().get_state()
        state.update(batch_size=self.batch.value if self.batch else None,
                     base_batch=self.base_batch, last_change=self._last_change)
        if self.lr_follower is not None:
            lr = self.lr_follower.lr
            state.update(lr_factor=lr.target, progress=lr.progress, gain=lr.gain)
        return state

    def restore(self, state):
        super().restore(state)
        if state.get("base_batch"):
            self.base_batch = int(state["base_batch"])
        self._last_change = state.get("last_change")
        if state.get("batch_size"):
            self.batch.set(int(state["batch_size"]))
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
                      base_batch=self.base_batch)
        return config
