"""keras-adapt's TensorFlow ops: compiled C++ kernels with pure-TF twins.

Every op here has two implementations with the same signature and results:
the compiled kernel from ``csrc/`` (CPU only) and a pure-TensorFlow twin
(any device). Whether the kernel is loaded is decided once per process
(:func:`implementation`); which one runs on given tensors is decided when
they are traced, from their devices (:func:`placement`): the twin for
tensors on a GPU, so gradients are never copied to the host (see
:mod:`keras_adapt.ops._loader`).

Example:

>>> import tensorflow as tf
>>> from keras_adapt import ops
>>> per_tensor, total = ops.squared_norms([tf.ones([2, 3]), tf.constant([2.0])])
>>> per_tensor.numpy().tolist(), float(total)
([6.0, 4.0], 10.0)
"""

import contextlib

from keras_adapt.ops import _loader
from keras_adapt.ops.squared_norms import placement, squared_norms, squared_norms_twin


def implementation():
    """Which implementation the ops use in this process for CPU tensors: ``"native"`` or ``"twin"``.

    Example:

    >>> from keras_adapt import ops
    >>> ops.implementation() in ("native", "twin")
    True
    """
    return "native" if _loader.load() is not None else "twin"


@contextlib.contextmanager
def use_implementation(name):
    """Temporarily forces ``"native"`` or ``"twin"`` for ops traced inside the block.

    The choice is read when a function is traced, so wrap the first call of
    a ``tf.function`` (or the first ``fit``). Used by the benchmarks to time
    both implementations in one process.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt import ops
    >>> with ops.use_implementation("twin"):
    ...     ops.implementation()
    'twin'
    """
    with _loader.forced(name):
        yield


__all__ = ["implementation", "placement", "squared_norms", "squared_norms_twin",
           "use_implementation"]
