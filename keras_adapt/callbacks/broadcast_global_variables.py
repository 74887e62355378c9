"""BroadcastGlobalVariablesCallback: start every worker from rank 0's weights."""

import keras

from keras_adapt import _hvd
from keras_adapt.checks import check_int
from keras_adapt.coordination.broadcast import broadcast_variables
from keras_adapt.optimizer import WorkerLocalVariables, is_distributed, variable_key


def _variables(obj):
    if obj is None:
        return []
    v = getattr(obj, "variables", [])
    return list(v() if callable(v) else v)


def _check_local_variables(local_variables):
    if local_variables is None:
        return []
    if hasattr(local_variables, "assign"):
        local_variables = [local_variables]
    local_variables = list(local_variables)
    for v in local_variables:
        if not hasattr(v, "assign"):
            raise ValueError(
                f"local_variables must hold variables (tf.Variable or Keras variables); "
                f"got {type(v).__name__}: {v!r}"
            )
    return local_variables


def _keys(variables):
    keys = set()
    for v in variables:
        keys |= variable_key(v)
    return keys


def _is_built(model):
    """Whether the model's weights exist (a ``Sequential`` without ``Input``
    gets them only inside the first train step)."""
    return bool(getattr(model, "built", True))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's and the optimizer's variables from ``root_rank``.

    keras-adapt's own version of Horovod's callback, built on Horovod's core
    collectives so it also runs on Keras 3. Model and optimizer variables are
    broadcast at the start of training, so the first step already starts
    from identical weights on all ranks; after the first batch the variables
    created during it (optimizer slots made at the first trace, the weights
    of a model built lazily) are broadcast too. Variables broadcast at the
    start are not sent again: under S-SGD they stay equal, and under a local
    synchronisation strategy (``keras_adapt.sync``) each worker's first
    local step is its own. When the first update of a local strategy
    averages the weights and slots itself
    (``optimizer.adapt_state.sync.averages_next_update``), those are left to
    that averaging.

    A model whose weights are created lazily (a ``Sequential`` without an
    ``Input``, as in Horovod's MNIST example) has no weights at the start of
    training: its first step then runs from each rank's own initial weights
    (with the averaged gradient, as in Horovod), and the broadcast at the end
    of that step makes weights and optimizer slots identical on every rank
    from the second step on (under a local strategy used from the start, the
    first update averages the ranks' initial weights instead). Give the
    model an ``Input`` (or ``build`` it) for identical weights from the
    first step.

    Args:
        root_rank: the rank whose values everyone takes (usually 0).
        local_variables: variables (or one variable) to leave alone: each
            worker keeps its own values (Horovod's ``local_variables``;
            pair it with ``register_local_var`` on the optimizer).

    Example:

    >>> import keras, keras_adapt
    >>> cb = keras_adapt.callbacks.BroadcastGlobalVariablesCallback(root_rank=0)
    >>> cb.root_rank
    0
    """

    def __init__(self, root_rank=0, local_variables=None):
        super().__init__()
        self.root_rank = check_int("root_rank", root_rank, 0, fix="use a non-negative int "
                                   "smaller than the number of workers (usually 0)")
        self._local = WorkerLocalVariables()
        for v in _check_local_variables(local_variables):
            self._local.add(v)
        self._done = False
        self._sent = []
        # the SyncState whose next update averages the weights and slots itself
        self._averaging = None

    def register_local_var(self, var):
        """Leaves ``var`` out of the broadcast (Horovod's name).

        Example:

        >>> import tensorflow as tf, keras_adapt
        >>> cb = keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0)
        >>> cb.register_local_var(tf.Variable(1.0))
        """
        self._local.add(var)

    def _check_rank(self):
        if self.root_rank >= _hvd.size():
            raise ValueError(
                f"root_rank={self.root_rank} but only {_hvd.size()} workers run; "
                "use a rank between 0 and size-1"
            )

    def _global_variables(self):
        optimizer = getattr(self.model, "optimizer", None)
        variables = _variables(self.model) + _variables(optimizer)
        if self._local:
            variables = [v for v in variables if not self._local.contains(v)]
        return variables

    def on_train_begin(self, logs=None):
        self._check_rank()
        self._done = False
        self._sent = self._global_variables() if _is_built(self.model) else []
        broadcast_variables(self._sent, self.root_rank)
        optimizer = getattr(self.model, "optimizer", None)
        sync = optimizer.adapt_state.sync if is_distributed(optimizer) else None
        self._averaging = sync if sync is not None and sync.averages_next_update else None

    def on_train_batch_end(self, batch, logs=None):
        if self._done:
            return
        self._done = True
        skip = _keys(self._sent)
        if self._averaging is not None:  # the first update averaged these itself
            weights, slots = self._averaging.synchronized_variables()
            skip |= _keys(weights + slots)
        broadcast_variables([v for v in self._global_variables()
                             if not variable_key(v) & skip], self.root_rank)
        self._sent = []
