"""``DistributedOptimizer``: Horovod gradient averaging plus in-graph gradient statistics.

A framework-neutral core (:class:`_DistributedCore`) does the work; two thin
bindings hook it into the method that ``model.fit`` calls on each stack:
``apply`` on Keras 3 (so it also works under Keras 3's ``LossScaleOptimizer``)
and ``apply_gradients`` on tf.keras 2.

Per optimizer update, inside the compiled train function:

1. local squared norm |g_i|^2 of this worker's gradient (one fused op; also
   the non-finite check);
2. one grouped allreduce that averages the gradients *and* this worker's
   measurement (|g_i|^2, 1/b_i, b_i: one 3-element tensor, on every update);
3. on a measured update (one in ``stats_interval``, a branch every rank takes
   alike): squared norm of the averaged gradient |g|^2 (the same op) and the
   estimates of |G|^2 and tr(Sigma) folded into bias-corrected EMAs;
4. the optimizer update, skipped (and counted) if the averaged gradient is
   not finite -- on every rank alike, since the check reads allreduced values.

With one worker there is only one gradient per update; a measured update is
then paired with the previous update's gradient (biased while the weights
move between the two updates; unbiased for unequal batch sizes).
"""

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt import _keras
from keras_adapt import ops
from keras_adapt.monitors.gradient_stats import GradientStatistics

#: Default ``stats_interval``: the statistics are measured on one update in this many.
DEFAULT_STATS_INTERVAL = 10


class AdaptState:
    """What keras-adapt adds to a wrapped optimizer: ``optimizer.adapt_state``.

    A plain holder, deliberately not a ``tf.Module``, so keras-adapt's
    variables stay out of the optimizer's own checkpoint and variable lists.
    Actuators, policies and callbacks read and set these attributes; they
    never reach into the optimizer itself.

    Attributes:
        statistics: the :class:`GradientStatistics`, or None when the
            optimizer was created with ``gradient_stats=False``.
        skip_nonfinite: whether non-finite averaged gradients skip the update.
        skipped: ``tf.Variable`` counting updates skipped for that reason.
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

    Example:

    >>> import keras, keras_adapt
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> state = opt.adapt_state
    >>> state.statistics is opt.gradient_statistics, state.accumulation, int(state.skipped.numpy())
    (True, None, 0)
    """

    def __init__(self, stats, skip_nonfinite):
        self.statistics = stats
        self.skip_nonfinite = skip_nonfinite
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.accumulation = None
        self.lr_control = None
        self.batch_size_actuator = None
        self.reduction = _hvd.Reduction()
        self.worker_local = WorkerLocalVariables()
        # One worker: the previous update's gradient, created on first use.
        self.previous = None


class _PreviousGradient:
    """One worker's copy of the gradient of the update before a measured one."""

    def __init__(self, grads):
        with tf.init_scope():
            def var(value, dtype, name):
                return tf.Variable(value, dtype=dtype, trainable=False, name=name)

            self.grads = [var(tf.zeros(g.shape, g.dtype), g.dtype, "prev_grad") for g in grads]
            self.sqr = var(0.0, tf.float32, "prev_sqr")
            self.inv_batch = var(0.0, tf.float32, "prev_inv_batch")
            self.update_index = var(-1, tf.int64, "prev_update_index")
            self.stored = var(False, tf.bool, "prev_stored")


def variable_key(variable):
    """Identity keys of a variable: the object itself and, for a Keras 3
    variable, the ``tf.Variable`` it holds (either may be registered)."""
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


