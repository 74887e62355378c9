"""CheckpointFiles: keras-adapt's checkpoints of a run in one directory: listed, read, written, loaded."""

import json
import os
import time
import warnings

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt._train_step import drop_train_function
from keras_adapt.checks import check_int
from keras_adapt.optimizer import build_slots


class CheckpointFiles:
    """The checkpoints of one directory, in keras-adapt's format: the
    position a rerun resumes at, with everything needed to continue there.

    A checkpoint is a ``tf.train.CheckpointManager`` checkpoint named
    ``ckpt-<optimizer iterations>``. It holds the model, the optimizer
    (slots, ``iterations``), keras-adapt's state
    (``optimizer.adapt_state.checkpoint_variables()``), the epoch and the
    step within it, and a JSON ``meta`` (:meth:`read_meta`): that position,
    the optimizer step, the worker count, the gradients' compression (once
    its switch is enabled), the synchronisation strategy
    chosen, the data position of an
    :class:`~keras_adapt.data.AdaptiveBatchDataset` and the ``get_state()``
    of the policies. It is written atomically: the data and index files
    under temporary names, then the ``checkpoint`` file that lists it.
    :class:`~keras_adapt.callbacks.PreemptionCheckpoint` writes and
    resumes them, under ``model.fit`` and under ``keras_adapt.elastic``.

    Args:
        directory: where the checkpoints go (made when the first is written).
        max_to_keep: checkpoints kept (>= 2 keeps a fallback).

    Example:

    >>> import tempfile, keras, keras_adapt
    >>> from keras_adapt.checkpointing import CheckpointFiles
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> files = CheckpointFiles(tempfile.mkdtemp())
    >>> files.attach(model)
    >>> path = files.write(epoch=1, step_in_epoch=3)
    >>> files.position(), files.latest()[0] == path, files.read_meta(path)["workers"]
    ((1, 3), True, 1)
    """

    def __init__(self, directory, max_to_keep=2):
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path, got {directory!r}")
        self.directory = os.fspath(directory)
        self.max_to_keep = check_int("max_to_keep", max_to_keep)
        self._model = None
        self._checkpoint = None
        self._manager = None
        self._meta = None
        self._epoch_var = None
        self._step_var = None

    # -- reading the directory ---------------------------------------------
    def checkpoints(self):
        """The checkpoint paths listed in ``directory``, oldest first.

        Example:

        >>> import tempfile
        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> CheckpointFiles(tempfile.mkdtemp()).checkpoints()
        []
        """
        state = tf.train.get_checkpoint_state(self.directory)
        if state is None:
            return []
        return [p if os.path.isabs(p) else os.path.join(self.directory, p)
                for p in state.all_model_checkpoint_paths]

    @staticmethod
    def read_meta(path):
        """The position and host state stored in checkpoint ``path`` (a dict),
        after reading every tensor of it: a damaged checkpoint raises here.

        Example:

        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> CheckpointFiles.read_meta("/nonexistent/ckpt-1")
        Traceback (most recent call last):
        ...
        ValueError: checkpoint /nonexistent/ckpt-1 cannot be read: NotFoundError
        """
        try:
            reader = tf.train.load_checkpoint(path)
            meta = None
            for key in reader.get_variable_to_shape_map():
                value = reader.get_tensor(key)  # checks each tensor's checksum
                if key.startswith("meta/"):
                    meta = value
        except Exception as exc:  # noqa: BLE001 - any damage means "not usable"
            raise ValueError(f"checkpoint {path} cannot be read: {type(exc).__name__}") from exc
        if meta is None:
            raise ValueError(f"checkpoint {path} holds no keras-adapt position (not written "
                             "by PreemptionCheckpoint)")
        return json.loads(meta.decode() if isinstance(meta, bytes) else meta)

    def latest(self):
        """``(path, meta)`` of the newest readable checkpoint, or None.

        A damaged newer one gives a warning naming it, and the one before is
        used. Every rank that calls it reads ``directory`` itself.

        Example:

        >>> import tempfile
        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> CheckpointFiles(tempfile.mkdtemp()).latest() is None
        True
        """
        for path in reversed(self.checkpoints()):
            try:
                return path, self.read_meta(path)
            except ValueError as exc:
                warnings.warn(f"keras-adapt: {exc}; using the checkpoint before it",
                              RuntimeWarning, stacklevel=2)
        return None

    def position(self):
        """``(epoch, step in epoch)`` where a rerun resumes (``(0, 0)`` without a checkpoint).

        Example:

        >>> import tempfile
        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> CheckpointFiles(tempfile.mkdtemp()).position()
        (0, 0)
        """
        found = self.latest()
        if found is None:
            return 0, 0
        return found[1]["epoch"], found[1]["step_in_epoch"]

    # -- writing and loading -------------------------------------------------
    def attach(self, model):
        """Makes the checkpoints hold ``model`` (built, compiled with a
        keras-adapt optimizer): its weights, its optimizer and keras-adapt's
        variables. Again with the same model: nothing changes.

        Example:

        >>> import tempfile, keras, keras_adapt
        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> CheckpointFiles(tempfile.mkdtemp()).attach(model)
        """
        if self._checkpoint is not None and self._model is model:
            return
        optimizer = model.optimizer
        with tf.init_scope():
            self._epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._meta = tf.Variable("", dtype=tf.string, trainable=False)
        adapt = tf.train.Checkpoint(**optimizer.adapt_state.checkpoint_variables())
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, adapt=adapt,
                                               epoch=self._epoch_var, step=self._step_var,
                                               meta=self._meta)
        self._model = model
        self._manager = None  # made by the rank that writes, when it first does

    def write(self, epoch, step_in_epoch, dataset=None, policies=()):
        """Rank 0 writes a checkpoint of the attached model at ``(epoch,
        step_in_epoch)``, with the position of ``dataset`` (an
        :class:`~keras_adapt.data.AdaptiveBatchDataset`, or None) and the
        ``get_state()`` of ``policies``; returns its path (None on the other
        ranks, which write nothing and wait for nothing).

        Example: see :class:`CheckpointFiles`.
        """
        if _hvd.rank() != 0:
            return None
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory,
                                                       max_to_keep=self.max_to_keep)
        self._epoch_var.assign(epoch)
        self._step_var.assign(step_in_epoch)
        optimizer = self._model.optimizer
        self._meta.assign(json.dumps({
            "epoch": int(epoch), "step_in_epoch": int(step_in_epoch),
            "step": _step(self._model), "workers": _hvd.size(), "wall_time": time.time(),
            "sync": optimizer.adapt_state.sync.get_state(),
            "compression": optimizer.adapt_state.compression.get_state(),
            "data": None if dataset is None else dataset.get_state(),
            "policies": [{"class": type(p).__name__, "state": p.get_state()} for p in policies],
        }))
        return self._manager.save(checkpoint_number=_step(self._model))

    def load(self, path, meta):
        """Restores the attached model, its optimizer, keras-adapt's
        variables and the synchronisation strategy's choice from ``path``
        (whose :meth:`read_meta` is ``meta``); no collective. The data
        position and the policies' states are the caller's to apply
        (:meth:`policy_states`).

        Example:

        >>> import tempfile, numpy as np, keras, keras_adapt
        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
        >>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
        >>> files = CheckpointFiles(tempfile.mkdtemp())
        >>> files.attach(model)
        >>> path = files.write(1, 0)
        >>> saved = model.get_weights()
        >>> model.set_weights([np.zeros_like(w) for w in saved])
        >>> files.load(*files.latest())
        >>> all(np.array_equal(a, b) for a, b in zip(model.get_weights(), saved))
        True
        """
        model = self._model
        if not getattr(model, "built", True) or not model.trainable_variables:
            raise ValueError(
                f"cannot resume from {path}: the model has no weights yet (built lazily). "
                "Give it a keras.Input or call model.build(input_shape) before fit")
        optimizer = model.optimizer
        # The choice first (its variables are then overwritten by the saved ones).
        optimizer.adapt_state.sync.set_state(meta["sync"])
        if optimizer.adapt_state.compression.set_state(meta.get("compression")):
            drop_train_function(model, "restoring the gradients' compression")  # both reductions
        build_slots(optimizer, model.trainable_variables)
        try:
            self._checkpoint.restore(path).assert_existing_objects_matched()
        except AssertionError as exc:
            message = str(exc).strip()
            first = message.splitlines()[0] if message else type(exc).__name__
            raise ValueError(
                f"checkpoint {path} does not hold all of this run's state ({first}): resume "
                "with the model, the DistributedOptimizer settings (gradient_stats, "
                "backward_passes_per_step, sync_strategy) and the keras-adapt version that "
                f"wrote it, or start afresh with another directory than {self.directory}"
            ) from exc
        acc = optimizer.adapt_state.accumulation
        if acc is not None:
            acc.steps_value = int(acc.steps.numpy())
        # As after an elastic sync: the next update enters the strategy again
        # from the restored model (BMUF's and EASGD's own models restart there).
        optimizer.adapt_state.sync.rejoin()

    @staticmethod
    def policy_states(path, meta, policies):
        """The policies' states saved in checkpoint ``path`` (``meta``), one
        per policy of ``policies``, in order; a ``ValueError`` when the
        checkpoint holds another number of them.

        Example:

        >>> from keras_adapt.checkpointing import CheckpointFiles
        >>> meta = {"policies": [{"class": "GNSBatchSizePolicy", "state": {"batch_size": 64}}]}
        >>> CheckpointFiles.policy_states("ckpt-10", meta, ["policy"])
        [{'batch_size': 64}]
        """
        states = meta.get("policies", [])
        if len(states) != len(policies):
            raise ValueError(
                f"checkpoint {path} holds the state of {len(states)} policies "
                f"({', '.join(s['class'] for s in states) or 'none'}) but "
                f"{len(policies)} are given; resume with the same callbacks")
        return [saved["state"] for saved in states]


def _step(model):
    return int(model.optimizer.iterations.numpy())
