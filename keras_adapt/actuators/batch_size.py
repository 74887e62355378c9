"""GlobalBatchSize: the global batch ``workers x micro-batch x k``, as one knob."""

import math

from keras_adapt import _hvd
from keras_adapt.actuators._common import distributed_optimizer, positive_int
from keras_adapt.actuators.gradient_accumulation import GradientAccumulation


class GlobalBatchSize:
    """Sets the global batch size of a running job.

    The global batch of one optimizer update is ``workers x b x k`` with b
    the per-worker micro-batch and k the accumulated micro-steps. Given an
    :class:`keras_adapt.data.AdaptiveBatchDataset`, a new global batch is
    made with the largest micro-batch up to ``max_micro_batch_size`` (bigger
    micro-batches use the hardware better) and the fewest micro-steps;
    otherwise b stays as the data gives it and only k changes. A request is
    rounded to the nearest size that can be made; :meth:`set` returns it.

    One actuator per model: policies that share a model share it
    (:meth:`of`), so a learning-rate policy sees the batch a batch-size
    policy chose.

    Args:
        model: a model compiled with ``keras_adapt.DistributedOptimizer``.
        dataset: optional ``AdaptiveBatchDataset`` feeding ``fit``.
        micro_batch_size: the ``batch_size`` given to ``fit`` when no
            adaptive dataset is used (default: read from the data at the
            first step, which needs the optimizer's gradient statistics).
        max_micro_batch_size: largest micro-batch (memory bound); default
            the dataset's initial micro-batch size.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.actuators import GlobalBatchSize
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> batch = GlobalBatchSize(model, micro_batch_size=16)
    >>> batch.set(100), batch.accumulation.steps   # one worker: 16 x 6 = 96
    (96, 6)
    """

    def __init__(self, model, dataset=None, micro_batch_size=None, max_micro_batch_size=None):
        self.optimizer = distributed_optimizer(model, "GlobalBatchSize")
        if micro_batch_size is not None:
            micro_batch_size = positive_int("micro_batch_size", micro_batch_size)
        if max_micro_batch_size is not None:
            max_micro_batch_size = positive_int("max_micro_batch_size", max_micro_batch_size)
        if dataset is not None and not hasattr(dataset, "micro_batch_size"):
            raise TypeError(
                f"dataset must be a keras_adapt.data.AdaptiveBatchDataset, got "
                f"{type(dataset).__name__}; wrap your arrays in AdaptiveBatchDataset(x, y, ...)"
            )
        self.dataset = dataset
        self._micro = micro_batch_size
        if dataset is not None:
            self.max_micro_batch_size = max_micro_batch_size or dataset.micro_batch_size
        else:
            self.max_micro_batch_size = max_micro_batch_size
        self.accumulation = GradientAccumulation(model)
        self.workers = _hvd.size()
        self.optimizer.adapt_state.batch_size_actuator = self

    @classmethod
    def of(cls, model, **kwargs):
        """The actuator already attached to ``model``'s optimizer, or a new one."""
        optimizer = distributed_optimizer(model, "GlobalBatchSize")
        existing = optimizer.adapt_state.batch_size_actuator
        if existing is not None:
            if kwargs.get("dataset") is not None and existing.dataset is None:
                existing.dataset = kwargs["dataset"]
                existing.max_micro_batch_size = (kwargs.get("max_micro_batch_size")
                                                 or kwargs["dataset"].micro_batch_size)
            return existing
        return cls(model, **kwargs)

    @property
    def micro_batch_size(self):
        """The per-worker micro-batch b (None until known)."""
        if self.dataset is not None:
            return self.dataset.micro_batch_size
        if self._micro is None:
            stats = self.optimizer.gradient_statistics
            if stats is not None:
                recorded = int(stats.batch_size.numpy())
                if recorded > 0:
                    self._micro = recorded
        return self._micro

    @property
    def value(self):
        """The current global batch (None until the micro-batch is known)."""
        b = self.micro_batch_size
        return None if b is None else self.workers * b * self.accumulation.steps

    def state(self):
        """A dict of the current decomposition."""
        return {"batch_size": self.value, "micro_batch_size": self.micro_batch_size,
                "accumulation": self.accumulation.steps, "workers": self.workers}

    def plan(self, global_batch):
        """The ``(micro_batch, k)`` closest to ``global_batch`` that can be made."""
        global_batch = positive_int("global_batch", global_batch)
        per_worker = global_batch / self.workers
        if self.dataset is not None:
            cap = min(self.max_micro_batch_size, self.dataset.shard_size)
            k = max(1, math.ceil(per_worker / cap - 1e-9))
            b = min(cap, max(1, math.floor(per_worker / k + 0.5)))
            return b, k
        b = self.micro_batch_size
        if b is None:
            raise RuntimeError(
                "GlobalBatchSize does not know the micro-batch size yet; pass "
                "micro_batch_size= (the batch_size given to fit) or an AdaptiveBatchDataset"
            )
        return b, max(1, math.floor(per_worker / b + 0.5))  # ties round up

    def set(self, global_batch):
        """Moves to the achievable global batch nearest ``global_batch``; returns it."""
        b, k = self.plan(global_batch)
        if self.dataset is not None and b != self.dataset.micro_batch_size:
            self.dataset.micro_batch_size = b
        if k != self.accumulation.steps:
            self.accumulation.set(k)
        return self.value
