"""GlobalBatchSize: the global batch ``workers x micro-batch x k``, as one knob."""

import itertools
import math

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.actuators._common import distributed_optimizer
from keras_adapt.actuators.gradient_accumulation import GradientAccumulation
from keras_adapt.checks import check_int
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
    A request is rounded to the nearest size that can be made, within the
    bounds a policy gives (its ``min_batch`` and ``max_batch``); :meth:`set`
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
            ``micro_batch_size``; else a ``ValueError`` naming the fix). Any
            other object with a settable ``micro_batch_size`` and a
            ``micro_batch_limit`` (the largest size the data can give, or
            None) works as a resizable dataset; anything else is a
            ``TypeError`` naming the fix.
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
            micro_batch_size = check_int("micro_batch_size", micro_batch_size)
        if max_micro_batch_size is not None:
            max_micro_batch_size = check_int("max_micro_batch_size", max_micro_batch_size)
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

    def plan(self, global_batch, low=None, high=None):
        """The ``(micro_batch, k)`` whose global batch is nearest ``global_batch``
        among those in ``[low, high]`` (ties round up); the nearest overall
        when no batch that can be made lies between the bounds (see
        :meth:`within`).

        Example:

        >>> import keras, keras_adapt
        >>> from keras_adapt.actuators import GlobalBatchSize
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        >>> batch = GlobalBatchSize(model, micro_batch_size=32)
        >>> batch.plan(112), batch.plan(112, high=112)   # 128 would pass the bound
        ((32, 4), (32, 3))
        """
        global_batch = check_int("global_batch", global_batch)
        low = 1 if low is None else low
        per_worker = global_batch / self.workers
        if self.dataset is None:
            b = self.micro_batch_size
            if b is None:
                raise RuntimeError(
                    "GlobalBatchSize does not know the micro-batch size yet; pass "
                    "micro_batch_size= (the batch_size given to fit) or dataset= (an "
                    "AdaptiveBatchDataset, AdaptiveBatchPipeline or batched tf.data.Dataset)"
                )
            # global = workers x b x k: only k moves
            return b, _nearest(per_worker / b, self.workers * b, 1, math.inf, low, high)
        cap = self.max_micro_batch_size
        if self.dataset.micro_batch_limit is not None:
            cap = min(cap, self.dataset.micro_batch_limit)
        # The fewest micro-steps that reach the batch, with the largest
        # micro-batch (bigger micro-batches use the hardware better); more
        # steps only where the bounds leave no micro-batch for those.
        fewest = max(1, math.ceil(per_worker / cap - 1e-9))
        k = fewest
        if high is not None and not _between(self.workers * k, 1, cap, low, high):
            others = itertools.chain(range(k + 1, high // self.workers + 1), range(k - 1, 0, -1))
            k = next((j for j in others if _between(self.workers * j, 1, cap, low, high)), k)
        return _nearest(per_worker / k, self.workers * k, 1, cap, low, high), k

    def within(self, low, high):
        """Whether some global batch in ``[low, high]`` can be made now (by
        the workers, with micro-batches up to ``max_micro_batch_size`` or the
        fixed micro-batch, and any accumulation).

        Example:

        >>> import keras, keras_adapt
        >>> from keras_adapt.actuators import GlobalBatchSize
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        >>> batch = GlobalBatchSize(model, micro_batch_size=32)   # multiples of 32
        >>> batch.within(40, 60), batch.within(40, 70)
        (False, True)
        """
        b, k = self.plan(low, low, high)
        return low <= self.workers * b * k <= high

    def set(self, global_batch, low=None, high=None):
        """Moves to the global batch :meth:`plan` makes (nearest ``global_batch``
        within ``[low, high]``); returns it."""
        b, k = self.plan(global_batch, low, high)
        if self.dataset is not None and b != self.dataset.micro_batch_size:
            self.dataset.micro_batch_size = b
        if k != self.accumulation.steps:
            self.accumulation.set(k)
        return self.value


def _between(step, first, last, low, high):
    """Whether some x in ``[first, last]`` has ``low <= step * x <= high``."""
    return max(first, math.ceil(low / step)) <= (
        last if high is None else min(last, high // step))


def _nearest(wanted, step, first, last, low, high):
    """x in ``[first, last]`` nearest ``wanted`` (ties up), with ``step * x``
    in ``[low, high]`` when some x gives that."""
    x = min(max(math.floor(wanted + 0.5), first), last)
    if _between(step, first, last, low, high):
        x = min(max(x, math.ceil(low / step)), last if high is None else high // step)
    return x