class AccumulationState:
    """Gradient accumulation state (``optimizer.adapt_state.accumulation``). ``steps`` (k) is a variable, so changing
    it never retraces the train function; the accumulators are created on
    the first trace. ``average``: the update uses the mean of the k
    micro-gradients (else their sum, Horovod's
    ``average_aggregated_gradients=False``); ``count_micro_steps``:
    ``optimizer.iterations`` advances on every micro-step (Horovod's
    ``backward_passes_per_step``) instead of once per update."""

    def __init__(self, steps, average=True, count_micro_steps=False):
        self.average = average
        self.count_micro_steps = count_micro_steps
        with tf.init_scope():
            self.steps = tf.Variable(steps, dtype=tf.int64, trainable=False, name="accumulation_steps")
            self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="accumulated")
            self.local_sqr = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="accumulated_sqr")
            # sum over the micro-steps of 1/b and of b (the gradient statistics)
            self.inv_batch = tf.Variable(0.0, dtype=tf.float32, trainable=False,
                                         name="accumulated_inv_batch")
            self.samples = tf.Variable(0.0, dtype=tf.float32, trainable=False,
                                       name="accumulated_samples")
        # Host copy of k, kept by GradientAccumulation.set: callbacks read it
        # every step, and a variable read there would cost a device round trip.
        self.steps_value = int(steps)
        self.grads = None


class LearningRateControl:
    """``optimizer.adapt_state.lr_control``: learning-rate factor on top of the user's learning rate (float or
    schedule): ``factor`` ramps linearly from ``start`` to ``target`` over
    ``ramp`` updates beginning at update ``begin``. With ``use_progress`` a
    schedule is evaluated at the scale-invariant progress (AdaScale), which
    advances by ``gain`` per update, instead of at the update count."""

    def __init__(self, use_progress):
        self.use_progress = use_progress
        with tf.init_scope():
            def var(value, dtype, name):
                return tf.Variable(value, dtype=dtype, trainable=False, name=name)

            self.start = var(1.0, tf.float32, "lr_factor_start")
            self.target = var(1.0, tf.float32, "lr_factor_target")
            self.begin = var(0, tf.int64, "lr_ramp_begin")
            self.ramp = var(0, tf.int64, "lr_ramp_steps")
            self.gain = var(1.0, tf.float64, "progress_gain")
            self.progress = var(0.0, tf.float64, "progress")

    def factor_at(self, iterations):
        """The factor at update ``iterations`` (works in-graph and eagerly)."""
        it = tf.cast(iterations, tf.float32)
        begin = tf.cast(self.begin, tf.float32)
        ramp = tf.cast(self.ramp, tf.float32)
        frac = tf.where(ramp > 0, tf.clip_by_value((it - begin) / tf.maximum(ramp, 1.0), 0.0, 1.0),
                        tf.cast(it >= begin, tf.float32))
        return self.start + (self.target - self.start) * frac


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
    # sparse_as_dense=True (and accumulation): sparse gradients (embeddings)
    # travel densely, in the one fused collective instead of an allgather.
    if isinstance(g, tf.IndexedSlices):
        return tf.convert_to_tensor(g)
    return g


def _mean_view(reduced, reduction, num_workers):
    """The averaged gradient, dense, for the statistics: ``reduced`` itself
    in the default case (average, dense), else densified and / or divided
    by the number of workers (``op=Sum``)."""
    out = [_dense(r) for r in reduced]
    if reduction.is_sum:
        out = [r / tf.cast(num_workers, r.dtype) for r in out]
    return out


