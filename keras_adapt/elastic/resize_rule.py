"""``ResizeRule``: what changes with the number of workers of an elastic job."""

from keras_adapt import optimizer as _optimizer
from keras_adapt.checks import check_choice, check_int
from keras_adapt.formulas import scaling_rules

MODES = ("keep", "scale", "none")


class ResizeRule:
    """How the batch and the learning rate follow the worker count N.

    * ``"keep"``: the global batch ``global_batch`` stays; each worker takes
      ``global_batch // N`` samples per step (the learning rate stays, since
      the batch does). ``global_batch`` must divide by every N the job may
      have (checked at each change, with the fix in the error).
    * ``"scale"``: each worker keeps ``batch_size`` samples per step, so the
      global batch is ``N x batch_size``, and the learning rate is multiplied
      by ``scaling.factor(N / base_workers)`` (a rule of
      :mod:`keras_adapt.formulas.scaling_rules`: ``"linear"``, ``"sqrt"``,
      ``"adascale"`` ...) through keras-adapt's learning-rate factor, so the
      learning rate you configured is the one for ``base_workers`` workers.
    * ``"none"``: nothing changes.

    Args:
        mode: ``"keep"``, ``"scale"`` or ``"none"``.
        global_batch: the global batch to keep (``"keep"``).
        batch_size: the per-worker batch (``"scale"``).
        scaling: the learning-rate rule for ``"scale"`` (name, config or
            :class:`~keras_adapt.policies.ScalingRule`; default linear). Its
            ``warmup_steps`` ramps the new rate in.
        base_workers: the worker count the configured learning rate is for.

    Example:

    >>> from keras_adapt.elastic import ResizeRule
    >>> keep = ResizeRule("keep", global_batch=64)
    >>> [keep.per_worker_batch(n) for n in (1, 2, 4)]
    [64, 32, 16]
    >>> scale = ResizeRule("scale", batch_size=32, scaling="sqrt", base_workers=1)
    >>> scale.per_worker_batch(4), scale.lr_factor(4)
    (32, 2.0)
    """

    def __init__(self, mode="keep", global_batch=None, batch_size=None, scaling="linear",
                 base_workers=1):
        self.mode = check_choice("mode", mode, MODES)
        self.base_workers = check_int("base_workers", base_workers)
        self.global_batch = None
        self.batch_size = None
        if mode == "keep":
            if global_batch is None:
                raise ValueError("mode='keep' needs global_batch=<the global batch to keep>")
            self.global_batch = check_int("global_batch", global_batch)
        elif mode == "scale":
            if batch_size is None:
                raise ValueError("mode='scale' needs batch_size=<the per-worker batch>")
            self.batch_size = check_int("batch_size", batch_size)
        self.scaling = scaling_rules.get(scaling)

    @classmethod
    def get(cls, rule):
        """A rule from a :class:`ResizeRule` or None (mode ``"none"``).

        Example:

        >>> from keras_adapt.elastic import ResizeRule
        >>> ResizeRule.get(None).mode
        'none'
        """
        if rule is None:
            return cls("none")
        if not isinstance(rule, ResizeRule):
            raise TypeError(f"rule must be a keras_adapt.elastic.ResizeRule or None, got {rule!r}")
        return rule

    def per_worker_batch(self, workers):
        """Each worker's batch with ``workers`` workers (None in mode ``"none"``)."""
        if self.mode == "keep":
            if self.global_batch % workers:
                raise ValueError(
                    f"ResizeRule('keep', global_batch={self.global_batch}) cannot split over "
                    f"{workers} workers; use a global_batch divisible by every worker count the "
                    "job may have (for example their least common multiple)"
                )
            return self.global_batch // workers
        return self.batch_size

    def lr_factor(self, workers, stats=None):
        """The learning-rate factor with ``workers`` workers (1 unless ``"scale"``)."""
        if self.mode != "scale":
            return 1.0
        return float(self.scaling.factor(workers / self.base_workers, stats,
                                         base_batch=self.base_workers * self.batch_size))

    def apply(self, model, before, after, dataset=None):
        """Applies the rule for a change from ``before`` to ``after`` workers
        to ``model``'s optimizer and batch machinery; returns ``{"before":
        {...}, "after": {...}}`` with what changed (for the ``resize`` event).

        With keras-adapt's own batch machinery the rule acts through it:

        * a :class:`~keras_adapt.actuators.GlobalBatchSize` on the model
          (``optimizer.adapt_state.batch_size_actuator``, made by you or by a
          batch-size policy): its worker count becomes ``after``; ``"keep"``
          keeps its global batch (the one it holds now, which a policy may
          have changed) by a new micro-batch and accumulation k
          (:meth:`~keras_adapt.actuators.GlobalBatchSize.set`), ``"scale"``
          keeps each worker's micro-batch and k, so the global batch grows
          or shrinks with the workers;
        * else an :class:`~keras_adapt.data.AdaptiveBatchDataset`
          (``dataset``, already re-sharded for ``after`` workers): ``"keep"``
          sets its micro-batch to ``global_batch // after``.

        Example:

        >>> import numpy as np, keras, keras_adapt
        >>> from keras_adapt.actuators import GlobalBatchSize
        >>> from keras_adapt.data import AdaptiveBatchDataset
        >>> from keras_adapt.elastic import ResizeRule
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> ds = AdaptiveBatchDataset(np.zeros((64, 2)), np.zeros((64, 1)), micro_batch_size=8,
        ...                           num_workers=1, rank=0)
        >>> batch = GlobalBatchSize(model, dataset=ds)   # 1 worker x 8 x k=1
        >>> out = ResizeRule("keep", global_batch=8).apply(model, 1, 2, ds)
        >>> batch.workers, ds.micro_batch_size, batch.accumulation.steps, batch.value
        (2, 4, 1, 8)
        """
        optimizer = model.optimizer
        actuator = optimizer.adapt_state.batch_size_actuator
        if actuator is not None and actuator.dataset is not None and actuator.dataset is not dataset:
            raise ValueError(
                f"the model's GlobalBatchSize feeds a {type(actuator.dataset).__name__} that "
                "the elastic state does not re-shard; give the same AdaptiveBatchDataset to "
                "KerasState(..., dataset=ds) (an AdaptiveBatchPipeline cannot be re-sharded: "
                "use AdaptiveBatchDataset, or a data(epoch, batch) function)")
        # The batch machinery in use: the actuator's, else the rule's own batch.
        through_actuator = actuator is not None and actuator.micro_batch_size is not None
        out = {"before": {}, "after": {}}
        if self.mode != "none":  # what the change starts from, read before it
            lr_before = _optimizer.effective_learning_rate(optimizer)
            if through_actuator:
                keep = actuator.value
                out["before"] = {"batch_size": actuator.micro_batch_size, "global_batch": keep,
                                 "accumulation": actuator.accumulation.steps, "lr": lr_before}
            else:
                out["before"] = {"batch_size": self.per_worker_batch(before),
                                 "global_batch": before * self.per_worker_batch(before),
                                 "lr": lr_before}
        if actuator is not None:
            actuator.workers = after
        if self.mode == "none":
            return out
        if through_actuator:
            if self.mode == "keep":
                actuator.set(keep)
            out["after"] = {"batch_size": actuator.micro_batch_size,
                            "global_batch": actuator.value,
                            "accumulation": actuator.accumulation.steps}
        else:
            out["after"] = {"batch_size": self.per_worker_batch(after),
                            "global_batch": after * self.per_worker_batch(after)}
            if dataset is not None and dataset.micro_batch_size != self.per_worker_batch(after):
                dataset.micro_batch_size = self.per_worker_batch(after)
        if self.mode == "scale":
            from keras_adapt.actuators import LearningRateScale

            stats = optimizer.gradient_statistics
            factor = self.lr_factor(after, None if stats is None else stats.result())
            LearningRateScale(model).set(factor, warmup_steps=self.scaling.warmup_steps)
            # The rate once any warm-up ramp has ended.
            out["after"].update(lr_factor=factor,
                                lr=_optimizer.base_learning_rate(optimizer) * factor)
        else:
            out["after"]["lr"] = _optimizer.effective_learning_rate(optimizer)
        return out
