"""fixed_batch_size: the micro-batch of an ordinary batched ``tf.data.Dataset``."""

import tensorflow as tf


def fixed_batch_size(dataset):
    """The batch size every element of a batched ``tf.data.Dataset`` has, or None.

    A dataset batched with ``.batch(b, drop_remainder=True)`` declares b as
    the first dimension of every component; with ``drop_remainder=False``
    (the last batch may be smaller) or before batching that dimension is
    unknown, and the result is None. Batch-size policies given such a
    dataset (``dataset=ds``) keep its micro-batch and change only the
    gradient-accumulation steps k.

    Args:
        dataset: a ``tf.data.Dataset``.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.data import fixed_batch_size
    >>> ds = tf.data.Dataset.range(100).map(lambda i: (i, i))
    >>> fixed_batch_size(ds.batch(32, drop_remainder=True)), fixed_batch_size(ds.batch(32))
    (32, None)
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    sizes = set()
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            return None
        sizes.add(shape[0])
    if len(sizes) != 1 or None in sizes:
        return None
    return int(sizes.pop())
