"""Horovod's Keras callbacks (``hvd.callbacks.*``), backed by keras-adapt's."""

from keras_adapt import callbacks as _callbacks
from keras_adapt.callbacks import LearningRateScheduleCallback, LearningRateWarmupCallback

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]


def _no_device(device):
    if device != "":
        raise ValueError(
            f"device={device!r} is not offered by keras-adapt; the collectives run "
            "where Horovod places them"
        )


class BroadcastGlobalVariablesCallback(_callbacks.BroadcastGlobalVariablesCallback):
    """Horovod's signature ``(root_rank, device='', local_variables=None)``.

    Example:

    >>> import keras_adapt.horovod as hvd
    >>> hvd.callbacks.BroadcastGlobalVariablesCallback(0).root_rank
    0
    """

    def __init__(self, root_rank, device="", local_variables=None):
        _no_device(device)
        super().__init__(root_rank, local_variables=local_variables)


class MetricAverageCallback(_callbacks.MetricAverageCallback):
    """Horovod's signature ``(device='')``.

    Example:

    >>> import keras_adapt.horovod as hvd
    >>> logs = {"loss": 1.0}
    >>> hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    >>> logs["loss"]   # the mean over workers (all equal here)
    1.0
    """

    def __init__(self, device=""):
        _no_device(device)
        super().__init__()


class BestModelCheckpoint(_callbacks.BestModelCheckpoint):
    """Horovod's signature, plus the ``filepath`` Keras needs (keyword).

    Example:

    >>> import keras_adapt.horovod as hvd
    >>> hvd.callbacks.BestModelCheckpoint(monitor="loss", filepath="best.keras").save_best_only
    True
    """

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        if filepath is None:
            raise ValueError(
                "BestModelCheckpoint needs filepath=... (for example 'best.keras'); "
                "Horovod's Spark estimator sets it for you, plain Keras does not"
            )
        super().__init__(filepath, monitor=monitor, verbose=verbose,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
