"""The few Horovod core collectives keras-adapt uses, behind one small facade.

keras-adapt builds only on ``horovod.tensorflow`` (allreduce, grouped
allreduce, broadcast), never on ``horovod.tensorflow.keras``, whose internals
break on Keras 3. If Horovod is not installed the facade runs as a single
process (size 1, rank 0) so that the library stays usable and testable.
"""

import warnings

try:  # pragma: no cover - exercised on both branches by the test matrix
    import horovod.tensorflow as hvd
except ImportError:
    hvd = None

_warned = []


def ensure_initialized():
    """Initialises Horovod once (a no-op if the user already called ``hvd.init()``)."""
    if hvd is None:
        if not _warned:
            _warned.append(True)
            warnings.warn(
                "keras-adapt: horovod is not installed; running as a single "
                "process. Install horovod==0.28.1 (see docs/install.md).",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    if not hvd.is_initialized():
        hvd.init()


def size():
    """Number of Horovod workers in the job (1 without horovodrun or Horovod).

    Example:

    >>> import keras_adapt
    >>> keras_adapt.size() >= 1
    True
    """
    ensure_initialized()
    return 1 if hvd is None else hvd.size()


def rank():
    """This worker's rank, 0 .. size()-1 (0 without horovodrun or Horovod).

    Example:

    >>> import keras_adapt
    >>> 0 <= keras_adapt.rank() < keras_adapt.size()
    True
    """
    ensure_initialized()
    return 0 if hvd is None else hvd.rank()


def local_rank():
    """This worker's rank among the workers on its machine (pick a GPU with it).

    Example:

    >>> import keras_adapt
    >>> keras_adapt.local_rank() >= 0
    True
    """
    ensure_initialized()
    return 0 if hvd is None else hvd.local_rank()


def grouped_allreduce_average(tensors):
    """Averages a list of tensors over all workers in as few collectives as possible.

    Horovod's grouped allreduce takes one dtype per group, so the tensors are
    grouped by dtype (float32 gradients and the float32 monitoring scalars
    travel together) and the original order is restored afterwards.
    """
    if size() == 1 or not tensors:
        return list(tensors)
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    out = [None] * len(tensors)
    for idx in by_dtype.values():
        reduced = hvd.grouped_allreduce([tensors[i] for i in idx], op=hvd.Average)
        for i, r in zip(idx, reduced):
            out[i] = r
    return out


def broadcast(tensor, root_rank, name=None):
    if size() == 1:
        return tensor
    return hvd.broadcast(tensor, root_rank, name=name)


def allreduce_average(tensor, name=None):
    if size() == 1:
        return tensor
    return hvd.allreduce(tensor, op=hvd.Average, name=name)


def allgather(tensor, name=None):
    """Concatenates ``tensor`` from all workers along axis 0 (rank order).

    Every worker must call it at the same point with the same ``name``; with
    one worker it returns ``tensor`` unchanged.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt import _hvd
    >>> _hvd.allgather(tf.constant([0.5])).shape[0] == _hvd.size()
    True
    """
    if size() == 1:
        return tensor
    return hvd.allgather(tensor, name=name)


def host_allreduce_mean(values, name):
    """Averages a small float64 vector over all workers, from host code.

    For callbacks that must agree on host-side measurements (such as step
    times) before deciding. Every rank must call it at the same point with
    the same ``name`` and length. Returns a numpy array.
    """
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    if size() == 1:
        return values
    import tensorflow as tf

    return hvd.allreduce(tf.constant(values), op=hvd.Average, name=name).numpy()
