"""Helpers shared by the actuators."""

from keras_adapt._train_step import drop_train_function
from keras_adapt.optimizer import require_distributed


def distributed_optimizer(model, who):
    """The model's keras-adapt optimizer, or a clear error naming the fix."""
    return require_distributed(model, who)


def retrace(model, actuator):
    """Drops the model's compiled train function so the next ``fit`` (or the
    one about to start) traces the in-graph path ``actuator`` (its class
    name) enabled; a ``RuntimeError`` naming ``on_attach`` when a running
    ``fit`` has built it already."""
    drop_train_function(model, actuator)


def positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        try:
            import numpy as np

            if isinstance(value, np.integer) and value >= 1:
                return int(value)
        except ImportError:  # pragma: no cover
            pass
        raise ValueError(f"{name}={value!r} is not valid; use a positive int")
    return int(value)
