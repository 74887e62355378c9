"""``DistributedOptimizer``: wraps a Keras optimizer for Horovod and keras-adapt."""

from keras_adapt import _hvd
from keras_adapt import _keras
from keras_adapt.optimizer._bindings import distributed_class
from keras_adapt.optimizer._step import DistributedCore
from keras_adapt.optimizer.settings import AdaptSettings


def _keras_optimizer(optimizer):
    """``optimizer`` as a plain Keras optimizer instance, or a clear error."""
    if isinstance(optimizer, str):
        import keras

        try:
            optimizer = keras.optimizers.get(optimizer)
        except ValueError as exc:
            raise ValueError(
                f"optimizer={optimizer!r} is not a known Keras optimizer name; pass "
                "an optimizer instance such as keras.optimizers.SGD(0.01) or a "
                "name such as 'sgd' or 'adam'"
            ) from exc
    if not isinstance(optimizer, _keras.optimizer_classes()):
        raise TypeError(
            f"optimizer must be a Keras optimizer instance (keras.optimizers.Optimizer"
            f"{'' if _keras.IS_KERAS3 else ' or keras.optimizers.legacy.Optimizer'}) "
            f"or its name; got {type(optimizer).__name__}: {optimizer!r}"
        )
    if isinstance(optimizer, DistributedCore):
        raise ValueError(
            "optimizer is already a keras_adapt.DistributedOptimizer; wrap the "
            "plain Keras optimizer only once"
        )
    return optimizer


