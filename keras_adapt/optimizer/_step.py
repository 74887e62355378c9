"""The order of one distributed optimizer update (framework-neutral).

Per optimizer update, inside the compiled train function, by default
(``skip_nonfinite=False``):

1. on a measured update (one in ``stats_interval``; every rank decides
   alike from the update count), one grouped allreduce averages the
   gradients *and* this worker's measurement (|g_i|^2 from one fused op,
   1/b_i, b_i: a 3-element tensor), then the statistics are folded in
   (:mod:`keras_adapt.optimizer.statistics`); on the other updates the
   grouped allreduce carries the gradients alone, as plain Horovod;
2. the optimizer update.

With ``skip_nonfinite=True`` the local squared norm is taken and carried on
every update, and the update is skipped (and counted) when the averaged
norm is not finite -- on every rank alike, since the check reads
allreduced values.

Once a straggler rebalance gave the workers unequal micro-batches
(:mod:`keras_adapt.optimizer.batch_weighting`, enabled before tracing), every
gradient allreduce carries each worker's batch b_i and yields the
batch-weighted mean sum_i b_i g_i / B; without it nothing of this is traced.

With accumulation (:mod:`keras_adapt.optimizer.accumulation`) the micro-steps
add up locally and only the micro-step that completes an update reduces and
applies.

When a local synchronisation strategy was declared (:mod:`keras_adapt.sync`),
:meth:`DistributedCore._ka_synchronized_update` is the one place where the
update dispatches on the strategy in use: AllReduceSGD runs the steps above,
the local strategies apply this worker's own gradient
(:meth:`DistributedCore._ka_local_apply`) and then synchronise the models.
"""

import contextlib

import tensorflow as tf

from keras_adapt.monitors.gradient_stats import GradientStatistics
from keras_adapt.optimizer import statistics
from keras_adapt.optimizer.accumulation import AccumulationState
from keras_adapt.optimizer.settings import AdaptSettings
from keras_adapt.optimizer.slots import optimizer_variables
from keras_adapt.optimizer.adapt_state import AdaptState, WorkerLocalVariables
from keras_adapt.sync import SyncState
from keras_adapt import _hvd, ops


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


def _scaled(g, factor):
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(factor, g.values.dtype), g.indices, g.dense_shape)
    return g * tf.cast(factor, g.dtype)


def _mean_view(reduced, reduction, num_workers):
    """The averaged gradient, dense, for the statistics: ``reduced`` itself
    in the default case (average, dense), else densified and / or divided
    by the number of workers (``op=Sum``)."""
    out = [_dense(r) for r in reduced]
    if reduction.is_sum:
        out = [r / tf.cast(num_workers, r.dtype) for r in out]
    return out


