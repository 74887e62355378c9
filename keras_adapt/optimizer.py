"""``DistributedOptimizer``: Horovod gradient averaging plus in-graph gradient statistics.

A framework-neutral core (:class:`_DistributedCore`) does the work; two thin
bindings hook it into the method that ``model.fit`` calls on each stack:
``apply`` on Keras 3 (so it also works under Keras 3's ``LossScaleOptimizer``)
and ``apply_gradients`` on tf.keras 2.

Per optimizer step, inside the compiled train function:

1. local squared norm |g_i|^2 of this worker's gradient (one fused op);
2. one grouped allreduce that averages the gradients *and* that scalar;
3. squared norm of the averaged gradient |g|^2 (the same op);
4. the estimates of |G|^2 and tr(Sigma) folded into bias-corrected EMAs;
5. the optimizer update, skipped (and counted) if the averaged gradient is
   not finite -- on every rank alike, since the check reads allreduced values.

With one worker there is only one gradient per step; the statistics then use
the difference of consecutive steps' gradients (biased while the weights move
between the two steps; ``gradient_statistics.biased`` is True).
"""

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt import _keras
from keras_adapt import ops
from keras_adapt.monitors.gradient_stats import GradientStatistics


class _AdaptState:
    """Plain holder, deliberately not a ``tf.Module``: keeps keras-adapt's
    variables out of the optimizer's own checkpoint and variable lists."""

    def __init__(self, stats, skip_nonfinite):
        self.stats = stats
        self.skip_nonfinite = skip_nonfinite
        self.prev_grads = None  # one-worker differencing, created on first use
        self.prev_sqr = None
        self.have_prev = None
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")


def _check_not_xla():
    """Raises a clear error when traced inside an XLA cluster (jit_compile=True).

    Horovod's collectives and keras-adapt's op have no XLA kernels; without
    this check the user gets a long XLA compilation error instead.
    """
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # internal module moved: let XLA report it
        return
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            "keras_adapt.DistributedOptimizer cannot run inside an XLA-compiled "
            "train step (jit_compile=True): Horovod's collectives and keras-adapt's "
            "ops have no XLA kernels. Compile the model with jit_compile=False "
            "(on Keras 3, jit_compile='auto' enables XLA when a GPU is present)."
        )


def _dense(g):
    # Sparse gradients (embeddings) are averaged densely, like Horovod's
    # sparse_as_dense=True: one fused collective instead of an allgather.
    if isinstance(g, tf.IndexedSlices):
        return tf.convert_to_tensor(g)
    return g


