"""What the gradient statistics are computed from, per optimizer update.

Three cases give the M >= 2 independent micro-gradients the estimators need
(docs/design.md#gradient-statistics):

* N >= 2 workers: the N workers' gradients of one update (exact);
* N = 1 with k >= 2 accumulated micro-steps: the k micro-gradients (exact);
* N = 1, k = 1: the update's gradient paired with the previous update's
  (:class:`PreviousGradient`; biased while the weights move between them).

Every function here runs in-graph; the branch that measures is taken on one
update in ``stats_interval`` by every rank alike and holds no collective.
"""

import tensorflow as tf

from keras_adapt import ops

#: Default ``stats_interval``: the statistics are measured on one update in this many.
DEFAULT_STATS_INTERVAL = 10


class PreviousGradient:
    """One worker's copy of the gradient of the update before a measured one
    (``optimizer.adapt_state.previous``).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.optimizer import PreviousGradient
    >>> prev = PreviousGradient([tf.ones([3])])
    >>> prev.grads[0].shape.as_list(), bool(prev.stored.numpy())
    ([3], False)
    """

    def __init__(self, grads):
        with tf.init_scope():
            def var(value, dtype, name):
                return tf.Variable(value, dtype=dtype, trainable=False, name=name)

            self.grads = [var(tf.zeros(g.shape, g.dtype), g.dtype, "prev_grad") for g in grads]
            self.sqr = var(0.0, tf.float32, "prev_sqr")
            self.inv_batch = var(0.0, tf.float32, "prev_inv_batch")
            self.update_index = var(-1, tf.int64, "prev_update_index")
            self.stored = var(False, tf.bool, "prev_stored")


def _previous(state, grads):
    if state.previous is None:
        state.previous = PreviousGradient(grads)
    return state.previous


def needs_measurement(stats, update_index, num_workers):
    """Whether update ``update_index`` needs this worker's measurement: a
    measured update and, for one worker, the update before one (its
    gradient is the other half of the pair). A bool tensor every rank
    computes alike."""
    need = stats.due(update_index)
    if num_workers == 1:
        need = need | stats.due(update_index + 1)
    return need


def local_squared_norm(state, local, update_index, num_workers):
    """This worker's squared gradient norm |g_i|^2 of an accumulated
    micro-step, where it is needed: on every update with ``skip_nonfinite``
    (it is the non-finite check), else where :func:`needs_measurement`
    (0 on the others, where nothing reads it)."""
    if state.skip_nonfinite:
        return ops.squared_norms(local)[1]
    return tf.cond(needs_measurement(state.statistics, update_index, num_workers),
                   lambda: ops.squared_norms(local)[1], lambda: tf.constant(0.0))


def measure(state, mean, averaged, local, num_gradients, num_workers, update_index):
    """Folds one measured update into the statistics; returns whether it was used.

    Args:
        state: the optimizer's :class:`AdaptState`.
        mean: the averaged gradient (dense, a mean even under ``op=Sum``).
        averaged: ``(mean_local_sqr, mean_inv_batch, mean_samples)``, this
            update's measurement averaged over the workers (and micro-steps).
        local: ``(local_sqr, inv_batch)`` of this worker's own gradient.
        num_gradients: M, workers x micro-steps (int64 tensor).
        num_workers: N (python int).
        update_index: the update's index (int64 tensor).
    """
    stats = state.statistics
    mean_local_sqr, mean_inv_batch, mean_samples = averaged
    global_batch = tf.cast(num_workers, tf.float32) * mean_samples
    _, total_sqr = ops.squared_norms(mean)
    if num_workers >= 2:
        # With unequal micro-batches `mean` is the batch-weighted mean.
        return stats.update(mean_local_sqr, total_sqr, num_gradients, inv_batch=mean_inv_batch,
                            global_batch=global_batch,
                            weighted=state.batch_weighting.active(num_workers))
    # One worker: with k >= 2 micro-steps the k micro-gradients give the
    # unbiased estimate; with one gradient per update, pair it with the
    # previous update's (M = 2, sizes b_prev and b; unbiased for unequal
    # sizes through the mean of the inverse sizes; biased while the weights
    # move).
    local_sqr, inv_batch = local
    prev = _previous(state, mean)
    _, pair_sum_sqr = ops.squared_norms([g + p for g, p in zip(mean, prev.grads)])
    pair_valid = prev.stored & tf.equal(prev.update_index + 1, update_index)
    several = num_gradients >= 2
    return stats.update(
        tf.where(several, mean_local_sqr, 0.5 * (local_sqr + prev.sqr)),
        tf.where(several, total_sqr, 0.25 * pair_sum_sqr),
        num_gradients=tf.where(several, num_gradients, tf.constant(2, tf.int64)),
        inv_batch=tf.where(several, mean_inv_batch, 0.5 * (inv_batch + prev.inv_batch)),
        global_batch=global_batch,
        valid=several | pair_valid,
    )


def remember_if_next_measured(state, mean, local_sqr, inv_batch, update_index):
    """One worker: keeps this update's gradient when the next update is
    measured (every update at ``stats_interval=1``), for the pair."""
    prev = _previous(state, mean)
    wanted = state.statistics.due(update_index + 1) & tf.math.is_finite(local_sqr)

    def remember():
        for p, g in zip(prev.grads, mean):
            p.assign(g)
        prev.sqr.assign(local_sqr)
        prev.inv_batch.assign(inv_batch)
        prev.update_index.assign(update_index)
        prev.stored.assign(True)
        return tf.constant(True)

    return tf.cond(wanted, remember, lambda: tf.constant(False))
