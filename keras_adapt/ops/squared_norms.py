"""Fused squared norms of many tensors (the gradient monitor's hot path)."""

import tensorflow as tf

from keras_adapt.ops import _loader

SUPPORTED_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _as_tensors(tensors):
    if isinstance(tensors, (tf.Tensor, tf.Variable)):
        raise TypeError(
            "squared_norms expects a list of tensors, got a single tensor; "
            "wrap it in a list: squared_norms([t])"
        )
    out = [tf.convert_to_tensor(t) for t in tensors]
    if not out:
        raise ValueError("squared_norms needs at least one tensor, got an empty list")
    for i, t in enumerate(out):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"squared_norms: tensor {i} has dtype {t.dtype.name}; supported "
                "dtypes are float32, float16 and bfloat16 (cast it first)"
            )
    return out


def squared_norms_twin(tensors):
    """Pure-TensorFlow twin of :func:`squared_norms` (same signature and outputs).

    Accumulates each tensor in float32 (float16 and bfloat16 inputs are cast
    first, so they do not overflow at their own range).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.ops import squared_norms_twin
    >>> per_tensor, total = squared_norms_twin([tf.constant([3.0, 4.0])])
    >>> float(total)
    25.0
    """
    tensors = _as_tensors(tensors)
    per_tensor = tf.stack(
        [tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors]
    )
    return per_tensor, tf.reduce_sum(per_tensor)


def _scope_device():
    """The device of the enclosing ``tf.device`` scope, read at trace time
    from a probe op ("" when there is none; eagerly, where it ran)."""
    with tf.name_scope("device_probe"):
        return tf.zeros([]).device


def placement(tensors):
    """Where ``squared_norms(tensors)`` would run its kernel: ``"native"`` or ``"twin"``.

    The compiled kernel is CPU-only, so under ``KERAS_ADAPT_OPS=auto`` tensors
    on a GPU (or TPU) get the twin, which runs where they are; see
    :mod:`keras_adapt.ops._loader` for how the devices are found.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt import ops
    >>> with tf.device("/CPU:0"):
    ...     t = tf.ones([3])
    >>> ops.placement([t]) == ops.implementation()
    True
    """
    tensors = _as_tensors(tensors)
    if _loader.load() is None:
        return "twin"
    names = [t.device for t in tensors]
    scope = "" if all(names) else _scope_device()
    return "native" if _loader.native_fits(names, scope) else "twin"


def squared_norms(tensors):
    """Sums of squares of a list of tensors in one fused kernel.

    Args:
        tensors: a non-empty list of float32, float16 or bfloat16 tensors of
            any shapes (empty tensors and scalars included; dtypes may mix).

    Returns:
        ``(per_tensor, total)``: a float32 vector with ``sum(t**2)`` of each
        tensor and their float32 sum. The compiled kernel accumulates in
        double precision; it runs on CPU tensors, and the pure-TF twin runs
        on tensors on other devices (or when the kernel is not available).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.ops import squared_norms
    >>> per_tensor, total = squared_norms([tf.constant([3.0, 4.0]), tf.zeros([0])])
    >>> per_tensor.numpy().tolist(), float(total)
    ([25.0, 0.0], 25.0)
    """
    tensors = _as_tensors(tensors)
    # One name scope for every op that reads whole gradients for the
    # statistics, so their placement can be read back (tests/test_gpu.py).
    with tf.name_scope("squared_norms"):
        if placement(tensors) == "twin":
            return squared_norms_twin(tensors)
        per_tensor, total = _loader.load().keras_adapt_squared_norms(tensors)
    return per_tensor, total
