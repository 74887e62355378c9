"""``optimizer.adapt_state``: what keras-adapt adds to a wrapped optimizer.

Actuators, policies and callbacks read and set these public objects; they
never reach into the optimizer itself.
"""

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.monitors.worker_timing import CollectiveTiming
from keras_adapt.optimizer.batch_weighting import BatchWeighting
from keras_adapt.optimizer.compression_switch import CompressionSwitch


class AdaptState:
    """What keras-adapt adds to a wrapped optimizer: ``optimizer.adapt_state``.

    A plain holder, deliberately not a ``tf.Module``, so keras-adapt's
    variables stay out of the optimizer's own checkpoint and variable lists.

    Attributes:
        statistics: the :class:`~keras_adapt.monitors.GradientStatistics`, or
            None when the optimizer was created with ``gradient_stats=False``.
        skip_nonfinite: whether non-finite averaged gradients skip the update.
        skipped: ``tf.Variable`` counting updates skipped for that reason.
        updates: ``tf.Variable`` counting completed optimizer updates
            (applied or skipped): the index the statistics' ``stats_interval``
            is counted on. Unlike ``optimizer.iterations`` it never counts
            micro-steps (``backward_passes_per_step``).
        accumulation: an :class:`AccumulationState` once
            :func:`enable_accumulation` ran, else None.
        lr_control: a :class:`LearningRateControl` once
            :func:`enable_lr_control` ran, else None.
        batch_size_actuator: the ``GlobalBatchSize`` that every policy on
            this model shares, once one was made, else None.
        reduction: the :class:`keras_adapt._hvd.Reduction` (op, compression,
            predivide factor, process set) the gradients are combined with.
        worker_local: the :class:`WorkerLocalVariables` whose gradients stay
            on each worker (``register_local_var``, ``local_layers``).
        previous: one worker only: the :class:`PreviousGradient` that the
            next measured update is paired with (made on first use), else None.
        sync: the :class:`~keras_adapt.sync.SyncState`: the synchronisation
            strategy in use and its parameters (``sync.set(...)`` switches).
        timing: the :class:`~keras_adapt.monitors.worker_timing.CollectiveTiming`
            that times the update's collectives once ``WorkerTimingMonitor``
            enabled it (the same object as ``reduction.timing``).
        batch_weighting: the :class:`~keras_adapt.optimizer.BatchWeighting`
            that makes the update the global-batch mean gradient when the
            workers' micro-batches differ, once ``RankBatchSizes`` enabled it.
        compression: the :class:`~keras_adapt.optimizer.CompressionSwitch`
            that sends the gradients as float32 or float16, switched without
            a new trace once ``CommunicationPolicy`` enabled it (the same
            object as ``reduction.switch``).

    Example:

    >>> import keras, keras_adapt
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> state = opt.adapt_state
    >>> state.statistics is opt.gradient_statistics, state.accumulation, int(state.skipped.numpy())
    (True, None, 0)
    """

    def __init__(self, stats, skip_nonfinite, reduction=None, worker_local=None, sync=None):
        self.statistics = stats
        self.skip_nonfinite = skip_nonfinite
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_updates")
        self.accumulation = None
        self.lr_control = None
        self.batch_size_actuator = None
        self.reduction = reduction if reduction is not None else _hvd.Reduction()
        self.worker_local = worker_local if worker_local is not None else WorkerLocalVariables()
        self.previous = None
        if sync is None:
            from keras_adapt.sync import SyncState

            sync = SyncState(None)
        self.sync = sync
        self.timing = CollectiveTiming()
        self.reduction.timing = self.timing
        self.batch_weighting = BatchWeighting()
        self.compression = CompressionSwitch()
        if self.reduction.sends_fp16:
            self.compression.set("fp16")
        self.reduction.switch = self.compression


    def checkpoint_variables(self):
        """keras-adapt's variables that a restarted run needs to continue as
        this one would, by a stable name: the statistics, the skip and update
        counts, the accumulation steps and count, the learning-rate factor
        and progress, and the synchronisation strategy's index, count and
        parameters. Left out: what is made at the first trace (accumulated
        gradients, the one-worker previous gradient, the strategies' extra
        models), the collectives' timing and the compression in use (its
        switch may be enabled after this list is taken: the callers save
        :meth:`CompressionSwitch.get_state` beside it). Take it at an update boundary
        (no micro-step accumulated), where the accumulators are zero.

        Example:

        >>> import keras, keras_adapt
        >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
        >>> names = opt.adapt_state.checkpoint_variables()
        >>> "statistics_averages" in names, "sync_index" in names, "lr_control_target" in names
        (True, True, False)
        """
        out = {"skipped": self.skipped, "updates": self.updates}
        stats = self.statistics
        if stats is not None:
            for name in ("batch_size", "interval", "averages"):
                out[f"statistics_{name}"] = getattr(stats, name)
        if self.accumulation is not None:
            acc = self.accumulation
            for name in ("steps", "count", "local_sqr", "inv_batch", "samples"):
                out[f"accumulation_{name}"] = getattr(acc, name)
        if self.lr_control is not None:
            for name in ("start", "target", "begin", "ramp", "gain", "progress"):
                out[f"lr_control_{name}"] = getattr(self.lr_control, name)
        sync = self.sync
        out.update(sync_index=sync.index, sync_count=sync.count,
                   sync_measure_ready=sync.measure_ready, sync_measure_waiting=sync.measure_waiting)
        for name, variable in sync.variables.items():
            out[f"sync_{name}"] = variable
        return out


def variable_key(variable):
    """Identity keys of a variable: the object itself and, for a Keras 3
    variable, the ``tf.Variable`` it holds (either may be registered).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.optimizer import variable_key
    >>> v = tf.Variable(1.0)
    >>> variable_key(v) == {id(v)}
    True
    """
    keys = {id(variable)}
    inner = getattr(variable, "value", None)
    if isinstance(inner, tf.Variable):
        keys.add(id(inner))
    return keys


class WorkerLocalVariables:
    """Variables whose gradients are not combined across workers
    (``optimizer.adapt_state.worker_local``).

    Horovod's semantics: such a gradient is applied on its own worker, divided
    by the number of workers when ``scale`` is True (Horovod's
    ``scale_local_gradients``), and it is left out of the gradient
    statistics (which describe the gradient the workers share). Layers are
    resolved when the train step is traced, so layers built lazily work too.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.optimizer import WorkerLocalVariables
    >>> local = WorkerLocalVariables()
    >>> v, w = tf.Variable(1.0), tf.Variable(2.0)
    >>> local.add(v)
    >>> local.contains(v), local.contains(w)
    (True, False)
    """

    def __init__(self, scale=True):
        self.scale = scale
        self._keys = set()
        self._layers = []

    def add(self, variable):
        """Marks ``variable`` as worker-local."""
        if not hasattr(variable, "assign"):
            raise TypeError(
                f"register_local_var needs a variable (tf.Variable or Keras variable), "
                f"got {type(variable).__name__}: {variable!r}"
            )
        self._keys |= variable_key(variable)

    def add_layers(self, layers):
        """Marks every trainable weight of ``layers`` (now or once built) as worker-local."""
        self._layers.extend(layers)

    def contains(self, variable):
        """True if ``variable`` is worker-local."""
        keys = set(self._keys)
        for layer in self._layers:
            for w in layer.trainable_weights:
                keys |= variable_key(w)
        return bool(variable_key(variable) & keys)

    def __bool__(self):
        return bool(self._keys or self._layers)