class _DistributedCore:
    """Framework-neutral implementation shared by the Keras 3 and Keras 2 bindings.

    The class made by :func:`DistributedOptimizer` carries its keras-adapt
    settings (``_ka_settings``), and every instance builds its
    :class:`AdaptState` from them here: a copy made with
    ``type(opt).from_config(opt.get_config())`` is a complete distributed
    optimizer with the same settings, while ``get_config()`` stays the plain
    optimizer's (a saved model loads without keras-adapt).
    """

    _ka_settings = {"gradient_stats": True, "ema_decay": 0.99, "batch_size": None,
                    "skip_nonfinite": True, "stats_interval": DEFAULT_STATS_INTERVAL,
                    "sparse_as_dense": False,
                    "backward_passes_per_step": 1, "average_aggregated_gradients": False,
                    "op": None, "compression": None, "gradient_predivide_factor": 1.0,
                    "process_set": None, "scale_local_gradients": True, "local_layers": ()}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = type(self)._ka_settings
        stats = None
        if settings["gradient_stats"]:
            stats = GradientStatistics(ema_decay=settings["ema_decay"],
                                       batch_size=settings["batch_size"],
                                       interval=settings["stats_interval"])
        self._adapt_state = AdaptState(stats, settings["skip_nonfinite"])
        self._adapt_state.reduction = _hvd.Reduction(
            settings["op"], settings["compression"], settings["gradient_predivide_factor"],
            settings["process_set"])
        self._adapt_state.worker_local = WorkerLocalVariables(settings["scale_local_gradients"])
        self._adapt_state.worker_local.add_layers(settings["local_layers"])
        if settings["backward_passes_per_step"] > 1:
            self._adapt_state.accumulation = AccumulationState(
                settings["backward_passes_per_step"],
                average=settings["average_aggregated_gradients"], count_micro_steps=True)

    def register_local_var(self, var):
        """Marks ``var`` as worker-local (Horovod's ``register_local_var``):
        its gradient is not combined across workers but applied on each
        worker, divided by the number of workers (unless the optimizer was
        made with ``scale_local_gradients=False``), and it is left out of the
        gradient statistics. Call it before the first training step (the
        train function is traced with the registered set).

        Example:

        >>> import tensorflow as tf, keras, keras_adapt
        >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
        >>> v = tf.Variable([1.0])
        >>> opt.register_local_var(v)
        >>> opt.adapt_state.worker_local.contains(v)
        True
        """
        self._adapt_state.worker_local.add(var)

    @property
    def adapt_state(self):
        """The :class:`AdaptState` keras-adapt keeps for this optimizer."""
        return self._adapt_state

    @property
    def gradient_statistics(self):
        """The :class:`GradientStatistics` of this optimizer, or None if monitoring is off."""
        return self._adapt_state.statistics

    @property
    def skipped_steps(self):
        """Variable counting optimizer steps skipped for a non-finite averaged gradient."""
        return self._adapt_state.skipped

    def _ka_schedule_step(self):
        """The step a learning-rate schedule is evaluated at: the update count,
        or AdaScale's scale-invariant progress when that is enabled."""
        control = self._adapt_state.lr_control
        if control is not None and control.use_progress:
            return tf.cast(control.progress, tf.float32)
        return self.iterations

    def _ka_scaled(self, lr):
        """``lr`` times the current factor of the learning-rate actuator."""
        control = self._adapt_state.lr_control
        if control is None:
            return lr
        lr = tf.convert_to_tensor(lr)
        return lr * tf.cast(control.factor_at(self.iterations), lr.dtype)

    def _ka_base_value(self, value):
        """Reading ``learning_rate`` gives the effective rate (base x factor),
        so setting it sets the effective rate too: callbacks such as
        ReduceLROnPlateau read, multiply and write it back, which must not
        compound the factor. Schedules and variables are set as given."""
        state = getattr(self, "_adapt_state", None)
        control = None if state is None else state.lr_control
        if control is None or callable(value) or isinstance(value, tf.Variable):
            return value
        factor = float(control.factor_at(self.iterations).numpy())
        return float(value) / factor

    def _ka_after_update(self):
        control = self._adapt_state.lr_control
        if control is not None:
            control.progress.assign_add(control.gain)

    def _ka_pair_with_previous(self, grads, local_sqr, inv_batch, update_index):
        """One worker: the measurement from this update's gradient paired with
        the previous update's (M = 2, sizes b_prev and b; unbiased for unequal
        sizes through the mean of the inverse sizes).

        Returns ``(local_sqr, total_sqr, inv_batch, valid)`` of the pair;
        ``valid`` holds when the stored gradient is the previous update's."""
        prev = self._ka_previous(grads)
        _, sum_sqr = ops.squared_norms([g + p for g, p in zip(grads, prev.grads)])
        pair_local = 0.5 * (local_sqr + prev.sqr)
        pair_total = 0.25 * sum_sqr
        pair_inv = 0.5 * (inv_batch + prev.inv_batch)
        valid = prev.stored & tf.equal(prev.update_index + 1, tf.cast(update_index, tf.int64))
        return pair_local, pair_total, pair_inv, valid

    def _ka_previous(self, grads):
        """The one-worker store of the previous update's gradient (made on first use)."""
        state = self._adapt_state
        if state.previous is None:
            state.previous = _PreviousGradient(grads)
        return state.previous

    def _ka_maybe_remember(self, grads, local_sqr, inv_batch, update_index):
        """One worker: keeps this update's gradient when the next update is
        measured (every update at stats_interval=1), for the pair."""
        prev = self._ka_previous(grads)
        stats = self._adapt_state.statistics
        wanted = stats.due(tf.cast(update_index, tf.int64) + 1) & tf.math.is_finite(local_sqr)

        def remember():
            for p, g in zip(prev.grads, grads):
                p.assign(g)
            prev.sqr.assign(local_sqr)
            prev.inv_batch.assign(inv_batch)
            prev.update_index.assign(tf.cast(update_index, tf.int64))
            prev.stored.assign(True)
            return tf.constant(True)

        return tf.cond(wanted, remember, lambda: tf.constant(False))

    def _ka_distributed_apply(self, grads, variables, apply_fn):
        """Averages ``grads`` across workers, updates the statistics, then
        calls ``apply_fn(averaged_grads)`` (possibly skipped if non-finite).
        With accumulation enabled, only every k-th call reaches the workers."""
        _check_not_xla()
        state = self._adapt_state
        if state.accumulation is not None or type(self)._ka_settings["sparse_as_dense"]:
            grads = [_dense(g) for g in grads]
        worker_local = [False] * len(grads)
        if state.worker_local and variables is not None:
            worker_local = [state.worker_local.contains(v) for v in variables]
        if state.accumulation is not None:
            return self._ka_accumulate(grads, apply_fn, worker_local)
        return self._ka_reduce_and_apply(grads, apply_fn, worker_local=worker_local)

    def _ka_accumulate(self, grads, apply_fn, worker_local):
        """Adds this micro-step's gradient to the accumulators; every k-th
        micro-step averages them over micro-steps and workers and applies.

        All ranks count alike and read the same k, so all take the same
        branch and the collective inside it matches up."""
        state = self._adapt_state
        acc = state.accumulation
        stats = state.statistics
        present = [i for i, g in enumerate(grads) if g is not None]
        if acc.grads is None:
            with tf.init_scope():
                acc.grads = [
                    tf.Variable(tf.zeros(grads[i].shape, grads[i].dtype), trainable=False,
                                name="accumulated_grad")
                    for i in present
                ]
        local = [grads[i] for i in present]
        for a, g in zip(acc.grads, local):
            a.assign_add(g)
        shared = [grads[i] for i in present if not worker_local[i]]
        if stats is not None and shared:
            # The micro-steps' squared norms, inverse sizes and sizes, for the
            # update they make up (its index does not change until it applies).
            acc.local_sqr.assign_add(self._ka_local_sqr([_dense(g) for g in shared],
                                                        tf.cast(self.iterations, tf.int64)))
            acc.inv_batch.assign_add(stats.inverse_batch_size())
            acc.samples.assign_add(tf.cast(stats.batch_size, tf.float32))
        count = acc.count.assign_add(1)

        def update():
            n = tf.cast(count, tf.float32)
            mean = list(grads)
            for i, a in zip(present, acc.grads):
                mean[i] = a / tf.cast(n, a.dtype)
            apply_update = apply_fn
            if not acc.average:
                # Horovod's average_aggregated_gradients=False: the sum.
                def apply_update(g):
                    return apply_fn([None if x is None else x * tf.cast(n, x.dtype) for x in g])
            applied = self._ka_reduce_and_apply(
                mean, apply_update, local_sqr=acc.local_sqr / n, inv_batch=acc.inv_batch / n,
                samples=acc.samples, micro_steps=count, worker_local=worker_local)
            with tf.control_dependencies([applied]):
                for a in acc.grads:
                    a.assign(tf.zeros_like(a))
                for v in (acc.local_sqr, acc.inv_batch, acc.samples):
                    v.assign(0.0)
                acc.count.assign(0)
            return tf.constant(True)

        def accumulate_only():
            if acc.count_micro_steps:
                self.iterations.assign_add(1)
            return tf.constant(False)

        # Compare with >=: a k lowered mid-accumulation applies at once.
        return tf.cond(count >= acc.steps, update, accumulate_only)

    def _ka_local_sqr(self, local, update_index):
        """This worker's squared gradient norm, where it is needed: on every
        update with skip_nonfinite (it is the non-finite check), else on
        measured updates and, for one worker, on the update before (0 on
        the others, where nothing reads it)."""
        state = self._adapt_state
        if state.skip_nonfinite:
            return ops.squared_norms(local)[1]
        stats = state.statistics
        need = stats.due(update_index)
        if _hvd.size() == 1:
            need = need | stats.due(update_index + 1)
        return tf.cond(need, lambda: ops.squared_norms(local)[1], lambda: tf.constant(0.0))

    def _ka_reduce_and_apply(self, grads, apply_fn, local_sqr=None, inv_batch=None,
                             samples=None, micro_steps=None, worker_local=None):
        """One collective for the gradients (and the monitoring scalars), the
        statistics on measured updates, then the (skippable) update.

        ``local_sqr``, ``inv_batch``, ``samples`` and ``micro_steps`` describe
        accumulated gradients: the mean over the micro-steps of their squared
        norms and of their inverse sizes, their total size, and their number.
        ``worker_local[i]``: gradient i stays on this worker (not reduced,
        not in the statistics)."""
        state = self._adapt_state
        stats = state.statistics
        if worker_local is None:
            worker_local = [False] * len(grads)
        present = [i for i, g in enumerate(grads) if g is not None and not worker_local[i]]
        local = [grads[i] for i in present]
        num_workers = state.reduction.size()

        def with_averaged(reduced):
            out = list(grads)
            for i, r in zip(present, reduced):
                out[i] = r
            if state.worker_local.scale and num_workers > 1:
                for i, g in enumerate(grads):
                    if g is not None and worker_local[i]:
                        out[i] = _scaled(g, 1.0 / num_workers)
            return out

        def apply(averaged):
            out = apply_fn(averaged)
            self._ka_after_update()
            return out

        if stats is None or not local:
            apply(with_averaged(state.reduction.allreduce(local)))
            return tf.constant(True)

        update_index = tf.cast(self.iterations, tf.int64)
        measured = stats.due(update_index)
        if local_sqr is None:
            # The local squared norm is also the non-finite check, so with
            # skip_nonfinite it is taken on every update; otherwise only on
            # measured ones (and on the update before, for one worker's pair).
            local_sqr = self._ka_local_sqr([_dense(g) for g in local], update_index)
            inv_batch = stats.inverse_batch_size()
            samples = tf.cast(stats.batch_size, tf.float32)
        # This worker's measurement rides in the gradients' grouped allreduce
        # on every update (the one collective must match on every rank).
        reduced = state.reduction.allreduce(local, [tf.stack([local_sqr, inv_batch, samples])])
        mean_local_sqr, mean_inv_batch, mean_samples = tf.unstack(reduced[-1])
        reduced = reduced[:-1]
        global_batch = tf.cast(num_workers, tf.float32) * mean_samples
        m = tf.cast(num_workers, tf.int64)
        if micro_steps is not None:
            m = m * micro_steps

        def measure():
            # Every rank takes this branch at the same update (same count, same
            # interval), and it holds no collective.
            mean = _mean_view(reduced, state.reduction, num_workers)
            _, total_sqr = ops.squared_norms(mean)
            if num_workers >= 2:
                return stats.update(mean_local_sqr, total_sqr, m, inv_batch=mean_inv_batch,
                                    global_batch=global_batch)
            # One worker: with k >= 2 micro-steps the k micro-gradients give
            # the unbiased estimate; with one gradient per update, pair it
            # with the previous update's (biased while the weights move).
            pair_local, pair_total, pair_inv, pair_valid = self._ka_pair_with_previous(
                mean, local_sqr, inv_batch, update_index)
            several = m >= 2
            return stats.update(
                tf.where(several, mean_local_sqr, pair_local),
                tf.where(several, total_sqr, pair_total),
                num_gradients=tf.where(several, m, tf.constant(2, tf.int64)),
                inv_batch=tf.where(several, mean_inv_batch, pair_inv),
                global_batch=global_batch,
                valid=several | pair_valid,
            )

        deps = [tf.cond(measured, measure, lambda: tf.constant(False))]
        if num_workers == 1:
            with tf.control_dependencies(deps):  # the pair reads before this overwrites
                deps.append(self._ka_maybe_remember(
                    _mean_view(reduced, state.reduction, num_workers), local_sqr, inv_batch,
                    update_index))

        averaged = with_averaged(reduced)
        if not state.skip_nonfinite:
            with tf.control_dependencies(deps):
                apply(averaged)
                return tf.constant(True)

        # The allreduced mean of |g_i|^2 is identical on every rank, so every
        # rank takes the same branch.
        finite = tf.math.is_finite(mean_local_sqr)

        def apply_branch():
            apply(averaged)
            return tf.constant(True)

        def skip_branch():
            state.skipped.assign_add(1)
            return tf.constant(False)

        with tf.control_dependencies(deps):
            return tf.cond(finite, apply_branch, skip_branch)