class DistributedCore:
    """Framework-neutral implementation shared by the Keras 3 and Keras 2 bindings.

    The class made by :func:`~keras_adapt.optimizer.DistributedOptimizer`
    carries its keras-adapt settings (``adapt_settings``, an
    :class:`~keras_adapt.optimizer.AdaptSettings`), and every instance
    builds its :class:`AdaptState` from them here: a copy made with
    ``type(opt).from_config(opt.get_config())`` is a complete distributed
    optimizer with the same settings, while ``get_config()`` stays the plain
    optimizer's (a saved model loads without keras-adapt).
    """

    adapt_settings: AdaptSettings  # set on each class by distributed_class

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = type(self).adapt_settings
        stats = None
        if settings.gradient_stats:
            stats = GradientStatistics(ema_decay=settings.ema_decay,
                                       batch_size=settings.batch_size,
                                       interval=settings.stats_interval)
        worker_local = WorkerLocalVariables(settings.scale_local_gradients)
        worker_local.add_layers(settings.local_layers)
        self._adapt_state = AdaptState(
            stats, settings.skip_nonfinite,
            reduction=_hvd.Reduction(settings.op, settings.compression,
                                     settings.gradient_predivide_factor,
                                     settings.process_set),
            worker_local=worker_local, sync=SyncState(settings.sync_strategy))
        if settings.backward_passes_per_step > 1:
            self._adapt_state.accumulation = AccumulationState(
                settings.backward_passes_per_step,
                average=settings.average_aggregated_gradients, count_micro_steps=True)

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

    # -- learning rate (used by the bindings) --------------------------------
    #: True while the optimizer's own update runs (set by :meth:`_ka_updating`).
    _ka_in_update = False

    @contextlib.contextmanager
    def _ka_updating(self):
        """The optimizer's own update runs inside this: there, and only
        there, reading the learning rate gives base x factor
        (:meth:`_ka_rate_as_read`). A Python flag around the call, so it
        holds while the update is traced and when it runs eagerly alike."""
        before = self._ka_in_update
        self._ka_in_update = True
        try:
            yield
        finally:
            self._ka_in_update = before

    def _ka_rate_as_read(self, lr):
        """The one learning-rate rule of both stacks, which every binding's
        read of the rate goes through: ``lr`` is the base rate, the one the
        user, Keras' callbacks and keras-adapt's callbacks set and read; the
        optimizer's own update reads it times the factor of the
        learning-rate control (``ramp_factor`` at the update count, the rule
        the host's ``effective_learning_rate`` computes too); every other
        reader gets ``lr`` itself, so a read-multiply-write (Keras'
        ``ReduceLROnPlateau``, ``LearningRateScheduler(lambda e, lr: ...)``)
        compounds on the base and never on the factor."""
        state = getattr(self, "_adapt_state", None)
        control = None if state is None else state.lr_control
        if control is None or not self._ka_in_update:
            return lr
        lr = tf.convert_to_tensor(lr)
        return lr * tf.cast(control.factor_at(self.iterations), lr.dtype)

    def _ka_current_learning_rate(self):
        """The effective learning rate of this update (in-graph): the rate
        the update reads (:meth:`_ka_update_learning_rate` of the binding)."""
        with self._ka_updating():
            return tf.cast(self._ka_update_learning_rate(), tf.float32)

    # -- the update -----------------------------------------------------------
    def _ka_distributed_apply(self, grads, variables, apply_fn):
        """Averages ``grads`` across workers, updates the statistics, then
        calls ``apply_fn(averaged_grads)`` (possibly skipped if non-finite).
        With accumulation enabled, only the micro-step that completes an
        update reaches the workers."""
        _check_not_xla()
        state = self._adapt_state

        def update(averaged):
            with self._ka_updating():
                return apply_fn(averaged)

        if state.accumulation is not None or type(self).adapt_settings.sparse_as_dense:
            grads = [_dense(g) for g in grads]
        worker_local = [False] * len(grads)
        if state.worker_local and variables is not None:
            worker_local = [state.worker_local.contains(v) for v in variables]
        if state.accumulation is not None:
            return self._ka_accumulate(grads, update, worker_local, variables)
        return self._ka_synchronized_update(variables, grads, update, worker_local=worker_local)

    def _ka_accumulate(self, grads, apply_fn, worker_local, variables=None):
        """Adds this micro-step's gradient to the accumulators; the micro-step
        that completes an update averages them over micro-steps and workers
        and applies.

        All ranks count alike and read the same k, so all take the same
        branch and the collective inside it matches up."""
        state = self._adapt_state
        acc = state.accumulation
        stats = state.statistics
        shared = [_dense(g) for g, w in zip(grads, worker_local) if g is not None and not w]
        if stats is not None and shared:
            # The update these micro-steps make up keeps its index until it applies.
            acc.add_measurement(
                statistics.local_squared_norm(state, shared, state.updates.read_value(),
                                              state.reduction.size()),
                stats.inverse_batch_size(), tf.cast(stats.batch_size, tf.float32))
        count = acc.add(grads)

        def update():
            n = tf.cast(count, tf.float32)
            if acc.average:
                apply_update = apply_fn
            else:
                # Horovod's average_aggregated_gradients=False: the sum.
                def apply_update(g):
                    return apply_fn([None if x is None else x * tf.cast(n, x.dtype) for x in g])
            applied = self._ka_synchronized_update(
                variables, acc.mean(grads, count), apply_update, local_sqr=acc.local_sqr / n,
                inv_batch=acc.inv_batch / n, samples=acc.samples, micro_steps=count,
                worker_local=worker_local)
            with tf.control_dependencies([applied]):
                acc.reset()
            return tf.constant(True)

        def accumulate_only():
            if acc.count_micro_steps:
                self.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(AccumulationState.completes_update(count, acc.steps), update,
                       accumulate_only)

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
        control = state.lr_control

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
            if control is not None:
                control.after_update()
            return out

        if stats is None or not local:
            apply(with_averaged(state.reduction.allreduce(local)))
            return tf.constant(True)

        update_index = state.updates.read_value()
        measured = stats.due(update_index)
        m = tf.cast(num_workers, tf.int64)
        if micro_steps is not None:
            m = m * micro_steps

        if not state.skip_nonfinite:
            # Only the updates that are measured (and, for one worker, the
            # updates before them) carry the measurement; the others reduce
            # the gradients alone, as plain Horovod does. Every rank reads
            # the same update count and interval, so all take the same branch
            # and the collective inside it matches.
            carry = statistics.needs_measurement(stats, update_index, num_workers)

            def carrying():
                reduced, averaged, own = self._ka_reduce_with_measurement(
                    local, local_sqr, inv_batch, samples)
                deps = self._ka_fold_in(reduced, averaged, own,
                                        True if num_workers >= 2 else measured, m, update_index)
                with tf.control_dependencies(deps):
                    return [tf.identity(r) for r in reduced]

            reduced = tf.cond(carry, carrying, lambda: self._ka_reduce(local, samples))
            apply(with_averaged(reduced))
            return tf.constant(True)

        # skip_nonfinite: the local squared norm is also the non-finite check,
        # so it is taken, and carried, on every update.
        reduced, averaged, own = self._ka_reduce_with_measurement(
            local, local_sqr, inv_batch, samples)
        deps = self._ka_fold_in(reduced, averaged, own, measured, m, update_index)
        averaged_grads = with_averaged(reduced)

        def apply_branch():
            apply(averaged_grads)
            return tf.constant(True)

        def skip_branch():
            state.skipped.assign_add(1)
            return tf.constant(False)

        # The allreduced mean of |g_i|^2 is identical on every rank, so every
        # rank takes the same branch.
        with tf.control_dependencies(deps):
            return tf.cond(tf.math.is_finite(averaged[0]), apply_branch, skip_branch)

    # -- synchronisation strategies (keras_adapt.sync) ----------------------
    def _ka_reduce_with_measurement(self, local, local_sqr, inv_batch, samples):
        """The grouped allreduce of the gradients ``local`` with this
        worker's measurement (|g_i|^2, 1/b, b) riding in it: no extra
        collective. Returns the reduced gradients, the averaged measurement
        and this worker's own."""
        state = self._adapt_state
        stats = state.statistics
        if local_sqr is None:
            own = (ops.squared_norms([_dense(g) for g in local])[1],
                   stats.inverse_batch_size(), tf.cast(stats.batch_size, tf.float32))
        else:
            own = (local_sqr, inv_batch, samples)
        weighting = state.batch_weighting
        if not weighting.active(state.reduction.size()):
            reduced = state.reduction.allreduce(local, [tf.stack(own)])
            return reduced[:-1], tuple(tf.unstack(reduced[-1])), own
        # Unequal micro-batches: the batch-weighted mean, from the b_i that
        # rides in the measurement (|g_i|^2 above is the unweighted g_i's).
        reduced = state.reduction.allreduce(weighting.scale(local, own[2]), [tf.stack(own)])
        averaged = tuple(tf.unstack(reduced[-1]))
        return weighting.unscale(reduced[:-1], averaged[2]), averaged, own

    def _ka_reduce(self, local, samples=None):
        """The gradient allreduce of an update without a measurement: plain
        Horovod, or, once the batch weighting is enabled, the batch-weighted
        mean (this worker's batch ``samples``, default the recorded
        micro-batch, rides in the same grouped allreduce)."""
        state = self._adapt_state
        weighting = state.batch_weighting
        if not weighting.active(state.reduction.size()):
            return state.reduction.allreduce(local)
        batch = samples if samples is not None else tf.cast(state.statistics.batch_size,
                                                            tf.float32)
        reduced = state.reduction.allreduce(weighting.scale(local, batch), [batch])
        return weighting.unscale(reduced[:-1], reduced[-1])

    def _ka_fold_in(self, reduced, averaged, own, when, num_gradients, update_index):
        """The statistics of this update when ``when`` (True, or a bool
        tensor every rank computes alike; the branch holds no collective);
        one worker also keeps the gradient for the next update's pair.
        Returns the ops to wait for."""
        state = self._adapt_state
        num_workers = state.reduction.size()

        def mean():
            # Made inside each branch that reads it: under op=Sum it costs a division.
            return _mean_view(reduced, state.reduction, num_workers)

        def measure():
            return statistics.measure(state, mean(), averaged, own[:2], num_gradients,
                                      num_workers, update_index)

        deps = [measure() if when is True else
                tf.cond(when, measure, lambda: tf.constant(False))]
        if num_workers == 1:
            with tf.control_dependencies(deps):  # the pair reads before this overwrites
                deps.append(statistics.remember_if_next_measured(
                    state, mean(), own[0], own[1], update_index))
        return deps

    def _ka_synchronized_update(self, variables, grads, apply_fn, **kwargs):
        """One update under the synchronisation strategy in use: the plain
        :meth:`_ka_reduce_and_apply` when no local strategy was declared
        (nothing added to the step), else the in-graph dispatch of
        :meth:`keras_adapt.sync.SyncState.update` between it and
        :meth:`_ka_local_apply` followed by the strategy's model
        synchronisation. ``variables``: the variables ``grads`` belong to."""
        state = self._adapt_state
        if not state.sync.has_local:
            done = self._ka_reduce_and_apply(grads, apply_fn, **kwargs)
        else:
            worker_local = kwargs.get("worker_local") or [False] * len(grads)
            shared = [v for v, g, w in zip(variables, grads, worker_local)
                      if g is not None and not w]
            done = state.sync.update(
                lambda: self._ka_reduce_and_apply(grads, apply_fn, **kwargs),
                lambda: self._ka_local_apply(grads, apply_fn, **kwargs),
                shared, self._ka_slot_variables(), self._ka_current_learning_rate,
                state.reduction)
        with tf.control_dependencies([done]):
            state.updates.assign_add(1)
            return tf.identity(done)

    def _ka_slot_variables(self):
        """The optimizer's slot variables (momentum, Adam moments): its
        floating-point variables other than the learning rate."""
        lr = self.configured_learning_rate()
        return [v for v in optimizer_variables(self)
                if tf.as_dtype(v.dtype).is_floating and v is not lr and v is not self.iterations]

    def _ka_local_apply(self, grads, apply_fn, local_sqr=None, inv_batch=None,
                        samples=None, micro_steps=None, worker_local=None):
        """A local strategy's update: applies this worker's own gradient
        (skipped on this worker alone if it is not finite). On measured
        updates (one in ``stats_interval``, all ranks alike) the gradients and
        the measurement also go through the allreduce, for the statistics
        only (computed as under AllReduceSGD), for one gradient allreduce per
        ``stats_interval`` updates. Under LocalSGD and BMUF a due measurement
        waits for the first update after a model averaging, where the
        workers' models agree and the statistics are exact
        (:meth:`SyncState.measure_now`, docs/sync_strategies.md).
        Arguments as :meth:`_ka_reduce_and_apply`."""
        state = self._adapt_state
        stats = state.statistics
        if worker_local is None:
            worker_local = [False] * len(grads)
        present = [i for i, g in enumerate(grads) if g is not None and not worker_local[i]]
        local = [grads[i] for i in present]
        num_workers = state.reduction.size()
        out = list(grads)
        if state.worker_local.scale and num_workers > 1:
            for i, g in enumerate(grads):
                if g is not None and worker_local[i]:
                    out[i] = _scaled(g, 1.0 / num_workers)
        update_index = state.updates.read_value()
        if local_sqr is None and state.skip_nonfinite and local:
            # The non-finite check of this worker's own gradient, every update.
            local_sqr = ops.squared_norms([_dense(g) for g in local])[1]
        deps = []
        if stats is not None and local:
            m = tf.cast(num_workers, tf.int64)
            if micro_steps is not None:
                m = m * micro_steps

            def measure_only():
                # The one collective of this branch; every rank takes it alike.
                reduced, averaged, own = self._ka_reduce_with_measurement(
                    local, local_sqr, inv_batch, samples)
                # With two or more workers measure_now() said so.
                when = True if num_workers >= 2 else stats.due(update_index)
                done = self._ka_fold_in(reduced, averaged, own, when, m, update_index)
                with tf.control_dependencies(done):
                    return tf.constant(True)

            if num_workers >= 2:
                # Measured where the workers' models agree (the update after
                # a LocalSGD or BMUF averaging): a due measurement waits for it.
                now = state.sync.measure_now(stats.due(update_index))
            else:
                now = statistics.needs_measurement(stats, update_index, num_workers)
            deps.append(tf.cond(now, measure_only, lambda: tf.constant(False)))

        def apply_branch():
            apply_fn(out)
            if state.lr_control is not None:
                state.lr_control.after_update()
            return tf.constant(True)

        def skip_branch():
            state.skipped.assign_add(1)
            return tf.constant(False)

        with tf.control_dependencies(deps):
            if not state.skip_nonfinite or local_sqr is None:
                return apply_branch()
            return tf.cond(tf.math.is_finite(local_sqr), apply_branch, skip_branch)
