"""``load_model``: load a saved Keras model with its optimizer re-wrapped for distributed training."""

import inspect

import keras

from keras_adapt import _keras
from keras_adapt import optimizer as _optimizer

__all__ = ["load_model"]


def _rewrap(optimizer, probe, variables):
    """A distributed copy of the loaded ``optimizer`` (settings of ``probe``)
    holding the same state: built over ``variables``, values copied."""
    new = _optimizer.distributed_class_like(type(optimizer), probe).from_config(optimizer.get_config())
    old_vars = _optimizer.optimizer_variables(optimizer)
    if len(old_vars) <= 1:  # never trained: nothing but the step counter
        return new
    _optimizer.build_slots(new, variables)
    new_vars = _optimizer.optimizer_variables(new)
    if len(new_vars) != len(old_vars):
        raise ValueError(
            f"could not carry the state of the saved {type(optimizer).__name__} over: "
            f"{len(old_vars)} saved variables, {len(new_vars)} after re-wrapping"
        )
    for target, source in zip(new_vars, old_vars):
        target.assign(source)
    return new


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None,
               legacy_opts=False, **kwargs):
    """Loads a model saved by ``model.save`` with its optimizer wrapped in
    :func:`keras_adapt.DistributedOptimizer`, its state (slots, iterations)
    restored into the wrapped optimizer (Horovod's ``hvd.load_model``).

    The saved optimizer is loaded by Keras, then replaced by a distributed
    optimizer of the same class and config holding the same variables
    (slots and ``iterations``), so training resumes where it stopped.

    Args:
        filepath: the saved model (``.keras``; ``.h5`` too on tf.keras 2).
        custom_optimizers: optimizer classes of your own (wrapped like the
            built-in ones).
        custom_objects: other custom classes or functions of the model.
        compression: passed to ``DistributedOptimizer``.
        legacy_opts: accepted for Horovod's signature; the loaded optimizer's
            own class is wrapped, legacy (tf.keras 2) or not.
        **kwargs: any other ``DistributedOptimizer`` argument
            (``gradient_stats``, ``backward_passes_per_step``, ...).

    Example:

    >>> import os, tempfile, keras, keras_adapt
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.Adam(0.01), "mse")
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> model.save(path)
    >>> loaded = keras_adapt.load_model(path)
    >>> keras_adapt.optimizer.is_distributed(loaded.optimizer), type(loaded.optimizer).__name__
    (True, 'Adam')
    """
    if legacy_opts and _keras.IS_KERAS3:
        raise ValueError(
            "legacy_opts=True needs tf.keras 2 (keras.optimizers.legacy); Keras 3 "
            "has no legacy optimizers: use legacy_opts=False"
        )
    objects = {}
    for cls in custom_optimizers or ():
        if not (inspect.isclass(cls) and issubclass(cls, _keras.optimizer_classes())):
            raise TypeError(f"custom_optimizers must hold Keras optimizer classes, got {cls!r}")
        objects[cls.__name__] = cls
    # Validates the keras-adapt arguments before anything is loaded.
    probe = _optimizer.DistributedOptimizer(keras.optimizers.SGD(), compression=compression, **kwargs)
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError(
            f"{filepath!r} holds no compiled optimizer (saved before compile(), or "
            "with include_optimizer=False); load it with keras.models.load_model and "
            "compile it with keras_adapt.DistributedOptimizer(...)"
        )
    if not _optimizer.is_distributed(optimizer):
        model.optimizer = _rewrap(optimizer, probe, model.trainable_variables)
    return model
