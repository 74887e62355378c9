"""Which Keras is running: Keras 3 (primary stack) or tf.keras 2 (legacy stack)."""

import keras

KERAS_VERSION = tuple(int(p) for p in keras.__version__.split(".")[:2])
IS_KERAS3 = KERAS_VERSION[0] >= 3


def optimizer_classes():
    """The base classes a Keras optimizer instance may have on this stack."""
    classes = [keras.optimizers.Optimizer]
    legacy = getattr(keras.optimizers, "legacy", None)
    if not IS_KERAS3 and legacy is not None:
        classes.append(legacy.Optimizer)
    return tuple(classes)
