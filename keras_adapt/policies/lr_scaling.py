"""LRScalingPolicy: keeps the learning rate consistent with the global batch."""

from keras_adapt.actuators import GlobalBatchSize
from keras_adapt.checks import check_int
from keras_adapt.formulas import scaling_rules
from keras_adapt.policies._lr_follower import LRFollower
from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.record import events


class LRScalingPolicy(AdaptationPolicy):
    """Scales the learning rate with the global batch under a rule.

    The learning rate you configured is taken to be right for a global batch
    of ``base_batch`` samples. The policy keeps the effective rate at
    ``lr x rule(B / base_batch)`` for the current global batch B
    (``workers x micro-batch x accumulation``), whether B changed because
    more workers were launched or because a batch-size policy changed it:
    it reacts to every ``batch_size`` event at the step it happens, and
    re-checks every ``interval`` updates (AdaScale's gain follows the
    gradient statistics there).

    Args:
        rule: ``"linear"``, ``"sqrt"``, ``"adascale"``, ``"none"`` or a
            :class:`ScalingRule` (with its ``warmup_steps``).
        base_batch: the global batch the configured learning rate is for.
            Default ``micro-batch x base_workers``: the learning rate was
            tuned on ``base_workers`` workers (Horovod's ``lr x size()``
            idiom for ``base_workers=1``).
        base_workers: see ``base_batch`` (default 1).
        micro_batch_size, dataset: how the micro-batch is known (see
            :class:`keras_adapt.actuators.GlobalBatchSize`).
        interval, log_dir, verbose: see :class:`AdaptationPolicy`.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.policies import LRScalingPolicy, SqrtScaling
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    >>> policy = LRScalingPolicy(SqrtScaling(), base_batch=8, micro_batch_size=32)
    >>> x = np.ones((64, 4))
    >>> _ = model.fit(x, x[:, :1], batch_size=32, verbose=0, callbacks=[policy])
    >>> round(policy.lr.factor, 6) == round((32 * keras_adapt.size() / 8) ** 0.5, 6)
    True
    """

    def __init__(self, rule="linear", base_batch=None, base_workers=1, micro_batch_size=None,
                 dataset=None, interval=10, log_dir=None, verbose=0):
        super().__init__(interval=interval, log_dir=log_dir, verbose=verbose)
        self.rule = scaling_rules.get(rule)
        if base_batch is not None:
            check_int("base_batch", base_batch)
        self.base_batch = base_batch
        self.base_workers = check_int("base_workers", base_workers)
        if micro_batch_size is not None:
            check_int("micro_batch_size", micro_batch_size)
        self.micro_batch_size = micro_batch_size
        self.dataset = dataset
        self.batch = None
        self.follower = None
        self._lr_value = None

    @property
    def lr(self):
        """The :class:`keras_adapt.actuators.LearningRateScale` this policy drives."""
        return self.follower.lr

    def on_attach(self, model):
        self.batch = GlobalBatchSize.of(model, dataset=self.dataset,
                                        micro_batch_size=self.micro_batch_size)
        self.follower = LRFollower(model, self.rule)

    def _base(self):
        if self.base_batch is None and self.batch.micro_batch_size is not None:
            self.base_batch = self.batch.micro_batch_size * self.base_workers
        return self.base_batch

    def _follow(self, reason, values=None):
        if self.batch.value is None or self._base() is None:
            return
        change = self.follower.update(self.batch.value, self.base_batch,
                                      values if values is not None else self.measurements())
        self._lr_value = None
        if change is not None:
            self.record("lr", f"{type(self.rule).__name__}: {reason}", *change)

    def _on_event(self, event):
        if event["kind"] == "batch_size" and self.batch is not None:
            self._follow(f"batch {event['before'].get('batch_size')} -> "
                         f"{event['after'].get('batch_size')}")

    def on_train_begin(self, logs=None):
        events.add_listener(self._on_event)
        super().on_train_begin(logs)

    def on_train_end(self, logs=None):
        events.remove_listener(self._on_event)

    def on_adapt_begin(self, values):
        self._follow(f"global batch {self.batch.value} at start", values)

    def adapt(self, step, values):
        self._lr_value = None
        self._follow(f"global batch {self.batch.value}", values)

    def log_values(self):
        if self.follower is None:
            return {}
        if self._lr_value is None:
            self._lr_value = self.follower.lr.current_lr()
        return {"lr": self._lr_value}

    def get_state(self):
        kept = self.state_until_attached()
        if kept is not None:
            return kept
        state = super().get_state()
        state.update(base_batch=self.base_batch)
        if self.follower is not None:  # attached: the learning-rate factor exists
            lr = self.follower.lr
            state.update(lr_factor=lr.target, progress=lr.progress, gain=lr.gain)
        return state

    def restore(self, state):
        if self.keep_until_attached(state):
            return  # no learning-rate factor yet: applied when Keras attaches the policy
        super().restore(state)
        if state.get("base_batch"):
            self.base_batch = int(state["base_batch"])
        lr = self.follower.lr
        if "lr_factor" in state:
            lr.set(float(state["lr_factor"]))
        lr.progress = float(state.get("progress", lr.progress))
        lr.gain = float(state.get("gain", 1.0))

    def get_config(self):
        config = super().get_config()
        config.update(rule=scaling_rules.serialize(self.rule), base_batch=self.base_batch,
                      base_workers=self.base_workers, micro_batch_size=self.micro_batch_size)
        return config