def DistributedOptimizer(  # noqa: N802 - a factory named like the class it returns, as in Horovod
    optimizer,
    gradient_stats=AdaptSettings.gradient_stats,
    ema_decay=AdaptSettings.ema_decay,
    batch_size=AdaptSettings.batch_size,
    skip_nonfinite=AdaptSettings.skip_nonfinite,
    stats_interval=AdaptSettings.stats_interval,
    *,
    sparse_as_dense=AdaptSettings.sparse_as_dense,
    backward_passes_per_step=AdaptSettings.backward_passes_per_step,
    average_aggregated_gradients=AdaptSettings.average_aggregated_gradients,
    compression=AdaptSettings.compression,
    op=AdaptSettings.op,
    gradient_predivide_factor=AdaptSettings.gradient_predivide_factor,
    process_set=AdaptSettings.process_set,
    scale_local_gradients=AdaptSettings.scale_local_gradients,
    local_layers=AdaptSettings.local_layers,
    sync_strategy=AdaptSettings.sync_strategy,
):
    """Wraps a Keras optimizer to average gradients over Horovod workers and
    measure gradient statistics in the same step.

    Works on Keras 3 (where ``horovod.tensorflow.keras`` no longer runs) and
    on tf.keras 2.15, with the compiled ``model.fit`` train function. Only
    Horovod's core collectives are used: one grouped allreduce per step
    carries the gradients and the monitoring scalar together.

    Args:
        optimizer: a Keras optimizer instance (or a name such as ``"adam"``).
            A new optimizer of the same class and config is returned; the
            argument itself is not modified.
        gradient_stats: measure |G|^2, tr(Sigma), the gradient noise scale and
            the SNR each step (see :class:`keras_adapt.monitors.GradientStatistics`).
            ``False`` makes the wrapper a plain allreduce and also disables
            skipping of non-finite steps.
        ema_decay: decay of the statistics' moving averages per optimizer
            update, in (0, 1) (0.99: about the last 100 updates).
        batch_size: per-worker batch size b, if fixed. By default
            ``GradientStatsMonitor`` records it from the data every step.
        skip_nonfinite: ``True`` skips the update (on all ranks alike) when
            the averaged gradient contains NaN or Inf, and counts it in
            ``skipped_steps``. It costs one pass over the local gradient on
            every update (about 4% of a small model's step, measured in
            docs/results/monitor_overhead.md). ``False`` (the default) applies
            such an update, as Horovod does. Measurements are checked either
            way: a non-finite one never enters the statistics and is counted.
        stats_interval: measure the statistics on one update in this many
            (updates 0, N, 2N, ...), inside the graph; the other updates
            reduce the gradients alone, as plain Horovod does.
            ``gradient_statistics.set_interval(n)`` changes it without
            retracing. The moving averages (``ema_decay``) and the policies'
            ``warmup_updates`` count optimizer updates, so N changes the cost
            and the number of measurements behind the estimates, not when
            policies decide. Measured costs of the default, 10, and of 1 are
            in docs/gradient_statistics.md (``benchmarks/monitor_overhead.py``).

    Horovod's arguments, with Horovod's defaults and meaning (see
    docs/horovod.md):

    Args:
        sparse_as_dense: send ``tf.IndexedSlices`` gradients (embeddings)
            densely in the grouped allreduce. ``False`` (Horovod's default)
            allgathers their rows and indices instead (extra collectives).
        backward_passes_per_step: k > 1 accumulates k micro-batches' gradients
            before one allreduce and update (the in-graph accumulation of
            :class:`keras_adapt.actuators.GradientAccumulation`, whose k
            policies may change later); as in Horovod ``iterations`` counts
            every backward pass.
        average_aggregated_gradients: with k > 1, apply the mean of the k
            gradients (``True``) or their sum (``False``, Horovod's default).
        compression: ``horovod.tensorflow.Compression.none`` or ``.fp16``.
        op: ``horovod.tensorflow.Average`` (default) or ``Sum``.
        gradient_predivide_factor: with ``op=Average``, scale by 1/f before
            the sum and f/size after it.
        process_set: a ``horovod.tensorflow.ProcessSet`` to reduce over.
        scale_local_gradients: divide worker-local gradients by the number
            of workers (Horovod's default) -- see :meth:`register_local_var`.
        local_layers: layers whose trainable weights are worker-local
            (Horovod's ``PartialDistributedOptimizer``).

    Synchronisation (see docs/sync_strategies.md):

    Args:
        sync_strategy: how the workers' models agree: None (the default,
            :class:`keras_adapt.sync.AllReduceSGD`, averaged gradients), a
            :mod:`keras_adapt.sync` strategy or its name, or a list of them:
            the strategies ``optimizer.adapt_state.sync.set(...)`` may switch
            between at run time without retracing (the first is used from
            the start). Their state is made at the first trace, so a
            strategy must be declared here to be usable later.

    Returns:
        An optimizer of the same class as ``optimizer``, with the extra
        attributes ``gradient_statistics``, ``skipped_steps``,
        ``adapt_state`` and ``adapt_settings`` (the arguments above, checked,
        as one frozen :class:`~keras_adapt.optimizer.AdaptSettings`, whose
        fields hold these defaults). ``skipped_steps`` counts the updates
        skipped for a non-finite averaged gradient; ``adapt_state`` (an
        :class:`~keras_adapt.optimizer.AdaptState`) is the public object
        through which actuators, policies and your own callbacks reach what
        keras-adapt keeps for this optimizer.

    Raises:
        TypeError: ``optimizer`` is not a Keras optimizer or its name.
        ValueError: an unknown optimizer name, an optimizer that is already
            distributed (wrap once), or a bad setting (``ema_decay`` outside
            (0, 1), a non-positive ``batch_size`` or ``stats_interval``, ...),
            each naming the value and what is accepted.

    The settings belong to the returned optimizer's class:
    ``type(opt).from_config(opt.get_config())`` (what ``keras.models.clone_model``
    and Keras' saving do) gives a complete distributed optimizer with the same
    settings and a fresh state; ``get_config()`` itself is the plain
    optimizer's. On Keras 3 the update hooks ``Optimizer.apply`` (so it also
    works as the inner optimizer of ``LossScaleOptimizer``); on tf.keras 2 it
    hooks ``apply_gradients`` (new and ``keras.optimizers.legacy``
    optimizers). A model saved with it records the plain optimizer class, so
    it loads anywhere; re-wrap after loading (or use
    :func:`keras_adapt.load_model`).

    The learning rate is the same on both stacks: whatever sets it
    (``opt.learning_rate = x``, ``assign``, Keras' ``LearningRateScheduler``
    and ``ReduceLROnPlateau``, keras-adapt's warm-up and schedule callbacks)
    sets the base rate, and reading ``opt.learning_rate`` gives the base rate;
    each update applies base x keras-adapt's factor
    (:class:`~keras_adapt.actuators.LearningRateScale`, the policies' scaling
    rules), the effective rate logged as ``lr`` (docs/policies.md, the
    learning-rate contract; :func:`~keras_adapt.optimizer.effective_learning_rate`).

    Example:

    >>> import keras
    >>> import keras_adapt
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=opt, loss="mse")
    >>> type(opt).__name__, opt.gradient_statistics is not None
    ('SGD', True)
    """
    optimizer = _keras_optimizer(optimizer)
    settings = AdaptSettings(
        gradient_stats=gradient_stats, ema_decay=ema_decay, batch_size=batch_size,
        skip_nonfinite=skip_nonfinite, stats_interval=stats_interval,
        sparse_as_dense=sparse_as_dense, backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, compression=compression,
        op=op, gradient_predivide_factor=gradient_predivide_factor, process_set=process_set,
        scale_local_gradients=scale_local_gradients, local_layers=local_layers,
        sync_strategy=sync_strategy)
    _hvd.ensure_initialized()
    return distributed_class(type(optimizer), settings).from_config(optimizer.get_config())


