"""Creating an optimizer's variables (slots) without running a step."""


def optimizer_variables(optimizer):
    """The optimizer's variables as a list, on both stacks (a method on
    tf.keras 2's optimizers, a property on Keras 3's).

    Example:

    >>> import keras
    >>> from keras_adapt.optimizer import optimizer_variables
    >>> len(optimizer_variables(keras.optimizers.SGD(0.1))) >= 1
    True
    """
    v = optimizer.variables
    return list(v() if callable(v) else v)


def build_slots(optimizer, variables):
    """Creates ``optimizer``'s slot variables for ``variables`` now, without a
    train step and without any collective: ``build`` on Keras 3 and on
    tf.keras 2's optimizers, ``_create_all_weights`` on tf.keras 2's legacy
    ``OptimizerV2``. Idempotent.

    Example:

    >>> import keras
    >>> from keras_adapt.optimizer import build_slots, optimizer_variables
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> opt = keras.optimizers.Adam(0.01)
    >>> build_slots(opt, model.trainable_variables)
    >>> len(optimizer_variables(opt)) >= 1 + 2 * 2   # iterations + m and v of kernel and bias
    True
    """
    variables = list(variables)
    if hasattr(optimizer, "_create_all_weights"):  # tf.keras 2 legacy OptimizerV2
        optimizer._create_all_weights(variables)
    elif not getattr(optimizer, "built", False):
        optimizer.build(variables)
