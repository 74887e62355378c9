"""GlobalBatchSize: the global batch ``workers x micro-batch x k``, as one knob."""

import math

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.actuators._common import distributed_optimizer, positive_int
from keras_adapt.actuators.gradient_accumulation import GradientAccumulation
from keras_adapt.data.fixed_batch import fixed_batch_size


class GlobalBatchSize:
    """Sets the global batch size of a running job.

    The global batch of one optimizer update is ``workers x b x k`` with b
    the per-worker micro-batch and k the accumulated micro-steps. Given a
    dataset whose micro-batch can change
    (:class:`keras_adapt.data.AdaptiveBatchDataset` for arrays,
    :class:`keras_adapt.data.AdaptiveBatchPipeline` for your own
    ``tf.data`` pipeline), a new global batch is made with the largest
    micro-batch up to ``max_micro_batch_size`` (bigger micro-batches use the
    hardware better) and the fewest micro-steps. Otherwise -- arrays given
    to ``fit`` with ``batch_size``, or an ordinary batched
    ``tf.data.Dataset`` -- b stays as the data gives it and only k changes.
    A request is rounded to the nearest size that can be made; :meth:`set`
    returns it.

    One actuator per model: policies that share a model share it
    (:meth:`of`), so a learning-rate policy sees the batch a batch-size
    policy chose.

    Args:
        model: a model compiled with ``keras_adapt.DistributedOptimizer``.
        dataset: optional; what feeds ``fit``: an ``AdaptiveBatchDataset``
            or ``AdaptiveBatchPipeline`` (b and k change), or a batched
            ``tf.data.Dataset`` (only k changes; its b is read from
            ``.batch(b, drop_remainder=True)``, see
            :func:`keras_adapt.data.fixed_batch_size`, or given as
            ``micro_batch_size``).
        micro_batch_size: the ``batch_size`` given to ``fit`` when the
            micro-batch is fixed (default: read from the dataset or from the
            data at the first step, which needs the optimizer's gradient
            statistics).
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
        self.dataset = None
        self._micro = micro_batch_size
        self.max_micro_batch_size = max_micro_batch_size
        self._attach(dataset, micro_batch_size, max_micro_batch_size)
        self.accumulation = GradientAccumulation(model)
        self.workers = _hvd.size()
        self.optimizer.adapt_state.batch_size_actuator = self

    @classmethod
    def of(cls, model, **kwargs):
        """The actuator already attached to ``model``'s optimizer, or a new one."""
        optimizer = distributed_optimizer(model, "GlobalBatchSize")
        existing = optimizer.adapt_state.batch_size_actuator
        if existing is not None:
            if existing.dataset is None:
                existing._attach(kwargs.get("dataset"), kwargs.get("micro_batch_size"),
                                 kwargs.get("max_micro_batch_size"))
            return existing
        return cls(model, **kwargs)

    def _attach(self, dataset, micro_batch_size, max_micro_batch_size):
        """Takes what feeds ``fit``: a resizable dataset, or a fixed-batch one."""
        if dataset is None:
            return
        if isinstance(dataset, tf.data.Dataset):
            fixed = fixed_batch_size(dataset)
            if fixed is None and micro_batch_size is None:
                raise ValueError(
                    "GlobalBatchSize cannot tell the micro-batch of this tf.data.Dataset "
                    f"(element_spec {dataset.element_spec}); batch it with "
                    ".batch(b, drop_remainder=True) or pass micro_batch_size=b. To let the "
                    "micro-batch change too, pass the AdaptiveBatchPipeline object itself, "
                    "not its .dataset"
                )
            if fixed is not None and micro_batch_size is not None and fixed != micro_batch_size:
                raise ValueError(
                    f"micro_batch_size={micro_batch_size} does not match the dataset's "
                    f"batch size {fixed}; drop micro_batch_size or make them equal"
                )
            self._micro = fixed if fixed is not None else micro_batch_size
            return
        if not (hasattr(dataset, "micro_batch_size") and hasattr(dataset, "micro_batch_limit")):
            raise TypeError(
                f"dataset must be a keras_adapt.data.AdaptiveBatchDataset, an "
                f"AdaptiveBatchPipeline or a batched tf.data.Dataset, got "
                f"{type(dataset).__name__}; wrap arrays in AdaptiveBatchDataset(x, y, ...) "
                "and an unbatched tf.data pipeline in AdaptiveBatchPipeline(ds, ...)"
            )
        self.dataset = dataset
        self.max_micro_batch_size = max_micro_batch_size or dataset.micro_batch_size

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
            cap = self.max_micro_batch_size
            if self.dataset.micro_batch_limit is not None:
                cap = min(cap, self.dataset.micro_batch_limit)
            k = max(1, math.ceil(per_worker / cap - 1e-9))
            b = min(cap, max(1, math.floor(per_worker / k + 0.5)))
            return b, k
        b = self.micro_batch_size
        if b is None:
            raise RuntimeError(
                "GlobalBatchSize does not know the micro-batch size yet; pass "
                "micro_batch_size= (the batch_size given to fit) or dataset= (an "
                "AdaptiveBatchDataset, AdaptiveBatchPipeline or batched tf.data.Dataset)"
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
