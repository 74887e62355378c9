"""Helpers shared by the actuators."""

from keras_adapt.optimizer import require_distributed


def distributed_optimizer(model, who):
    """The model's keras-adapt optimizer, or a clear error naming the fix."""
    return require_distributed(model, who)


def retrace(model):
    """Drops the model's compiled train function so the next ``fit`` (or the
    one about to start) traces the newly enabled in-graph path."""
    model.train_function = None


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
