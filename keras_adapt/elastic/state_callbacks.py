"""Horovod's elastic Keras callbacks, for keras-adapt on both stacks.

The three callbacks may be given in any order: the commit waits for the
start of the next step (or epoch, or the end of training), by when the
position callbacks have recorded the step that just ended.
"""

import collections
import math
import time

import keras
import numpy as np
from horovod.common.exceptions import HostsUpdatedInterrupt

from keras_adapt.checks import check_int
from keras_adapt.elastic import disk_checkpoint
from keras_adapt.monitors import step_pauses
from keras_adapt.optimizer import UpdateBoundary

#: ``batches_per_commit="auto"`` (the default) commits every this many steps
#: until it has measured :data:`AUTO_MEASURED_COMMITS` commits of this ``fit``.
AUTO_FIRST_INTERVAL = 10
#: "auto" chooses the interval after this many commits of a ``fit``, and
#: again after every this many more.
AUTO_MEASURED_COMMITS = 3
#: The most recent commit and step times "auto" takes the means of.
AUTO_WINDOW = 1000
#: The share of the step time "auto" aims the commits at: half of the 1%
#: budget, the margin for what its rule does not see (the first commits of
#: each ``fit``, every :data:`AUTO_FIRST_INTERVAL` steps, the commit at each
#: epoch's end, and commit times that move by a factor of two between
#: measurements on a loaded machine).
AUTO_MAX_COST = 0.005
#: The longest interval "auto" chooses: a failure loses at most this many
#: steps (when it caps the interval, commits cost more than
#: :data:`AUTO_MAX_COST`; give ``batches_per_commit`` an int to choose the
#: other side of that trade).
AUTO_MAX_INTERVAL = 1000


