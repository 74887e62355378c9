"""AdaptiveBatchDataset: an input stream whose per-worker batch size can change."""

import numpy as np
import tensorflow as tf

from keras_adapt import _hvd


class AdaptiveBatchDataset:
    """A sharded, shuffled input stream whose micro-batch size can change while ``fit`` runs.

    Keras fixes the number of steps of an epoch when ``fit`` starts, so a
    dataset whose batches grow would run out of data (tf.keras 2 then stops
    training). This class therefore streams without end: it walks through
    seeded permutations of the data one pass after another, each worker
    taking its own equal share, and yields micro-batches of the *current*
    :attr:`micro_batch_size`. Pass ``steps_per_epoch=ds.steps_per_epoch`` to
    ``fit``: an epoch is then a fixed number of micro-steps (one pass at the
    initial micro-batch size) and :attr:`passes` says how much data was seen.

    A new size applies from the next batch produced. The stream has no
    prefetch, so when a callback sets it between steps, every rank switches
    at the same step (policies do so through
    :class:`keras_adapt.actuators.GlobalBatchSize`).

    Args:
        x: array (or tuple/dict of arrays) of inputs, first axis = samples.
        y: optional array of targets.
        micro_batch_size: initial per-worker batch size.
        shuffle: reshuffle the data each pass (seeded, identical on all ranks).
        seed: seed of the permutations.
        num_workers, rank: the sharding; default Horovod's size and rank.

    Example:

    >>> import numpy as np
    >>> from keras_adapt.data import AdaptiveBatchDataset
    >>> ds = AdaptiveBatchDataset(np.arange(20.0), np.arange(20.0), micro_batch_size=4,
    ...                           num_workers=1, rank=0, shuffle=False)
    >>> it = iter(ds.dataset)
    >>> [int(v) for v in next(it)[0]]
    [0, 1, 2, 3]
    >>> ds.micro_batch_size = 8
    >>> [int(v) for v in next(it)[0]]
    [4, 5, 6, 7, 8, 9, 10, 11]
    >>> ds.steps_per_epoch
    5
    """

    def __init__(self, x, y=None, micro_batch_size=32, shuffle=True, seed=0,
                 num_workers=None, rank=None):
        self._x = x
        self._y = y
        n = {len(a) for a in tf.nest.flatten(x)}
        if y is not None:
            n |= {len(a) for a in tf.nest.flatten(y)}
        if len(n) != 1:
            raise ValueError(
                f"x and y must have the same number of samples on the first axis; got {sorted(n)}"
            )
        self.num_samples = n.pop()
        self.num_workers = _hvd.size() if num_workers is None else int(num_workers)
        self.rank = _hvd.rank() if rank is None else int(rank)
        if not 0 <= self.rank < self.num_workers:
            raise ValueError(f"rank={rank!r} must be in [0, num_workers={self.num_workers})")
        self.shard_size = self.num_samples // self.num_workers
        if self.shard_size < 1:
            raise ValueError(
                f"{self.num_samples} samples cannot be shared by {self.num_workers} workers"
            )
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self._micro_batch_size = None
        self.micro_batch_size = micro_batch_size
        self.initial_micro_batch_size = self._micro_batch_size
        self.produced = 0  # micro-batches handed out so far
        self.samples = 0  # samples handed out so far by this worker
        self.changes = []  # (batch index, new size) of every change
        self._pass = 0
        self._order = None
        self._cursor = 0
        self._dataset = None

    @property
    def micro_batch_size(self):
        """The per-worker batch size of the next batch."""
        return self._micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"micro_batch_size={value!r} is not valid; use a positive int")
        if int(value) > self.shard_size:
            raise ValueError(
                f"micro_batch_size={value} is larger than this worker's share of the "
                f"data ({self.shard_size} samples); use at most {self.shard_size}"
            )
        if self._micro_batch_size is not None and int(value) != self._micro_batch_size:
            self.changes.append((self.produced, int(value)))
        self._micro_batch_size = int(value)

    @property
    def micro_batch_limit(self):
        """Largest micro-batch the data can give: this worker's share."""
        return self.shard_size

    @property
    def steps_per_epoch(self):
        """Micro-steps in one pass over this worker's share at the initial size."""
        return max(1, self.shard_size // self.initial_micro_batch_size)

    @property
    def passes(self):
        """Passes over the data completed so far (fractional)."""
        return self.samples / self.shard_size

    def _shard_order(self):
        # The same global permutation on every rank; rank r takes every
        # N-th sample, so the shards are disjoint and equally long.
        if self.shuffle:
            order = np.random.default_rng((self.seed, self._pass)).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        return order[self.rank::self.num_workers][: self.shard_size]

    def next_indices(self):
        """Indices of the next micro-batch (continuing into the next pass)."""
        b = self._micro_batch_size
        parts, need = [], b
        while need:
            if self._order is None or self._cursor >= len(self._order):
                if self._order is not None:
                    self._pass += 1
                self._order = self._shard_order()
                self._cursor = 0
            take = self._order[self._cursor: self._cursor + need]
            self._cursor += len(take)
            need -= len(take)
            parts.append(take)
        self.produced += 1
        self.samples += b
        return np.concatenate(parts).astype(np.int64)

    def get_state(self):
        """The stream's position (JSON-able): what :meth:`set_state` needs to
        continue with the very next micro-batch, e.g. after a restart.

        Example:

        >>> import numpy as np
        >>> from keras_adapt.data import AdaptiveBatchDataset
        >>> a = AdaptiveBatchDataset(np.arange(20.0), micro_batch_size=4, num_workers=1, rank=0)
        >>> _ = [a.next_indices() for _ in range(7)]        # into the second pass
        >>> b = AdaptiveBatchDataset(np.arange(20.0), micro_batch_size=4, num_workers=1, rank=0)
        >>> b.set_state(a.get_state())
        >>> b.next_indices().tolist() == a.next_indices().tolist(), b.produced
        (True, 8)
        """
        return {"produced": self.produced, "samples": self.samples, "pass": self._pass,
                "cursor": self._cursor, "started": self._order is not None,
                "micro_batch_size": self._micro_batch_size,
                "initial_micro_batch_size": self.initial_micro_batch_size,
                "num_samples": self.num_samples,
                "num_workers": self.num_workers, "seed": self.seed, "shuffle": self.shuffle}

    def set_state(self, state):
        """Continues from a position saved by :meth:`get_state`; the data,
        the number of workers, the seed, the shuffling and the initial
        micro-batch size (which sets ``steps_per_epoch``) must be those of
        the saved stream (a ``ValueError`` names the one that differs)."""
        for key, now in (("num_samples", self.num_samples), ("num_workers", self.num_workers),
                         ("seed", self.seed), ("shuffle", self.shuffle),
                         ("initial_micro_batch_size", self.initial_micro_batch_size)):
            if state.get(key) != now:
                raise ValueError(
                    f"the saved data position was taken with {key}={state.get(key)!r}, this "
                    f"AdaptiveBatchDataset has {key}={now!r}: its samples would not continue "
                    f"the saved order; use the same data, workers, seed and shuffle")
        self.micro_batch_size = int(state["micro_batch_size"])
        self.produced = int(state["produced"])
        self.samples = int(state["samples"])
        self._pass = int(state["pass"])
        self._cursor = int(state["cursor"])
        self._order = self._shard_order() if state["started"] else None

    def _generate(self):
        while True:
            yield self.next_indices()

    @property
    def dataset(self):
        """The endless ``tf.data.Dataset`` of ``(x, y)`` micro-batches for ``fit``."""
        if self._dataset is None:
            x = tf.nest.map_structure(tf.convert_to_tensor, self._x)
            y = None if self._y is None else tf.nest.map_structure(tf.convert_to_tensor, self._y)

            def gather(idx):
                xs = tf.nest.map_structure(lambda a: tf.gather(a, idx), x)
                if y is None:
                    return xs
                return xs, tf.nest.map_structure(lambda a: tf.gather(a, idx), y)

            ds = tf.data.Dataset.from_generator(
                self._generate, output_signature=tf.TensorSpec([None], tf.int64))
            ds = ds.map(gather)
            # No prefetching, no autotuned parallelism: a batch is produced
            # only when a step asks for it, so a size set between two steps
            # applies to the very next step on every rank.
            options = tf.data.Options()
            options.autotune.enabled = False
            options.experimental_optimization.inject_prefetch = False
            options.experimental_optimization.map_parallelization = False
            self._dataset = ds.with_options(options)
        return self._dataset
