"""broadcast_variables: every worker takes one rank's values of the same variables."""

import tensorflow as tf

from keras_adapt import _hvd


def broadcast_variables(variables, root_rank=0):
    """Overwrites ``variables`` on every worker with their values on ``root_rank``.

    Built on ``horovod.tensorflow.broadcast`` in one ``tf.function`` so Horovod
    can fuse the tensors. Every worker must call it with the same variables in
    the same order.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.callbacks import broadcast_variables
    >>> v = tf.Variable([1.0, 2.0])
    >>> broadcast_variables([v], root_rank=0)   # a no-op with one worker
    >>> v.numpy().tolist()
    [1.0, 2.0]
    """
    variables = [_tf_variable(v) for v in variables]
    if _hvd.size() == 1 or not variables:
        return
    _broadcast(variables, root_rank, _hvd.collective_delay_ms())


def _tf_variable(v):
    """The ``tf.Variable`` of a variable: itself, or a Keras 3 variable's ``value``."""
    return v if isinstance(v, tf.Variable) else v.value


# One function for every call: the variables are its arguments, so it is
# traced once per signature (their count, dtypes and, generalised, shapes)
# and not once per call, which TensorFlow warns about when fit is repeated.
# The slow-network hook's delay is built into the trace, so it is an argument
# too: a process that changes it between fits gets a new trace.
@tf.function(reduce_retracing=True)
def _broadcast(variables, root_rank, delay_ms):
    for i, v in enumerate(variables):
        v.assign(_hvd.broadcast(tf.convert_to_tensor(v), root_rank,
                                name=f"keras_adapt_bcast_{i}", delay_ms=delay_ms))
