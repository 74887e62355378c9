"""``AdaptSettings``: the keras-adapt settings of a distributed optimizer.

One frozen object holds what :func:`~keras_adapt.optimizer.DistributedOptimizer`
was given besides the Keras optimizer; its fields' defaults are the factory's
defaults, and every value is checked here, once, when the object is made.
The distributed class carries it (``type(opt).adapt_settings``), so every
copy made with ``type(opt).from_config(opt.get_config())`` gets the same
settings.
"""

import dataclasses
from typing import Any, Optional, Tuple

from keras_adapt import _hvd
from keras_adapt.monitors.gradient_stats import GradientStatistics
from keras_adapt.optimizer.statistics import DEFAULT_STATS_INTERVAL
from keras_adapt.sync.sync_state import candidates_from

_FLAGS = ("gradient_stats", "skip_nonfinite", "sparse_as_dense",
          "average_aggregated_gradients", "scale_local_gradients")


@dataclasses.dataclass(frozen=True)
class AdaptSettings:
    """The keras-adapt settings of a distributed optimizer, checked and frozen.

    The fields are :func:`~keras_adapt.optimizer.DistributedOptimizer`'s
    arguments besides ``optimizer``, with the same names, defaults and meaning
    (see its docstring). Making the object checks every value and raises a
    ``ValueError`` (``TypeError`` for a wrong kind of object) naming the value
    and the fix. Two fields are normalised: ``local_layers`` becomes a tuple
    of layers (``()`` for None) and ``sync_strategy`` the tuple of declared
    strategies, the initial one first
    (:func:`keras_adapt.sync.candidates_from`). To derive changed settings,
    use ``dataclasses.replace(settings, name=value)``, which checks the new
    values the same way.

    A distributed optimizer's settings are ``opt.adapt_settings`` (an
    attribute of its class); :func:`~keras_adapt.optimizer.distributed_class`
    makes a distributed class from a Keras optimizer class and settings.

    Example:

    >>> import dataclasses, keras, keras_adapt
    >>> from keras_adapt.optimizer import AdaptSettings
    >>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), stats_interval=5)
    >>> opt.adapt_settings.stats_interval, opt.adapt_settings.ema_decay
    (5, 0.99)
    >>> dataclasses.replace(opt.adapt_settings, ema_decay=0.9).ema_decay
    0.9
    >>> AdaptSettings(backward_passes_per_step=0)
    Traceback (most recent call last):
    ...
    ValueError: backward_passes_per_step=0 is not valid; use a positive int ...
    """

    gradient_stats: bool = True
    ema_decay: float = 0.99
    batch_size: Optional[int] = None
    skip_nonfinite: bool = False
    stats_interval: int = DEFAULT_STATS_INTERVAL
    sparse_as_dense: bool = False
    backward_passes_per_step: int = 1
    average_aggregated_gradients: bool = False
    compression: Any = None  # horovod.tensorflow.Compression.none or .fp16; None: none
    op: Any = None  # horovod.tensorflow.Average or Sum; None: Average
    gradient_predivide_factor: float = 1.0
    process_set: Any = None  # a horovod.tensorflow.ProcessSet; None: all workers
    scale_local_gradients: bool = True
    local_layers: Optional[Tuple[Any, ...]] = None  # Keras layers; () once made
    sync_strategy: Any = None  # keras_adapt.sync strategies; a tuple once made

    def __post_init__(self):
        for name in _FLAGS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name}={value!r} is not valid; use True or False")
        GradientStatistics.check_arguments(self.ema_decay, self.batch_size, self.stats_interval)
        k = self.backward_passes_per_step
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(
                f"backward_passes_per_step={k!r} is not valid; use a positive int "
                "(1: reduce and apply every step)"
            )
        # Checks op, compression, the predivide factor and the process set.
        _hvd.Reduction(self.op, self.compression, self.gradient_predivide_factor,
                       self.process_set)
        object.__setattr__(self, "gradient_predivide_factor",
                           float(self.gradient_predivide_factor))
        object.__setattr__(self, "local_layers", _layers(self.local_layers))
        object.__setattr__(self, "sync_strategy", candidates_from(self.sync_strategy))


def _layers(local_layers):
    """``local_layers`` as a tuple of Keras layers (one layer or None allowed)."""
    if local_layers is None:
        return ()
    import keras

    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    local_layers = tuple(local_layers)
    for layer in local_layers:
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(
                f"local_layers holds {type(layer).__name__}: {layer!r}, which is not "
                "valid; use Keras layers (a layer or a list of them)"
            )
    return local_layers
