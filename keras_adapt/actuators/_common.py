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