def _scaled(g, factor):
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(factor, g.values.dtype), g.indices, g.dense_shape)
    return g * tf.cast(factor, g.dtype)


def _is_schedule(lr):
    return callable(lr) and hasattr(lr, "get_config") and not isinstance(lr, tf.Variable)


class _Keras3Binding(_DistributedCore):
    """Keras 3: ``fit`` -> ``apply_gradients`` -> ``apply``; LossScaleOptimizer -> ``apply``."""

    @property
    def learning_rate(self):
        return self._get_current_learning_rate()

    @learning_rate.setter
    def learning_rate(self, value):
        super(_Keras3Binding, type(self)).learning_rate.fset(self, self._ka_base_value(value))

    def _get_current_learning_rate(self):
        state = getattr(self, "_adapt_state", None)
        control = None if state is None else state.lr_control
        if control is None:
            return super()._get_current_learning_rate()
        if control.use_progress and _is_schedule(self._learning_rate):
            lr = self._learning_rate(self._ka_schedule_step())
        else:
            lr = super()._get_current_learning_rate()
        return self._ka_scaled(lr)

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
        seen = variables
        if seen is None and self._adapt_state.worker_local:
            seen = list(self._trainable_variables)
        self._ka_distributed_apply(grads, seen, lambda g: parent_apply(g, variables))


