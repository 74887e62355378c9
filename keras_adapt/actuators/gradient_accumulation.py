"""GradientAccumulation: k micro-steps per optimizer update, changeable mid-``fit``."""

from keras_adapt import optimizer as _optimizer
from keras_adapt.actuators._common import distributed_optimizer, retrace
from keras_adapt.checks import check_int


class GradientAccumulation:
    """Accumulates the gradients of k micro-steps before each optimizer update.

    The global batch of one update becomes ``workers x micro-batch x k``.
    The k micro-gradients are averaged (so the update equals one step on a
    k-times larger batch for a mean-reduced loss) and then averaged across
    workers in one collective, so communication happens once per update.
    The gradient statistics see ``workers x k`` micro-gradients, which also
    gives unbiased estimates on a single worker when k >= 2.

    k lives in a ``tf.Variable``: :meth:`set` takes effect at the next update
    and never retraces the train function. Every rank must set the same k
    at the same step (policies do).

    ``optimizer.iterations`` counts updates, not micro-steps, so learning-rate
    schedules advance once per update.

    Args:
        model: a model compiled with ``keras_adapt.DistributedOptimizer``.
        steps: initial k (default: keep the current value, 1 when new).

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.actuators import GradientAccumulation
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> acc = GradientAccumulation(model, steps=4)
    >>> _ = model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, verbose=0)
    >>> acc.steps, int(model.optimizer.iterations.numpy())   # 8 micro-steps, 2 updates
    (4, 2)
    """

    def __init__(self, model, steps=None):
        optimizer = distributed_optimizer(model, "GradientAccumulation")
        if steps is not None:
            steps = check_int("steps", steps)
        if optimizer.adapt_state.accumulation is None:
            retrace(model, "GradientAccumulation")  # before the path is enabled
        self._state = _optimizer.enable_accumulation(optimizer, steps or 1)
        if steps is not None:
            self.set(steps)

    @property
    def steps(self):
        """The current k (python int)."""
        return self._state.steps_value

    @property
    def pending_micro_steps(self):
        """Micro-steps accumulated towards the next update (0 right after one)."""
        return int(self._state.count.numpy())

    def set(self, steps):
        """Sets k; takes effect at the next update (a lower k than already
        accumulated applies at the next micro-step)."""
        steps = check_int("steps", steps)
        self._state.steps.assign(steps)
        self._state.steps_value = steps
