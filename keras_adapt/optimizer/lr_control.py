"""Learning-rate control: keras-adapt's factor on top of the user's learning rate."""

import numpy as np
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


def ramp_factor(iterations, start, target, begin, ramp, minimum, maximum):
    """The learning-rate factor at update ``iterations`` of a linear ramp
    from ``start`` to ``target`` over ``ramp`` updates beginning at update
    ``begin`` (``ramp`` 0: ``start`` before ``begin``, ``target`` from it on).

    The one rule, written with arithmetic, ``minimum`` and ``maximum`` only,
    so that the graph (float32 tensors, ``tf.minimum``/``tf.maximum``) and
    the host (float32 numpy arrays, ``np.minimum``/``np.maximum``) compute
    the same float32 number. The fraction of the ramp done is
    ``clip((iterations - begin + [ramp = 0]) / max(ramp, 1), 0, 1)``, with
    ``[ramp = 0] = 1 - min(ramp, 1)`` for a whole ``ramp >= 0``.

    Example:

    >>> import numpy as np
    >>> from keras_adapt.optimizer.lr_control import ramp_factor
    >>> f = lambda i, ramp: float(ramp_factor(i, 1.0, 3.0, 2.0, ramp, np.minimum, np.maximum))
    >>> [f(i, 4.0) for i in (0, 2, 3, 6, 9)]    # from 1 to 3 over updates 2..6
    [1.0, 1.0, 1.5, 3.0, 3.0]
    >>> [f(i, 0.0) for i in (1, 2)]             # no ramp: 3 from update 2 on
    [1.0, 3.0]
    """
    done = (iterations - begin + 1.0 - minimum(ramp, 1.0)) / maximum(ramp, 1.0)
    return start + (target - start) * minimum(maximum(done, 0.0), 1.0)


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
        """The factor at update ``iterations``, as a float32 tensor (in-graph
        or eagerly; :func:`ramp_factor`)."""
        def f32(value):
            return tf.cast(value, tf.float32)

        return ramp_factor(f32(iterations), self.start, self.target, f32(self.begin),
                           f32(self.ramp), tf.minimum, tf.maximum)

    def factor_now(self, iterations):
        """The factor at update ``iterations`` (an int), as a float, computed
        on the host: four variable reads and :func:`ramp_factor` in float32,
        the graph's number without the graph's eager ops (a tenth of the
        time between two training processes on two cores).

        Example:

        >>> from keras_adapt.optimizer import LearningRateControl
        >>> control = LearningRateControl(use_progress=False)
        >>> _ = control.target.assign(3.0), control.ramp.assign(4)
        >>> [control.factor_now(i) for i in (0, 2, 4, 9)]
        [1.0, 2.0, 3.0, 3.0]
        """
        def f32(value):
            # A one-element array: numpy 1.x keeps float32 against python
            # floats for arrays, not for scalars.
            return np.array([value], dtype=np.float32)

        values = [f32(v.numpy()) for v in (self.start, self.target, self.begin, self.ramp)]
        return float(ramp_factor(f32(iterations), *values, np.minimum, np.maximum)[0])

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
