"""Horovod's elastic Keras callbacks, for keras-adapt on both stacks.

The three callbacks may be given in any order: the commit waits for the
start of the next step (or epoch, or the end of training), by when the
position callbacks have recorded the step that just ended.
"""

import keras

#: Default ``batches_per_commit``: a commit every this many steps costs
#: under 1% of the step time (measured in docs/elastic.md).
DEFAULT_BATCHES_PER_COMMIT = 10


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` steps and at each
    epoch's end (Horovod's name).

    A commit copies the state to host memory and checks, with one small
    broadcast, whether workers are about to come or go; if so every rank
    leaves ``fit`` at the same step and the elastic run re-forms the job.

    Args:
        state: the :class:`~keras_adapt.elastic.KerasState`.
        batches_per_commit: steps between commits (a worker failure loses
            at most this many steps).

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.elastic import KerasState, CommitStateCallback
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> CommitStateCallback(KerasState(model)).batches_per_commit
    10
    """

    def __init__(self, state, batches_per_commit=DEFAULT_BATCHES_PER_COMMIT):
        super().__init__()
        if not hasattr(state, "commit"):
            raise TypeError(f"state must be an elastic state (KerasState), got {state!r}")
        k = batches_per_commit
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"batches_per_commit={k!r} is not valid; use a positive int "
                             f"(default {DEFAULT_BATCHES_PER_COMMIT})")
        self.state = state
        self.batches_per_commit = k
        self.commits = 0
        self._since = 0
        self._due = False

    def _commit_if_due(self):
        if self._due:
            self._due = False
            self.commits += 1
            self.state.commit()

    def on_train_begin(self, logs=None):
        # The same count on every rank after a reset.
        self._since = 0
        self._due = False

    def on_train_batch_begin(self, batch, logs=None):
        self._commit_if_due()

    def on_train_batch_end(self, batch, logs=None):
        self.state.step_finished()
        self._since += 1
        if self._since >= self.batches_per_commit:
            self._since = 0
            self._due = True

    def on_epoch_begin(self, epoch, logs=None):
        self._commit_if_due()

    def on_epoch_end(self, epoch, logs=None):
        self._since = 0
        self._due = True

    def on_train_end(self, logs=None):
        self._commit_if_due()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the number of steps completed in the current
    epoch, counting the steps done before a reset (Horovod's name).

    Example:

    >>> import keras, keras_adapt, numpy as np
    >>> from keras_adapt.elastic import KerasState, UpdateBatchStateCallback
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> state = KerasState(model)
    >>> _ = model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=2, verbose=0,
    ...               callbacks=[UpdateBatchStateCallback(state)])
    >>> state.batch   # four steps, then the epoch ended
    0
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._offset = 0

    def on_train_begin(self, logs=None):
        # A fit that resumes mid-epoch starts after state.batch steps.
        self._offset = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1
        self.state.step_finished()

    def on_epoch_end(self, epoch, logs=None):
        self._offset = 0
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the number of epochs completed (Horovod's name).

    Horovod's version adds its starting epoch to the epoch Keras reports,
    which counts every epoch twice when ``fit`` is given
    ``initial_epoch=state.epoch`` (Horovod #2844). This one takes the
    offset from the first epoch ``fit`` reports, so both
    ``fit(initial_epoch=state.epoch, epochs=E)`` and Horovod's
    ``fit(epochs=E - state.epoch)`` count right.

    Example:

    >>> import keras, keras_adapt, numpy as np
    >>> from keras_adapt.elastic import KerasState, UpdateEpochStateCallback
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> state = KerasState(model, epoch=2)
    >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 1)), initial_epoch=state.epoch,
    ...               epochs=5, verbose=0, callbacks=[UpdateEpochStateCallback(state)])
    >>> state.epoch
    5
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._offset = None

    def on_train_begin(self, logs=None):
        self._offset = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._offset is None:
            self._offset = self.state.epoch - epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self._offset + epoch + 1