class _Keras2Binding(_DistributedCore):
    """tf.keras 2: ``minimize`` -> ``apply_gradients``."""

    def _decayed_lr(self, var_dtype):
        # Legacy OptimizerV2 reads its learning rate through this method only.
        control = self._adapt_state.lr_control
        if control is None:
            return super()._decayed_lr(var_dtype)
        lr = self._get_hyper("learning_rate", var_dtype)
        if control.use_progress and _is_schedule(lr):
            lr = tf.cast(lr(self._ka_schedule_step()), var_dtype)
            if self._initial_decay > 0.0:
                step = tf.cast(self.iterations, var_dtype)
                lr = lr / (1.0 + tf.cast(self._initial_decay, var_dtype) * step)
        else:
            lr = super()._decayed_lr(var_dtype)
        return tf.cast(self._ka_scaled(lr), var_dtype)

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


class _Keras2LearningRate:
    """tf.keras 2 (non-legacy) optimizers read ``self.learning_rate`` in
    ``update_step``; the factor of the learning-rate actuator applies there.

    Outside the train step (in callbacks, eagerly) ``learning_rate`` stays
    the user's variable, as on legacy optimizers: tf.keras 2 callbacks such
    as ReduceLROnPlateau assign to it, and they then change the base rate
    under the factor. ``LearningRateScale.current_lr()`` gives the effective
    rate.
    """

    @property
    def learning_rate(self):
        lr = super().learning_rate
        state = getattr(self, "_adapt_state", None)
        if state is None or state.lr_control is None or tf.executing_eagerly():
            return lr
        return self._ka_scaled(lr)

    @learning_rate.setter
    def learning_rate(self, value):
        super(_Keras2LearningRate, type(self)).learning_rate.fset(self, value)

    def _compute_current_learning_rate(self):
        state = getattr(self, "_adapt_state", None)
        control = None if state is None else state.lr_control
        if control is None or not control.use_progress or not _is_schedule(self._learning_rate):
            return super()._compute_current_learning_rate()
        self._current_learning_rate.assign(
            tf.cast(self._learning_rate(self._ka_schedule_step()), self._current_learning_rate.dtype))


