"""Learning-rate control: keras-adapt's factor on top of the user's learning rate."""

import tensorflow as tf


def is_schedule(lr):
    """True if ``lr`` is a Keras ``LearningRateSchedule`` (a callable with a
    config), not a float or a variable.

    Example:

    >>> import keras
    >>> from keras_adapt.optimizer import is_schedule
    >>> is_schedule(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)), is_schedule(0.1)
    (True, False)
    """
    return callable(lr) and hasattr(lr, "get_config") and not isinstance(lr, tf.Variable)


class LearningRateControl:
    """``optimizer.adapt_state.lr_control``: a learning-rate factor on top of
    the user's learning rate (float or schedule).

    ``factor`` ramps linearly from ``start`` to ``target`` over ``ramp``
    updates beginning at update ``begin``. With ``use_progress`` a schedule
    is evaluated at the scale-invariant progress (AdaScale), which advances
    by ``gain`` per update, instead of at the update count. Everything lives
    in variables: changing it never retraces.

    Example:

    >>> from keras_adapt.optimizer import LearningRateControl
    >>> control = LearningRateControl(use_progress=False)
    >>> _ = control.target.assign(3.0), control.ramp.assign(4)
    >>> [round(float(control.factor_at(i)), 2) for i in (0, 2, 4, 9)]
    [1.0, 2.0, 3.0, 3.0]
    """

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

    def schedule_step(self, iterations):
        """The step a learning-rate schedule is evaluated at: the update
        count, or AdaScale's progress when ``use_progress`` is set."""
        if self.use_progress:
            return tf.cast(self.progress, tf.float32)
        return iterations

    def after_update(self):
        """Advances the progress by the gain (in-graph, once per update)."""
        self.progress.assign_add(self.gain)


def enable_lr_control(optimizer, use_progress=False):
    """Turns on the learning-rate factor (and optionally AdaScale progress).

    Used by :class:`keras_adapt.actuators.LearningRateScale`; the model's
    train function must be traced (again) afterwards. Returns the state.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import enable_lr_control
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> enable_lr_control(opt) is opt.adapt_state.lr_control
    True
    """
    state = optimizer.adapt_state
    if state.lr_control is None:
        state.lr_control = LearningRateControl(use_progress)
        # Progress starts where the update count is, so a schedule does not jump.
        state.lr_control.progress.assign(float(optimizer.iterations.numpy()))
    elif use_progress and not state.lr_control.use_progress:
        state.lr_control.use_progress = True
    return state.lr_control
