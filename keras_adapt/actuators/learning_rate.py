"""LearningRateScale: a factor on top of the user's learning rate, with warm-up."""

from keras_adapt import optimizer as _optimizer
from keras_adapt.actuators._common import distributed_optimizer, retrace
from keras_adapt.checks import check_bool, check_float, check_int


class LearningRateScale:
    """Multiplies the learning rate the user configured by a factor.

    The user's learning rate keeps working as configured: a float, a
    variable, or a ``LearningRateSchedule`` (evaluated at the update count,
    or at AdaScale's scale-invariant progress with ``use_progress=True``).
    The effective rate is ``base_lr(step) x factor``; a change of factor can
    ramp linearly over ``warmup_steps`` updates (Goyal et al. 2017), computed
    in the graph from the update count, so no callback runs per step.

    The same on both stacks: whatever sets the learning rate afterwards
    (``optimizer.learning_rate = x`` or ``.assign(x)``, Keras'
    ``LearningRateScheduler`` and ``ReduceLROnPlateau``, keras-adapt's
    warm-up and schedule callbacks) sets the base rate, under the factor;
    reading ``optimizer.learning_rate`` gives the base rate
    (:func:`~keras_adapt.optimizer.base_learning_rate`), and only the
    update reads ``base x factor`` (:meth:`current_lr`).

    Args:
        model: a model compiled with ``keras_adapt.DistributedOptimizer``.
        use_progress: evaluate a schedule at the progress variable, which
            advances by :attr:`gain` per update (AdaScale), instead of at
            ``optimizer.iterations``.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.actuators import LearningRateScale
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> lr = LearningRateScale(model)
    >>> lr.set(2.0)
    >>> round(lr.factor, 6), round(lr.current_lr(), 6)
    (2.0, 0.2)
    """

    def __init__(self, model, use_progress=False):
        check_bool("use_progress", use_progress)
        self._optimizer = distributed_optimizer(model, "LearningRateScale")
        was = self._optimizer.adapt_state.lr_control
        was_progress = was is not None and was.use_progress
        self._state = _optimizer.enable_lr_control(self._optimizer, use_progress)
        if was is None or (use_progress and not was_progress):
            retrace(model, "LearningRateScale")

    def _iterations(self):
        return int(self._optimizer.iterations.numpy())

    @property
    def factor(self):
        """The factor in effect at the current update."""
        return self._state.factor_now(self._iterations())

    @property
    def target(self):
        """The factor the current ramp ends at."""
        return float(self._state.target.numpy())

    def set(self, factor, warmup_steps=0):
        """Moves the factor to ``factor``, linearly over ``warmup_steps`` updates."""
        factor = check_float("factor", factor, low_open=True)
        check_int("warmup_steps", warmup_steps, 0)
        now = self._iterations()
        self._state.start.assign(self.factor)
        self._state.target.assign(factor)
        self._state.begin.assign(now)
        self._state.ramp.assign(int(warmup_steps))

    @property
    def gain(self):
        """Progress added per update (AdaScale's r; 1 otherwise)."""
        return float(self._state.gain.numpy())

    @gain.setter
    def gain(self, value):
        self._state.gain.assign(check_float("factor", value, low_open=True))

    @property
    def progress(self):
        """Scale-invariant progress: the sum of the gains of all updates."""
        return float(self._state.progress.numpy())

    @progress.setter
    def progress(self, value):
        self._state.progress.assign(float(value))

    def base_lr(self):
        """The user's learning rate at the current step, without the factor."""
        return _optimizer.base_learning_rate(self._optimizer)

    def current_lr(self):
        """The effective learning rate now: ``base_lr() x factor`` (or the
        schedule at the progress, times the factor)."""
        return _optimizer.effective_learning_rate(self._optimizer)
