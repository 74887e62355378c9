"""Thin bindings of :class:`DistributedCore` to the method ``model.fit`` calls.

``apply`` on Keras 3 (so it also works under Keras 3's ``LossScaleOptimizer``)
and ``apply_gradients`` on tf.keras 2; each also routes the read of the
learning rate through keras-adapt's one rule
(:meth:`DistributedCore._ka_rate_as_read`) where that stack reads it.
"""

import tensorflow as tf

from keras_adapt import _keras
from keras_adapt.optimizer._step import DistributedCore
from keras_adapt.optimizer.settings import AdaptSettings
from keras_adapt.optimizer.lr_control import is_schedule


class _Keras3Binding(DistributedCore):
    """Keras 3: ``fit`` -> ``apply_gradients`` -> ``apply``; LossScaleOptimizer -> ``apply``.

    Keras 3 reads and sets ``learning_rate`` through
    ``_get_current_learning_rate`` and the variable it returns: both stay
    the base rate, and the update's read gets the factor
    (:meth:`DistributedCore._ka_rate_as_read`).
    """

    def configured_learning_rate(self):
        """The user's learning rate as configured: a schedule or a variable."""
        return self._learning_rate

    def _ka_update_learning_rate(self):
        return self.learning_rate

    def _get_current_learning_rate(self):
        state = getattr(self, "_adapt_state", None)
        control = None if state is None else state.lr_control
        if control is not None and control.use_progress and is_schedule(self._learning_rate):
            lr = self._learning_rate(control.schedule_step(self.iterations))
        else:
            lr = super()._get_current_learning_rate()
        return self._ka_rate_as_read(lr)

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
        if seen is None and (self._adapt_state.worker_local or self._adapt_state.sync.has_local):
            seen = list(self._trainable_variables)
        self._ka_distributed_apply(grads, seen, lambda g: parent_apply(g, variables))


class _Keras2Binding(DistributedCore):
    """tf.keras 2: ``minimize`` -> ``apply_gradients``. A legacy OptimizerV2
    reads its rate in the update through ``_decayed_lr`` only, which
    applies the factor (:meth:`DistributedCore._ka_rate_as_read`); its
    ``learning_rate`` / ``lr`` hyperparameter stays the base rate."""

    def configured_learning_rate(self):
        """The user's learning rate as configured: a schedule or a variable."""
        if hasattr(self, "_create_all_weights"):  # legacy OptimizerV2
            return self._get_hyper("learning_rate")
        return self._learning_rate

    def _ka_update_learning_rate(self):
        if hasattr(self, "_create_all_weights"):  # legacy OptimizerV2
            return self._decayed_lr(tf.float32)
        return self.learning_rate

    def _decayed_lr(self, var_dtype):
        control = self._adapt_state.lr_control
        if control is None:
            return super()._decayed_lr(var_dtype)
        lr = self._get_hyper("learning_rate", var_dtype)
        if control.use_progress and is_schedule(lr):
            lr = tf.cast(lr(control.schedule_step(self.iterations)), var_dtype)
            if self._initial_decay > 0.0:
                step = tf.cast(self.iterations, var_dtype)
                lr = lr / (1.0 + tf.cast(self._initial_decay, var_dtype) * step)
        else:
            lr = super()._decayed_lr(var_dtype)
        return tf.cast(self._ka_rate_as_read(lr), var_dtype)

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
    ``update_step``: that read gets the factor, every other read (callbacks,
    the user) the base rate, the variable itself, which tf.keras 2's
    callbacks assign to (:meth:`DistributedCore._ka_rate_as_read`)."""

    @property
    def learning_rate(self):
        return self._ka_rate_as_read(super().learning_rate)

    @learning_rate.setter
    def learning_rate(self, value):
        super(_Keras2LearningRate, type(self)).learning_rate.fset(self, value)

    def _compute_current_learning_rate(self):
        state = getattr(self, "_adapt_state", None)
        control = None if state is None else state.lr_control
        if control is None or not control.use_progress or not is_schedule(self._learning_rate):
            return super()._compute_current_learning_rate()
        self._current_learning_rate.assign(
            tf.cast(self._learning_rate(control.schedule_step(self.iterations)),
                    self._current_learning_rate.dtype))


def distributed_class(base, settings):
    """The distributed optimizer class for the Keras optimizer class ``base``
    with the keras-adapt ``settings`` (an :class:`AdaptSettings`, as
    :func:`DistributedOptimizer` builds them); its ``from_config`` makes
    complete distributed optimizers (what :func:`keras_adapt.saving.load_model`
    hands to Keras' loader).

    Example:

    >>> import keras
    >>> from keras_adapt.optimizer import AdaptSettings, distributed_class, is_distributed
    >>> cls = distributed_class(keras.optimizers.SGD, AdaptSettings(gradient_stats=False))
    >>> opt = cls.from_config(keras.optimizers.SGD(0.1).get_config())
    >>> is_distributed(opt), opt.gradient_statistics is None
    (True, True)
    """
    if not isinstance(settings, AdaptSettings):
        raise TypeError(
            f"settings={settings!r} is not valid; use a keras_adapt.optimizer.AdaptSettings "
            "(e.g. AdaptSettings(gradient_stats=False))"
        )
    if _keras.IS_KERAS3:
        bindings = (_Keras3Binding,)
    elif hasattr(base, "_create_all_weights"):  # tf.keras 2 legacy OptimizerV2
        bindings = (_Keras2Binding,)
    else:
        bindings = (_Keras2LearningRate, _Keras2Binding)
    # Same name and module as the wrapped class: a saved model then records a
    # plain optimizer, which loads anywhere (re-wrap it for distributed use).
    cls = type(base.__name__, (*bindings, base),
               {"__module__": base.__module__, "adapt_settings": settings})
    cls.__qualname__ = base.__qualname__
    return cls