def distributed_class_like(base, optimizer):
    """The distributed class for the Keras optimizer class ``base`` with the
    keras-adapt settings of the distributed ``optimizer``.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import distributed_class_like
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), gradient_stats=False)
    >>> adam = distributed_class_like(keras.optimizers.Adam, opt).from_config(keras.optimizers.Adam().get_config())
    >>> type(adam).__name__, adam.gradient_statistics is None
    ('Adam', True)
    """
    if not is_distributed(optimizer):
        raise ValueError(f"optimizer must come from DistributedOptimizer, got {type(optimizer).__name__}")
    return distributed_class(base, type(optimizer).adapt_settings)


def is_distributed(optimizer):
    """True if ``optimizer`` came from :func:`DistributedOptimizer`.

    Example:

    >>> import keras, keras_adapt
    >>> keras_adapt.optimizer.is_distributed(keras.optimizers.SGD())
    False
    """
    return isinstance(optimizer, DistributedCore)


def require_distributed(model, who, statistics=False):
    """``model``'s keras-adapt optimizer, or a clear error naming the fix.

    With ``statistics=True`` the optimizer must also measure gradient
    statistics. Used by every callback and actuator that needs one.

    Example:

    >>> import keras, keras_adapt
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> keras_adapt.optimizer.require_distributed(model, "demo") is model.optimizer
    True
    """
    optimizer = getattr(model, "optimizer", None)
    if is_distributed(getattr(optimizer, "inner_optimizer", None)):
        raise ValueError(
            f"{who} does not support mixed precision yet: Keras wrapped the keras-adapt "
            f"optimizer in its {type(optimizer).__name__}, whose updates keras-adapt cannot "
            "follow; train with keras.mixed_precision.set_global_policy('float32')"
        )
    if optimizer is None or not is_distributed(optimizer):
        raise ValueError(
            f"{who} needs a model compiled with keras_adapt.DistributedOptimizer(...); "
            f"got optimizer {type(optimizer).__name__ if optimizer is not None else None}. "
            "Compile with optimizer=keras_adapt.DistributedOptimizer(your_optimizer)."
        )
    if statistics and optimizer.gradient_statistics is None:
        raise ValueError(
            f"{who} reads the gradient statistics, but the optimizer was created "
            "with gradient_stats=False; use keras_adapt.DistributedOptimizer(opt, "
            "gradient_stats=True)"
        )
    return optimizer
