"""Helpers shared by the actuators."""

from keras_adapt.optimizer import require_distributed


def distributed_optimizer(model, who):
    """The model's keras-adapt optimizer, or a clear error naming the fix."""
    return require_distributed(model, who)


def retrace(model):
    """Drops the model's compiled train function so the next ``fit`` (or the
    one about to start) traces the newly enabled in-graph path."""
    model.train_function = None
