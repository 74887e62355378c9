"""In-graph gradient accumulation: k micro-steps per optimizer update."""

import tensorflow as tf


class UpdateBoundary:
    """Counts micro-steps on the host to tell which one completed an optimizer update.

    A callback that acts once per update (a policy, the preemption check)
    calls :meth:`step_ended` after each micro-step; it applies the graph's
    rule (:meth:`AccumulationState.completes_update`) to a host count, so no
    variable is read per step, and every rank counts alike. Without
    accumulation (or with an optimizer that is not keras-adapt's) every
    micro-step completes an update.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import UpdateBoundary
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1),
    ...                                        backward_passes_per_step=2)
    >>> boundary = UpdateBoundary(opt)
    >>> [boundary.step_ended() for _ in range(4)], boundary.next_completes()
    ([False, True, False, True], False)
    """

    def __init__(self, optimizer):
        adapt_state = getattr(optimizer, "adapt_state", None)
        self.accumulation = None if adapt_state is None else adapt_state.accumulation
        # micro-steps already accumulated (a fit that starts mid-update)
        self.pending = 0 if self.accumulation is None else int(self.accumulation.count.numpy())

    def next_completes(self):
        """Whether the next micro-step will complete an update (nothing is
        counted; see the class example)."""
        acc = self.accumulation
        return acc is None or bool(acc.completes_update(self.pending + 1, acc.steps_value))

    def step_ended(self):
        """Whether the micro-step that just ended completed an update."""
        acc = self.accumulation
        if acc is None:
            return True
        self.pending += 1
        if acc.completes_update(self.pending, acc.steps_value):
            self.pending = 0
            return True
        return False


class AccumulationState:
    """Gradient accumulation state (``optimizer.adapt_state.accumulation``).

    ``steps`` (k) is a variable, so changing it never retraces the train
    function; the accumulators are created on the first trace.

    Args:
        steps: k, the micro-steps per update.
        average: the update uses the mean of the k micro-gradients (else
            their sum, Horovod's ``average_aggregated_gradients=False``).
        count_micro_steps: ``optimizer.iterations`` advances on every
            micro-step (Horovod's ``backward_passes_per_step``) instead of
            once per update.

    Example:

    >>> from keras_adapt.optimizer import AccumulationState
    >>> acc = AccumulationState(4)
    >>> [AccumulationState.completes_update(n, acc.steps_value) for n in (1, 3, 4)]
    [False, False, True]
    """

    def __init__(self, steps, average=True, count_micro_steps=False):
        self.average = average
        self.count_micro_steps = count_micro_steps
        with tf.init_scope():
            def var(value, dtype, name):
                return tf.Variable(value, dtype=dtype, trainable=False, name=name)

            self.steps = var(steps, tf.int64, "accumulation_steps")
            self.count = var(0, tf.int64, "accumulated")
            # The micro-steps' squared norms, and sums of 1/b and of b (the
            # gradient statistics of the update they make up).
            self.local_sqr = var(0.0, tf.float32, "accumulated_sqr")
            self.inv_batch = var(0.0, tf.float32, "accumulated_inv_batch")
            self.samples = var(0.0, tf.float32, "accumulated_samples")
        # Host copy of k, kept by GradientAccumulation.set: callbacks read it
        # every step, and a variable read there would cost a device round trip.
        self.steps_value = int(steps)
        self.grads = None

    @staticmethod
    def completes_update(count, steps):
        """The update boundary: the micro-step that brings the count of
        accumulated micro-steps to ``count`` completes an update when
        ``count >= steps``. The one rule, used in the graph (tensors) and on
        the host (python ints, where policies count micro-steps without
        reading a variable). ``>=``: a k lowered mid-accumulation applies at
        once."""
        return count >= steps

    def add(self, grads):
        """Adds this micro-step's gradients (a list, None where a variable
        has none) to the accumulators, made on first use; returns the count
        of accumulated micro-steps including this one (in-graph)."""
        present = [g for g in grads if g is not None]
        if self.grads is None:
            with tf.init_scope():
                self.grads = [tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False,
                                          name="accumulated_grad") for g in present]
        for a, g in zip(self.grads, present):
            a.assign_add(g)
        return self.count.assign_add(1)

    def add_measurement(self, local_sqr, inv_batch, samples):
        """Adds one micro-step's squared norm, 1/b and b (in-graph)."""
        self.local_sqr.assign_add(local_sqr)
        self.inv_batch.assign_add(inv_batch)
        self.samples.assign_add(samples)

    def mean(self, grads, count):
        """``grads`` with each present gradient replaced by the mean of its
        ``count`` accumulated micro-gradients."""
        out = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        for i, a in zip(present, self.grads):
            out[i] = a / tf.cast(count, a.dtype)
        return out

    def reset(self):
        """Zeroes the accumulators after an update (in-graph)."""
        for a in self.grads:
            a.assign(tf.zeros_like(a))
        for v in (self.local_sqr, self.inv_batch, self.samples):
            v.assign(0.0)
        self.count.assign(0)


def enable_accumulation(optimizer, steps=1):
    """Turns on in-graph gradient accumulation; returns its state (idempotent).

    Used by :class:`keras_adapt.actuators.GradientAccumulation`; the model's
    train function must be traced (again) afterwards.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import enable_accumulation
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> enable_accumulation(opt, 2) is opt.adapt_state.accumulation
    True
    """
    state = optimizer.adapt_state
    if state.accumulation is None:
        state.accumulation = AccumulationState(steps)
    return state.accumulation
