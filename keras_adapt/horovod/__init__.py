"""Horovod's Keras API, backed by keras-adapt: ``import keras_adapt.horovod as hvd``.

For porting a script written for ``horovod.tensorflow.keras`` (or
``horovod.keras``): the names and arguments are Horovod's, the
implementation is keras-adapt's (which also runs on Keras 3, and measures
the gradient statistics in the same step). What is deliberately not
offered raises a clear error naming the alternative; docs/horovod.md has
the full table.

Example:

>>> import keras
>>> import keras_adapt.horovod as hvd
>>> hvd.init()
>>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
>>> callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
...              hvd.callbacks.MetricAverageCallback()]
>>> type(opt).__name__, hvd.rank() < hvd.size()
('SGD', True)
"""

try:
    import horovod.tensorflow as _hvd_tf
except ImportError as exc:  # pragma: no cover - both stacks have Horovod
    raise ImportError(
        "keras_adapt.horovod needs horovod (horovod.tensorflow); install "
        "horovod==0.28.1 (see docs/install.md)"
    ) from exc

import tensorflow as tf

from horovod.tensorflow import (  # noqa: F401 - re-exported for porting scripts
    Adasum,
    Average,
    Compression,
    ProcessSet,
    Sum,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    rank,
    remove_process_set,
    shutdown,
    size,
)

from keras_adapt import optimizer as _optimizer
from keras_adapt import saving as _saving
from keras_adapt.horovod import callbacks  # noqa: F401 - hvd.callbacks.*
from keras_adapt import elastic  # noqa: F401 - hvd.elastic.* (KerasState, run, ...)

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allreduce",
           "broadcast", "load_model"]


def _not_offered(name, value, default, alternative):
    if value != default:
        raise ValueError(f"{name}={value!r} is not offered by keras-adapt; {alternative}")


def _check_common(device_dense, device_sparse, groups):
    _not_offered("device_dense", device_dense, "",
                 "the collectives run where Horovod places them for the gradients' device")
    _not_offered("device_sparse", device_sparse, "",
                 "the collectives run where Horovod places them for the gradients' device")
    _not_offered("groups", groups, None,
                 "keras-adapt sends all gradients in one grouped allreduce per step; "
                 "tune Horovod's fusion with HOROVOD_FUSION_THRESHOLD instead")


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Horovod's ``DistributedOptimizer``: :func:`keras_adapt.DistributedOptimizer`
    with Horovod's arguments and defaults (``name`` is accepted and unused).

    Example:

    >>> import keras, keras_adapt.horovod as hvd
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
    ...                                average_aggregated_gradients=True)
    >>> opt.adapt_state.accumulation.steps_value
    2
    """
    _check_common(device_dense, device_sparse, groups)
    _not_offered("num_groups", num_groups, 0,
                 "keras-adapt sends all gradients in one grouped allreduce per step")
    return _optimizer.DistributedOptimizer(
        optimizer, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, compression=compression,
        op=op, gradient_predivide_factor=gradient_predivide_factor, process_set=process_set,
        scale_local_gradients=scale_local_gradients)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average, groups=None,
                                process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """Horovod's ``PartialDistributedOptimizer``: the trainable weights of
    ``local_layers`` stay worker-local (see ``register_local_var``).

    Example:

    >>> import keras, keras_adapt.horovod as hvd
    >>> layer = keras.layers.Dense(2)
    >>> opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[layer])
    >>> bool(opt.adapt_state.worker_local)
    True
    """
    _check_common(device_dense, device_sparse, groups)
    return _optimizer.DistributedOptimizer(
        optimizer, sparse_as_dense=sparse_as_dense, compression=compression, op=op,
        gradient_predivide_factor=gradient_predivide_factor, process_set=process_set,
        scale_local_gradients=scale_local_gradients, local_layers=local_layers)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Horovod's ``load_model``: :func:`keras_adapt.load_model`.

    Example:

    >>> import os, tempfile, keras, keras_adapt.horovod as hvd
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.SGD(0.01), "mse")
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> model.save(path)
    >>> type(hvd.load_model(path).optimizer).__name__
    'SGD'
    """
    return _saving.load_model(filepath, custom_optimizers=custom_optimizers,
                              custom_objects=custom_objects, compression=compression,
                              legacy_opts=legacy_opts)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """Allreduces a tensor-compatible value (Horovod's Keras ``allreduce``).

    Example:

    >>> import keras_adapt.horovod as hvd
    >>> float(hvd.allreduce(2.0))   # the mean over workers
    2.0
    """
    return _hvd_tf.allreduce(tf.constant(value, name=name), average=average,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             op=op, compression=compression)


def allgather(value, name=None):
    """Concatenates a value from all workers along axis 0 (Horovod's Keras ``allgather``).

    Example:

    >>> import keras_adapt.horovod as hvd
    >>> hvd.allgather([1.0]).shape[0] == hvd.size()
    True
    """
    return _hvd_tf.allgather(tf.constant(value, name=name))


def broadcast(value, root_rank, name=None):
    """``root_rank``'s value on every worker (Horovod's Keras ``broadcast``).

    Example:

    >>> import keras_adapt.horovod as hvd
    >>> float(hvd.broadcast(3.0, root_rank=0))
    3.0
    """
    return _hvd_tf.broadcast(tf.constant(value, name=name), root_rank)