def enable_accumulation(optimizer, steps=1):
    """Turns on in-graph gradient accumulation; returns its state (idempotent).

    Used by :class:`keras_adapt.actuators.GradientAccumulation`; the model's
    train function must be traced (again) afterwards.
    """
    state = optimizer.adapt_state
    if state.accumulation is None:
        state.accumulation = AccumulationState(steps)
    return state.accumulation


def enable_lr_control(optimizer, use_progress=False):
    """Turns on the learning-rate factor (and optionally AdaScale progress).

    Used by :class:`keras_adapt.actuators.LearningRateScale`; the model's
    train function must be traced (again) afterwards. Returns the state.
    """
    state = optimizer.adapt_state
    if state.lr_control is None:
        state.lr_control = LearningRateControl(use_progress)
        # Progress starts where the update count is, so a schedule does not jump.
        state.lr_control.progress.assign(float(optimizer.iterations.numpy()))
    elif use_progress and not state.lr_control.use_progress:
        state.lr_control.use_progress = True
    return state.lr_control


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


def _check_horovod_arguments(sparse_as_dense, backward_passes_per_step,
                             average_aggregated_gradients, scale_local_gradients, local_layers):
    for name, value in (("sparse_as_dense", sparse_as_dense),
                        ("average_aggregated_gradients", average_aggregated_gradients),
                        ("scale_local_gradients", scale_local_gradients)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    k = backward_passes_per_step
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(
            f"backward_passes_per_step={k!r} is not valid; use a positive int "
            "(1: reduce and apply every step)"
        )
    if local_layers is None:
        return ()
    import keras

    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    local_layers = tuple(local_layers)
    for layer in local_layers:
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(
                f"local_layers must be Keras layers, got {type(layer).__name__}: {layer!r}"
            )
    return local_layers


def DistributedOptimizer(  # noqa: N802 - a factory named like the class it returns, as in Horovod
    optimizer,
    gradient_stats=True,
    ema_decay=0.99,
    batch_size=None,
    skip_nonfinite=True,
    stats_interval=DEFAULT_STATS_INTERVAL,
    *,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    compression=None,
    op=None,
    gradient_predivide_factor=1.0,
    process_set=None,
    scale_local_gradients=True,
    local_layers=None,
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
        skip_nonfinite: skip the update (on all ranks alike) when the averaged
            gradient contains NaN or Inf, and count it in ``skipped_steps``.
            Checked on every update (one fused pass over the local gradient);
            ``False`` applies such an update, as Horovod does. Measurements
            are checked either way: a non-finite one never enters the
            statistics.
        stats_interval: measure the statistics on one update in this many
            (updates 0, N, 2N, ...), inside the graph; the other updates pay
            only for a few scalar ops and one small tensor in the allreduce.
            ``gradient_statistics.set_interval(n)`` changes it without
            retracing. The moving averages (``ema_decay``) and the policies'
            ``warmup_updates`` count optimizer updates, so N changes the cost
            and the number of measurements behind the estimates, not when
            policies decide. The default, 10, takes about half of the cost
            of measuring every update on a small model; measured costs are
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
    # Validates ema_decay and batch_size before any class is made.
    GradientStatistics.check_arguments(ema_decay, batch_size, stats_interval)
    local_layers = _check_horovod_arguments(
        sparse_as_dense, backward_passes_per_step, average_aggregated_gradients,
        scale_local_gradients, local_layers)
    _hvd.ensure_initialized()
    # Validates op, compression, the predivide factor and the process set.
    _hvd.Reduction(op, compression, gradient_predivide_factor, process_set)

    settings = {"gradient_stats": gradient_stats, "ema_decay": ema_decay,
                "batch_size": batch_size, "skip_nonfinite": skip_nonfinite,
                "stats_interval": stats_interval, "sparse_as_dense": sparse_as_dense,
                "backward_passes_per_step": backward_passes_per_step,
                "average_aggregated_gradients": average_aggregated_gradients,
                "op": op, "compression": compression,
                "gradient_predivide_factor": gradient_predivide_factor,
                "process_set": process_set, "scale_local_gradients": scale_local_gradients,
                "local_layers": local_layers}
    return distributed_class(type(optimizer), settings).from_config(optimizer.get_config())


def distributed_class(base, settings):
    """The distributed optimizer class for the Keras optimizer class ``base``
    with keras-adapt ``settings`` (as :func:`DistributedOptimizer` builds
    them); its ``from_config`` makes complete distributed optimizers (what
    :func:`keras_adapt.saving.load_model` hands to Keras' loader)."""
    if _keras.IS_KERAS3:
        bindings = (_Keras3Binding,)
    elif hasattr(base, "_create_all_weights"):  # tf.keras 2 legacy OptimizerV2
        bindings = (_Keras2Binding,)
    else:
        bindings = (_Keras2LearningRate, _Keras2Binding)
    # Same name and module as the wrapped class: a saved model then records a
    # plain optimizer, which loads anywhere (re-wrap it for distributed use).
    cls = type(base.__name__, (*bindings, base),
               {"__module__": base.__module__, "_ka_settings": settings})
    cls.__qualname__ = base.__qualname__
    return cls


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
    return distributed_class(base, type(optimizer)._ka_settings)


def base_learning_rate(optimizer):
    """The float learning rate the user configured, without keras-adapt's factor.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import base_learning_rate
    >>> round(base_learning_rate(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))), 6)
    0.1
    """
    import numpy as np

    lr = optimizer.learning_rate
    value = float(np.asarray(lr.numpy() if hasattr(lr, "numpy") else lr))
    control = optimizer.adapt_state.lr_control if is_distributed(optimizer) else None
    if isinstance(optimizer, _Keras3Binding) and control is not None:
        # Keras 3 reads the effective rate (see the binding).
        value /= float(control.factor_at(optimizer.iterations).numpy())
    return value


def set_base_learning_rate(optimizer, value):
    """Sets the learning rate the user configured (the base under
    keras-adapt's learning-rate factor, if any) to the float ``value``.

    For callbacks that own the schedule (Horovod's warm-up and schedule
    callbacks): the effective rate is then ``value x factor`` on both stacks.
    A plain Keras optimizer simply gets ``learning_rate = value``.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import set_base_learning_rate
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> set_base_learning_rate(opt, 0.25)
    >>> round(float(opt.learning_rate.numpy()), 6)
    0.25
    """
    try:
        if isinstance(optimizer, _Keras3Binding):
            # The public setter takes the effective rate; set the base directly.
            super(_Keras3Binding, type(optimizer)).learning_rate.fset(optimizer, float(value))
        else:
            optimizer.learning_rate = float(value)
    except TypeError as exc:
        raise ValueError(
            f"cannot set the learning rate of {type(optimizer).__name__}: it was "
            "created with a LearningRateSchedule. Use either the schedule or a "
            "learning-rate callback, with a float learning rate"
        ) from exc


def is_distributed(optimizer):
    """True if ``optimizer`` came from :func:`DistributedOptimizer`.

    Example:

    >>> import keras, keras_adapt
    >>> keras_adapt.optimizer.is_distributed(keras.optimizers.SGD())
    False
    """
    return isinstance(optimizer, _DistributedCore)


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