class _DistributedCore:
    """Framework-neutral implementation shared by the Keras 3 and Keras 2 bindings."""

    @property
    def gradient_statistics(self):
        """The :class:`GradientStatistics` of this optimizer, or None if monitoring is off."""
        return self._keras_adapt.stats

    @property
    def skipped_steps(self):
        """Variable counting optimizer steps skipped for a non-finite averaged gradient."""
        return self._keras_adapt.skipped

    def _ka_single_worker_total(self, grads, local_sqr):
        """One worker: mean squared norm and squared norm of the mean over
        this step's and the previous step's gradient (M = 2)."""
        state = self._keras_adapt
        if state.prev_grads is None:
            with tf.init_scope():
                state.prev_grads = [
                    tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False, name="prev_grad")
                    for g in grads
                ]
                state.prev_sqr = tf.Variable(0.0, trainable=False, name="prev_sqr")
                state.have_prev = tf.Variable(False, trainable=False, name="have_prev")
        _, sum_sqr = ops.squared_norms([g + p for g, p in zip(grads, state.prev_grads)])
        pair_local = 0.5 * (local_sqr + state.prev_sqr)
        pair_total = 0.25 * sum_sqr
        valid = tf.identity(state.have_prev)
        with tf.control_dependencies([pair_local, pair_total, valid]):
            finite = tf.math.is_finite(local_sqr)

            def remember():
                for p, g in zip(state.prev_grads, grads):
                    p.assign(g)
                state.prev_sqr.assign(local_sqr)
                state.have_prev.assign(True)
                return tf.constant(True)

            stored = tf.cond(finite, remember, lambda: tf.constant(False))
        return pair_local, pair_total, valid, stored

    def _ka_distributed_apply(self, grads, variables, apply_fn):
        """Averages ``grads`` across workers, updates the statistics, then
        calls ``apply_fn(averaged_grads)`` (possibly skipped if non-finite)."""
        _check_not_xla()
        state = self._keras_adapt
        grads = [_dense(g) for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        local = [grads[i] for i in present]
        num_workers = _hvd.size()

        def with_averaged(reduced):
            out = list(grads)
            for i, r in zip(present, reduced):
                out[i] = r
            return out

        if state.stats is None or not local:
            return apply_fn(with_averaged(_hvd.grouped_allreduce_average(local)))

        _, local_sqr = ops.squared_norms(local)
        reduced = _hvd.grouped_allreduce_average(local + [local_sqr])
        mean_local_sqr, reduced = reduced[-1], reduced[:-1]
        if num_workers >= 2:
            _, total_sqr = ops.squared_norms(reduced)
            used = state.stats.update(mean_local_sqr, total_sqr, num_gradients=num_workers)
            deps = [used]
        else:
            pair_local, pair_total, valid, stored = self._ka_single_worker_total(reduced, local_sqr)
            used = state.stats.update(
                pair_local, pair_total, num_gradients=2, valid=valid, batches_per_step=1
            )
            deps = [used, stored]

        averaged = with_averaged(reduced)
        if not state.skip_nonfinite:
            with tf.control_dependencies(deps):
                return apply_fn(averaged)

        # The allreduced mean of |g_i|^2 is identical on every rank, so every
        # rank takes the same branch.
        finite = tf.math.is_finite(mean_local_sqr)

        def apply_branch():
            apply_fn(averaged)
            return tf.constant(True)

        def skip_branch():
            state.skipped.assign_add(1)
            return tf.constant(False)

        with tf.control_dependencies(deps):
            return tf.cond(finite, apply_branch, skip_branch)


class _Keras3Binding(_DistributedCore):
    """Keras 3: ``fit`` -> ``apply_gradients`` -> ``apply``; LossScaleOptimizer -> ``apply``."""

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            variables = None
        else:
            variables = list(trainable_variables)
            if not self.built:
                # Build before any branch: optimizer slots must not be
                # created inside tf.cond, and never with a collective.
                with tf.name_scope(self.name):
                    self.build(variables)
                self.built = True
        parent_apply = super().apply
        self._ka_distributed_apply(grads, variables, lambda g: parent_apply(g, variables))


class _Keras2Binding(_DistributedCore):
    """tf.keras 2: ``minimize`` -> ``apply_gradients``."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        with tf.init_scope():
            # Create slots now, outside the tf.cond that may skip the step.
            if hasattr(self, "_create_all_weights"):  # legacy OptimizerV2
                self._create_all_weights(variables)
            else:
                self.build(variables)
        parent = super().apply_gradients
        self._ka_distributed_apply(
            grads, variables, lambda g: parent(list(zip(g, variables)), *args, **kwargs)
        )
        return self.iterations


def _validate(optimizer, gradient_stats, skip_nonfinite):
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
    if isinstance(optimizer, _DistributedCore):
        raise ValueError(
            "optimizer is already a keras_adapt.DistributedOptimizer; wrap the "
            "plain Keras optimizer only once"
        )
    for name, value in (("gradient_stats", gradient_stats), ("skip_nonfinite", skip_nonfinite)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    return optimizer


def DistributedOptimizer(  # noqa: N802 - a factory named like the class it returns, as in Horovod
    optimizer,
    gradient_stats=True,
    ema_decay=0.99,
    batch_size=None,
    skip_nonfinite=True,
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
        ema_decay: decay of the statistics' moving averages, in (0, 1).
        batch_size: per-worker batch size b, if fixed. By default
            ``GradientStatsMonitor`` records it from the data every step.
        skip_nonfinite: skip the update (on all ranks alike) when the averaged
            gradient contains NaN or Inf, and count it in ``skipped_steps``.

    Returns:
        An optimizer of the same class as ``optimizer``, with the extra
        attributes ``gradient_statistics`` and ``skipped_steps``.

    Example:

    >>> import keras
    >>> import keras_adapt
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=opt, loss="mse")
    >>> type(opt).__name__, opt.gradient_statistics is not None
    ('SGD', True)
    """
    optimizer = _validate(optimizer, gradient_stats, skip_nonfinite)
    stats = GradientStatistics(ema_decay=ema_decay, batch_size=batch_size) if gradient_stats else None
    _hvd.ensure_initialized()

    base = type(optimizer)
    binding = _Keras3Binding if _keras.IS_KERAS3 else _Keras2Binding
    # Same name and module as the wrapped class: a saved model then records a
    # plain optimizer, which loads anywhere (re-wrap it for distributed use).
    cls = type(base.__name__, (binding, base), {"__module__": base.__module__})
    cls.__qualname__ = base.__qualname__
    distributed = cls.from_config(optimizer.get_config())
    distributed._keras_adapt = _AdaptState(stats, skip_nonfinite)
    return distributed


def is_distributed(optimizer):
    """True if ``optimizer`` came from :func:`DistributedOptimizer`.

    Example:

    >>> import keras, keras_adapt
    >>> keras_adapt.optimizer.is_distributed(keras.optimizers.SGD())
    False
    """
    return isinstance(optimizer, _DistributedCore)
