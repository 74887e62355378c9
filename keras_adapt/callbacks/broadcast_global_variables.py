"""BroadcastGlobalVariablesCallback: start every worker from rank 0's weights."""

import keras
import tensorflow as tf

from keras_adapt import _hvd


def _variables(obj):
    if obj is None:
        return []
    v = getattr(obj, "variables", [])
    return list(v() if callable(v) else v)


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
    variables = list(variables)
    if _hvd.size() == 1 or not variables:
        return

    @tf.function
    def _broadcast():
        for i, v in enumerate(variables):
            v.assign(_hvd.broadcast(tf.convert_to_tensor(v), root_rank, name=f"keras_adapt_bcast_{i}"))

    _broadcast()


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's and the optimizer's variables from ``root_rank``.

    keras-adapt's own version of Horovod's callback, built on Horovod's core
    collectives so it also runs on Keras 3. Model weights are broadcast at the
    start of training, so the first step already starts from identical
    weights on all ranks; after the first batch everything is broadcast once
    more, including optimizer slots that Keras 2 creates lazily.

    Args:
        root_rank: the rank whose values everyone takes (usually 0).

    Example:

    >>> import keras, keras_adapt
    >>> cb = keras_adapt.callbacks.BroadcastGlobalVariablesCallback(root_rank=0)
    >>> cb.root_rank
    0
    """

    def __init__(self, root_rank=0):
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError(
                f"root_rank={root_rank!r} is not valid; use a non-negative int "
                "smaller than the number of workers (usually 0)"
            )
        self.root_rank = root_rank
        self._done = False

    def _check_rank(self):
        if self.root_rank >= _hvd.size():
            raise ValueError(
                f"root_rank={self.root_rank} but only {_hvd.size()} workers run; "
                "use a rank between 0 and size-1"
            )

    def _broadcast_all(self):
        optimizer = getattr(self.model, "optimizer", None)
        broadcast_variables(_variables(self.model) + _variables(optimizer), self.root_rank)

    def on_train_begin(self, logs=None):
        self._check_rank()
        self._done = False
        self._broadcast_all()

    def on_train_batch_end(self, batch, logs=None):
        if not self._done:
            self._done = True
            self._broadcast_all()
