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


def squared_norms(tensors):
    """Sums of squares of a list of tensors in one fused kernel.

    Args:
        tensors: a non-empty list of float32, float16 or bfloat16 tensors of
            any shapes (empty tensors and scalars included; dtypes may mix).

    Returns:
        ``(per_tensor, total)``: a float32 vector with ``sum(t**2)`` of each
        tensor and their float32 sum. The compiled kernel accumulates in
        double precision; if it is not available the pure-TF twin is used.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.ops import squared_norms
    >>> per_tensor, total = squared_norms([tf.constant([3.0, 4.0]), tf.zeros([0])])
    >>> per_tensor.numpy().tolist(), float(total)
    ([25.0, 0.0], 25.0)
    """
    tensors = _as_tensors(tensors)
    module = _loader.load()
    if module is None:
        return squared_norms_twin(tensors)
    per_tensor, total = module.keras_adapt_squared_norms(tensors)
    return per_tensor, total
