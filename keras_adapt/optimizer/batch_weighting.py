"""Batch weighting: the update stays the global-batch mean gradient when the
workers' micro-batches differ (``optimizer.adapt_state.batch_weighting``).

With micro-batches b_i summing to B, the gradient of the global batch is
sum_i b_i g_i / B, not the plain mean of the g_i. Once enabled (by
:class:`keras_adapt.actuators.RankBatchSizes`, before the train function is
traced), each worker multiplies its gradient by b_i / r before the
averaging allreduce, sends b_i in the same grouped allreduce, and multiplies
the result by r / mean_i(b_i):

    mean_i(b_i g_i / r) * r / mean_i(b_i) = sum_i b_i g_i / B

exactly, whatever the reference r is (r only keeps the scaled gradient near
its own magnitude; the actuator sets it to B / N). b_i is the batch the
step really had (recorded from the data in-graph), so a plan that is not
yet in effect cannot bias the update. Nothing of this is traced while it is
off, nor in a job of one worker.
"""

import tensorflow as tf

from keras_adapt._traced_option import TracedOption
from keras_adapt.checks import invalid


class BatchWeighting(TracedOption):
    """Weights every worker's gradient by its share of the global batch.

    Attributes:
        enabled: whether the weighting is traced into the update (set by
            :meth:`enable`; a train function traced before must be traced again).
        reference: float32 variable r, the same on every worker (default 1).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.optimizer import BatchWeighting
    >>> weighting = BatchWeighting()
    >>> weighting.enable(), weighting.active(2), weighting.active(1)
    (True, True, False)
    >>> # two workers with 2 and 6 samples: the reduction averages what each sends
    >>> sent = [weighting.scale([tf.constant([1.0])], b)[0] for b in (2.0, 6.0)]
    >>> mean_sent = (sent[0] + sent[1]) / 2.0
    >>> float(weighting.unscale([mean_sent], (2.0 + 6.0) / 2.0)[0][0])  # (2*1 + 6*1) / 8
    1.0
    """

    def __init__(self):
        super().__init__()
        self.reference = tf.Variable(1.0, dtype=tf.float32, trainable=False,
                                     name="batch_weighting_reference")

    def active(self, num_workers):
        """Whether the update of a job of ``num_workers`` carries the weighting."""
        return self.enabled and num_workers >= 2

    def set_reference(self, value):
        """Sets r (> 0); every worker must set the same value."""
        value = float(value)
        if not value > 0.0:
            raise invalid("reference", value, "use a batch size > 0")
        self.reference.assign(value)

    def scale(self, grads, batch):
        """``grads`` times b_i / r, before the averaging allreduce."""
        factor = tf.cast(batch, tf.float32) / self.reference
        return [_times(g, factor) for g in grads]

    def unscale(self, reduced, mean_batch):
        """The reduced ``reduced`` times r / mean_i(b_i): the batch-weighted mean."""
        factor = self.reference / tf.maximum(tf.cast(mean_batch, tf.float32), 1e-30)
        return [_times(r, factor) for r in reduced]


def _times(g, factor):
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(factor, g.values.dtype), g.indices,
                                g.dense_shape)
    return g * tf.cast(factor, g.dtype)
