"""RankBatchSizes: a micro-batch per worker, the update still the global-batch mean."""

from keras_adapt import _hvd, _train_step
from keras_adapt.actuators._common import distributed_optimizer, retrace


class RankBatchSizes:
    """Gives every worker its own micro-batch size (to rebalance a straggler).

    Sets :attr:`keras_adapt.data.AdaptiveBatchDataset.rank_micro_batch_sizes`
    (each step's global block is sliced by rank, so the workers' batches are
    disjoint and together the global batch) and turns on the optimizer's
    :class:`~keras_adapt.optimizer.BatchWeighting`, so that the update is
    the mean gradient of the global batch, sum_i b_i g_i / B, and the
    gradient statistics stay unbiased. The weighting is traced into the
    update when this actuator is made (a train function traced before is
    dropped); nothing changes for models without one.

    Every worker must call :meth:`set` with the same sizes at the same step
    (policies decide from allgathered measurements, e.g.
    ``StragglerPolicy(action="rebalance")``).

    Args:
        model: a model compiled with ``keras_adapt.DistributedOptimizer``
            (gradient statistics on, the default: the weighting reads each
            step's batch size recorded from the data).
        dataset: the :class:`keras_adapt.data.AdaptiveBatchDataset` that
            feeds ``fit``.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.actuators import RankBatchSizes
    >>> from keras_adapt.data import AdaptiveBatchDataset
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> ds = AdaptiveBatchDataset(np.ones((64, 4)), np.ones((64, 1)), micro_batch_size=8)
    >>> batches = RankBatchSizes(model, ds)
    >>> batches.sizes, batches.set([8])   # one worker: its batch is the global batch
    ([8], [8])
    """

    def __init__(self, model, dataset):
        optimizer = distributed_optimizer(model, "RankBatchSizes")
        stats = optimizer.gradient_statistics
        if stats is None or stats.fixed_batch_size is not None:
            raise ValueError(
                "RankBatchSizes weights each worker's gradient by the batch it really "
                "had, recorded from the data by the gradient statistics; create the "
                "optimizer with gradient_stats=True (the default) and without batch_size=")
        if not hasattr(dataset, "rank_micro_batch_sizes"):
            raise TypeError(
                f"dataset must be a keras_adapt.data.AdaptiveBatchDataset (its workers' "
                f"micro-batches can differ), got {type(dataset).__name__}; wrap the arrays "
                "in AdaptiveBatchDataset(x, y, micro_batch_size=...) and fit on its .dataset")
        if dataset.num_workers != _hvd.size():
            raise ValueError(
                f"the dataset is sharded for {dataset.num_workers} workers but the job has "
                f"{_hvd.size()}; make it with the default num_workers and rank")
        self.dataset = dataset
        self.weighting = optimizer.adapt_state.batch_weighting
        _train_step.record_batch_size(model, stats)
        if self.weighting.enable():
            retrace(model, "RankBatchSizes")  # a train function traced before has no weighting
        self.weighting.set_reference(sum(self.sizes) / len(self.sizes))

    @property
    def sizes(self):
        """Every worker's micro-batch, by rank."""
        return self.dataset.rank_micro_batch_sizes

    @property
    def global_batch(self):
        """The sum of the workers' micro-batches."""
        return sum(self.sizes)

    def set(self, sizes):
        """Gives rank r the micro-batch ``sizes[r]`` from the next step on
        (positive ints, one per worker); returns the sizes."""
        self.dataset.rank_micro_batch_sizes = sizes
        self.weighting.set_reference(sum(self.sizes) / len(self.sizes))
        return self.sizes
