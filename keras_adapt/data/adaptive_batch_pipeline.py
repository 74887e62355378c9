"""AdaptiveBatchPipeline: batches your own tf.data pipeline with a size policies can change."""

import threading

import numpy as np
import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.checks import check_bool, check_int, invalid


class AdaptiveBatchPipeline:
    """Batches a user's *unbatched* ``tf.data.Dataset`` with a changeable micro-batch size.

    Put it where ``.batch(b)`` would go in your pipeline: after your own
    ``shard``, ``map``, ``cache``, ``shuffle`` and ``prefetch``, which all act
    on single examples. The batches it forms have the *current*
    :attr:`micro_batch_size`, which a policy (through
    :class:`keras_adapt.actuators.GlobalBatchSize`) may change while ``fit``
    runs.

    **When a new size applies.** Batches are numbered 0, 1, 2, ... in the
    order this object forms them (counting across iterators and ``fit``
    calls). Each change is recorded in :attr:`changes` as ``(s, m)``: "from
    batch s on, the size is m", where s is the first batch not yet formed
    when the size was set. A batch's size is fixed the moment it is formed
    (:meth:`size_of` is a pure function of its number) and never read again,
    so tf.data's asynchronous iteration cannot blur the switch. The
    pipeline forms a batch only when training asks for it: nothing after
    it may read ahead (do not ``prefetch`` after it; its output turns off
    tf.data's automatic prefetch injection, and neither Keras 3 nor
    tf.keras 2 buffers a ``tf.data.Dataset``). A size set between two steps
    therefore applies from the very next step, on every rank. With several
    workers a change is a collective: set it at the same point on every
    rank (policies do); it checks that every rank switches at the same
    batch s, and otherwise raises a clear error on every rank and records
    nothing (only buffering after the pipeline can cause that).

    **Passes and sharding.** Each worker reads its own data: shard before
    the pipeline (``ds.shard(num_workers, rank)``, or a disjoint list of
    files per worker). With ``repeat=True`` (default) the pipeline repeats
    your dataset without end, so a batch may span two passes and no example
    is lost or repeated within a pass; give ``fit`` a ``steps_per_epoch``.
    An uneven split cannot stall the job then, since every worker always
    has a next batch. With ``repeat=False`` an iterator makes one pass and
    its last batch holds the remainder; every worker must then form the same
    number of batches (equal shards).

    Args:
        dataset: an unbatched ``tf.data.Dataset`` of examples (a tensor, or
            a tuple/dict of tensors such as ``(x, y)``).
        micro_batch_size: initial per-worker batch size.
        repeat: stream endlessly (True) or one pass per iterator (False).
        prefetch: examples buffered in front of the batching (0: none).
            Prefetching belongs here or earlier in your pipeline, never
            after this object.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.data import AdaptiveBatchPipeline
    >>> examples = tf.data.Dataset.range(10).map(lambda i: (i, 2 * i))
    >>> pipeline = AdaptiveBatchPipeline(examples, micro_batch_size=4)
    >>> it = iter(pipeline.dataset)
    >>> [int(v) for v in next(it)[0]]
    [0, 1, 2, 3]
    >>> pipeline.micro_batch_size = 6     # e.g. set by a policy between two steps
    >>> [int(v) for v in next(it)[0]]     # the stream wraps into the next pass
    [4, 5, 6, 7, 8, 9]
    >>> pipeline.changes, pipeline.size_of(0), pipeline.size_of(1)
    ([(1, 6)], 4, 6)
    """

    #: Largest micro-batch the data can give (None: no limit from the data).
    micro_batch_limit = None

    def __init__(self, dataset, micro_batch_size, repeat=True, prefetch=0):
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"dataset must be a tf.data.Dataset of single examples, got "
                f"{type(dataset).__name__}; for in-memory arrays use "
                "keras_adapt.data.AdaptiveBatchDataset(x, y, ...)"
            )
        check_bool("repeat", repeat)
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or (
                prefetch < 0 and prefetch != tf.data.AUTOTUNE):
            raise invalid(
                "prefetch", prefetch, "use an int >= 0 (examples to buffer) "
                "or tf.data.AUTOTUNE"
            )
        self.initial_micro_batch_size = check_int("micro_batch_size", micro_batch_size)
        self.repeat = repeat
        self.prefetch = int(prefetch)
        self._examples = dataset
        self._lock = threading.Lock()
        self._schedule = [(0, self.initial_micro_batch_size)]
        self._formed = 0
        self._dataset = None

    # -- the size schedule ---------------------------------------------------
    @property
    def micro_batch_size(self):
        """The size of every batch formed from now on (settable)."""
        return self._schedule[-1][1]

    @micro_batch_size.setter
    def micro_batch_size(self, value):
        # Every rank calls this at the same point: it gathers the start.
        value = check_int("micro_batch_size", value)
        # The lock holds back the pipeline while the change is agreed, so no
        # batch is formed between choosing its start and recording it.
        with self._lock:
            if value == self._schedule[-1][1]:
                return
            start = self._formed
            self._check_ranks_agree(start, value)
            self._schedule.append((start, value))  # a later entry overrides

    def _check_ranks_agree(self, start, value):
        if _hvd.size() == 1:
            return
        starts = _hvd.allgather(tf.constant([start], tf.int64),
                                name=f"keras_adapt_pipeline_switch_{len(self._schedule)}").numpy()
        if len(set(starts.tolist())) > 1:
            raise RuntimeError(
                f"AdaptiveBatchPipeline: the ranks would switch to micro_batch_size="
                f"{value} at different batches {starts.tolist()} (one per "
                "rank), because something formed batches ahead of training on some rank. "
                "Remove any .prefetch() (or other buffering) applied after the pipeline: "
                "prefetch examples before it, or use AdaptiveBatchPipeline(..., prefetch=N)."
            )

    @property
    def changes(self):
        """``[(s, m), ...]``: from batch s on, the size is m (every change)."""
        return list(self._schedule[1:])

    @property
    def batches(self):
        """Batches formed so far (the number of the next batch)."""
        return self._formed

    def size_of(self, batch):
        """The size of batch number ``batch``, from the recorded changes."""
        size = self.initial_micro_batch_size
        for start, value in self._schedule:
            if start > batch:
                break
            size = value
        return size

    def _form_next(self):
        # Called by the pipeline once per batch, when its first example
        # arrives: the batch's number and size are fixed here.
        with self._lock:
            batch = self._formed
            self._formed += 1
            return np.array([batch, self.size_of(batch)], np.int64)

    # -- the tf.data pipeline ------------------------------------------------
    @property
    def dataset(self):
        """The ``tf.data.Dataset`` of micro-batches to give ``fit``."""
        if self._dataset is None:
            self._dataset = self._build()
        return self._dataset

    def _build(self):
        examples = self._examples.repeat() if self.repeat else self._examples
        if self.prefetch:
            examples = examples.prefetch(self.prefetch)
        zero = tf.constant(0, tf.int64)

        def form_next():
            formed = tf.reshape(tf.py_function(self._form_next, [], tf.int64), [2])
            return formed[0], formed[1]

        def size_of(batch):
            size = tf.py_function(lambda b: np.int64(self.size_of(int(b))), [batch], tf.int64)
            return tf.reshape(size, [])

        def number(state, example):
            # state: (position in the batch, the batch's number, its size).
            # Number and size come from the host once, when the batch's
            # first example has arrived (never for an example that does not
            # exist), so numbering continues across iterators and fit() calls.
            position, batch, size = state
            batch, size = tf.cond(tf.equal(position, 0), form_next, lambda: (batch, size))
            position = tf.where(position + 1 >= size, zero, position + 1)
            return (position, batch, size), (example, batch)

        def key(_, batch):
            return batch

        def reduce(batch, window):
            return window.batch(size_of(batch)).map(no_autograph(drop_numbers))

        def drop_numbers(examples, _):
            return examples

        # Plain tensor code: no AutoGraph conversion (which reads the source).
        no_autograph = tf.autograph.experimental.do_not_convert
        batches = examples.scan((zero, zero, zero), no_autograph(number)).group_by_window(
            key_func=no_autograph(key), reduce_func=no_autograph(reduce),
            window_size_func=no_autograph(size_of))
        options = tf.data.Options()
        # No prefetch injected after the batching: a batch is formed only
        # when a step asks for it.
        options.experimental_optimization.inject_prefetch = False
        return batches.with_options(options)