def auto_interval(commit_seconds, step_seconds, max_cost=AUTO_MAX_COST,
                  max_interval=AUTO_MAX_INTERVAL):
    """The fewest steps between commits that keeps a commit of
    ``commit_seconds`` under ``max_cost`` of the time of the steps it follows
    (``step_seconds`` each), at most ``max_interval``.

    Example:

    >>> from keras_adapt.elastic.state_callbacks import auto_interval
    >>> auto_interval(0.006, 0.003)      # a 6 ms commit after 3 ms steps: 400 steps
    400
    >>> auto_interval(0.006, 0.5)        # after 0.5 s steps: every 3 steps
    3
    """
    if not (commit_seconds >= 0.0 and step_seconds > 0.0):
        return AUTO_FIRST_INTERVAL
    k = math.ceil(commit_seconds / (max_cost * step_seconds) - 1e-9)
    return int(min(max(k, 1), max_interval))


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` steps and at each
    epoch's end (Horovod's name).

    A commit copies the state to host memory and checks, with one small
    broadcast, whether workers are about to come or go; if so every rank
    leaves ``fit`` at the same step and the elastic run re-forms the job.
    A worker that fails loses the steps since the last commit.

    Commits come only between optimizer updates: with gradient
    accumulation (k micro-steps per update) a commit that falls due inside
    an update waits for its last micro-step, so neither a change of workers
    nor a restore ever cuts an update in two.

    Args:
        state: the :class:`~keras_adapt.elastic.KerasState`.
        batches_per_commit: steps between commits, or ``"auto"`` (the
            default): every :data:`AUTO_FIRST_INTERVAL` steps at first, then,
            after :data:`AUTO_MEASURED_COMMITS` commits of each ``fit`` and
            again after every :data:`AUTO_MEASURED_COMMITS` more, the
            interval that keeps commits under :data:`AUTO_MAX_COST` (0.5%)
            of the step time
            (:func:`auto_interval` of the mean commit and step times of the
            fit so far, its first step, the trace, left out; the last
            :data:`AUTO_WINDOW` of each: their total
            is what commits cost; the largest over the workers, by one
            allreduce, so every rank commits at the same steps).

    A :class:`~keras_adapt.callbacks.PreemptionCheckpoint` with a
    ``save_freq`` handed over by :meth:`save_to` (:func:`~keras_adapt.elastic.fit`
    does it) is written to disk by rank 0 right after the commits at its
    schedule: a commit is also made at every ``save_freq``-th optimizer
    update (``"epoch"``: the commit at each epoch's end), and once it
    returns, or once every rank has agreed that workers come or go (the
    state was saved), the checkpoint holds that committed position. The
    write runs no collective, so a worker that joins later runs nothing the
    others do not; its time is not counted in :attr:`commit_seconds`.

    Attributes:
        checkpoint: the periodic disk checkpoint (None: none).
        commits: commits made so far.
        commit_seconds: the time they took in all (their cost to training).
        interval: the steps between commits now.
        measured: ``(commit_seconds, step_seconds)``, the largest of the
            workers' mean commit and step times from which "auto" last chose ``interval``
            in this ``fit`` (None before it chose).

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.elastic import KerasState, CommitStateCallback
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    >>> cb = CommitStateCallback(KerasState(model))
    >>> cb.batches_per_commit, cb.interval
    ('auto', 10)
    """

    def __init__(self, state, batches_per_commit="auto"):
        super().__init__()
        if not hasattr(state, "commit"):
            raise TypeError(f"state must be an elastic state (KerasState), got {state!r}")
        k = batches_per_commit
        if k != "auto":
            k = check_int("batches_per_commit", k, fix="use a positive int "
                          "or 'auto' (the default)")
        self.state = state
        self.checkpoint = None
        self.batches_per_commit = k
        self.interval = AUTO_FIRST_INTERVAL if k == "auto" else k
        self.commits = 0
        self.commit_seconds = 0.0
        self.measured = None
        self._since = 0
        self._due = False
        self._boundary = None
        self._at_boundary = True
        self._fit_commits = 0
        self._commit_times = collections.deque(maxlen=AUTO_WINDOW)
        self._step_times = collections.deque(maxlen=AUTO_WINDOW)
        self._step_start = None
        self._updates = None  # optimizer updates done (counted when a checkpoint needs them)
        self._traced = False  # the fit's first step (its trace) has been timed
        self._write = False  # the checkpoint is written after the next commit

    def save_to(self, checkpoint):
        """Writes ``checkpoint`` (a :class:`~keras_adapt.callbacks.PreemptionCheckpoint`
        made with ``save_freq``, bound to this state) after the commits of
        its schedule (see above).

        Example:

        >>> import tempfile, keras, keras_adapt
        >>> from keras_adapt.callbacks import PreemptionCheckpoint
        >>> from keras_adapt.elastic import KerasState, CommitStateCallback
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> cb = CommitStateCallback(KerasState(model))
        >>> cb.save_to(PreemptionCheckpoint(tempfile.mkdtemp(), save_freq=100))
        >>> cb.checkpoint.save_freq
        100
        """
        if checkpoint.save_freq is None:
            raise ValueError("the checkpoint has save_freq=None (written on preemption only); "
                             "give it save_freq=<updates> or 'epoch' to write it periodically")
        self.checkpoint = checkpoint

    def _commit_if_due(self):
        if not self._due:
            return
        self._due = False
        self.commits += 1
        start = time.perf_counter()
        agreed = False  # the state is saved and every rank passed the check
        try:
            with step_pauses.paused():  # every rank alike: not step time
                self.state.commit()
            agreed = True
        except HostsUpdatedInterrupt:  # all ranks agreed to re-form the job here
            agreed = True
            raise
        finally:
            took = time.perf_counter() - start
            self.commit_seconds += took
            if agreed:
                self._write_checkpoint()
        if self.batches_per_commit == "auto":
            self._commit_times.append(took)
            self._fit_commits += 1
            if self._fit_commits % AUTO_MEASURED_COMMITS == 0:
                start = time.perf_counter()
                self._choose_interval()
                self.commit_seconds += time.perf_counter() - start  # part of the cost

    def _write_checkpoint(self):
        if self._write:
            self._write = False
            disk_checkpoint.save(self.checkpoint, self.state)

    def _choose_interval(self):
        """Every rank runs this at the same commit: one allreduce takes the
        largest of the workers' mean times (a commit costs the job what it
        costs its slowest rank), so all choose the same interval."""
        from keras_adapt import _hvd

        commit_s, step_s = _hvd.host_allreduce_max(
            [np.mean(self._commit_times), np.mean(self._step_times or [0.0])],
            name="keras_adapt_commit_interval")
        self.measured = (float(commit_s), float(step_s))
        self.interval = auto_interval(*self.measured)

    def on_train_begin(self, logs=None):
        # The same count on every rank after a reset; "auto" measures anew
        # (the worker count, and with it the step time, may have changed).
        self._since = 0
        self._due = False
        self._step_start = None
        self._boundary = UpdateBoundary(self.state.optimizer)
        self._at_boundary = True
        self._write = False
        self._updates = None
        self._traced = False
        if self.checkpoint is not None and self.checkpoint.save_freq != "epoch":
            self._updates = int(self.state.optimizer.iterations.numpy())
        if self.batches_per_commit == "auto":
            self.interval = AUTO_FIRST_INTERVAL
            self.measured = None
            self._fit_commits = 0
            self._commit_times = collections.deque(maxlen=AUTO_WINDOW)
            self._step_times = collections.deque(maxlen=AUTO_WINDOW)

    def on_train_batch_begin(self, batch, logs=None):
        # A step's time: from the start of one step to the start of the next
        # (every callback included), before the commit that may come between.
        # The first step of a fit is not one: it traces the train function
        # (seconds), which would shorten the interval for AUTO_WINDOW steps.
        now = time.perf_counter()
        if self._step_start is not None and self.batches_per_commit == "auto":
            if self._traced:
                self._step_times.append(now - self._step_start)
            self._traced = True
        self._commit_if_due()
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.state.step_finished()
        self._at_boundary = self._boundary.step_ended()
        self._since += 1
        if self._since >= self.interval and self._at_boundary:
            self._since = 0
            self._due = True
        if self._updates is not None and self._at_boundary:
            self._updates += 1
            if self.checkpoint.periodic_due(self._updates):
                self._due = self._write = True

    def on_epoch_begin(self, epoch, logs=None):
        self._step_start = None
        self._commit_if_due()

    def on_epoch_end(self, epoch, logs=None):
        if self._at_boundary:
            self._since = 0
            self._due = True
        else:  # an update spans the epoch's end: commit after its last micro-step
            self._since = self.interval
        if self.checkpoint is not None and self.checkpoint.save_freq == "epoch":
            self._write = True

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
