"""The user's learning rate and the effective one, read and set on the host.

The contract, the same on Keras 3 and tf.keras 2: whatever sets the rate
(``optimizer.learning_rate = x``, ``optimizer.learning_rate.assign(x)``,
Keras' ``LearningRateScheduler`` and ``ReduceLROnPlateau``, keras-adapt's
warm-up and schedule callbacks) sets the *base* rate; reading
``optimizer.learning_rate`` gives the base rate; the optimizer's update
applies ``base x factor``, the factor of keras-adapt's learning-rate control
(:class:`~keras_adapt.optimizer.LearningRateControl`), which
:func:`effective_learning_rate` computes on the host.
"""

import numpy as np

from keras_adapt.optimizer.factory import is_distributed
from keras_adapt.optimizer.lr_control import is_schedule


def _schedule_or_value(optimizer):
    """The optimizer's learning rate as configured: a schedule, a variable or a float."""
    if is_distributed(optimizer):
        return optimizer.configured_learning_rate()
    return optimizer.learning_rate


def base_learning_rate(optimizer):
    """The learning rate the user configured at the current update, as a
    float, without keras-adapt's factor (a schedule is evaluated at the
    update count, as Keras does).

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import base_learning_rate
    >>> round(base_learning_rate(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))), 6)
    0.1
    """
    lr = _schedule_or_value(optimizer)
    if is_schedule(lr):
        lr = lr(optimizer.iterations)
    return float(np.asarray(lr.numpy() if hasattr(lr, "numpy") else lr))


def effective_learning_rate(optimizer):
    """The learning rate the next update uses: :func:`base_learning_rate`
    times keras-adapt's factor, or, with AdaScale progress, the schedule at
    the progress times the factor.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import effective_learning_rate, enable_lr_control
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> _ = enable_lr_control(opt).target.assign(2.0)
    >>> round(effective_learning_rate(opt), 6)
    0.2
    """
    control = optimizer.adapt_state.lr_control if is_distributed(optimizer) else None
    if control is None:
        return base_learning_rate(optimizer)
    factor = control.factor_now(int(optimizer.iterations.numpy()))
    lr = _schedule_or_value(optimizer)
    if control.use_progress and is_schedule(lr):
        return float(np.asarray(lr(control.schedule_step(optimizer.iterations)))) * factor
    return base_learning_rate(optimizer) * factor


def set_base_learning_rate(optimizer, value):
    """Sets the learning rate the user configured (the base under
    keras-adapt's learning-rate factor, if any) to the float ``value``.

    The same as ``optimizer.learning_rate = value``, which sets the base rate
    on both stacks too (as does Keras' own ``LearningRateScheduler`` or
    ``ReduceLROnPlateau``): the effective rate is then ``value x factor``.
    An optimizer created with a ``LearningRateSchedule`` is refused, on both
    stacks alike.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.optimizer import set_base_learning_rate
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> set_base_learning_rate(opt, 0.25)
    >>> round(float(opt.learning_rate.numpy()), 6)
    0.25
    """
    try:
        refused = is_schedule(_schedule_or_value(optimizer))
        if not refused:
            optimizer.learning_rate = float(value)
    except TypeError:  # Keras refused it (a plain Keras 3 optimizer with a schedule)
        refused = True
    if refused:
        raise ValueError(
            f"cannot set the learning rate of {type(optimizer).__name__}: it was "
            "created with a LearningRateSchedule. Use either the schedule or a "
            "learning-rate callback, with a float learning rate"
        )
