"""AdaptiveBatchDataset: an input stream whose per-worker batch size can change."""

import numpy as np
import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.checks import check_int, invalid


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
    Or let the batch-size policy end the epochs (``epoch_end="samples"``:
    one pass whatever the batch; ``"progress"``: one pass's worth of
    statistical progress, as AdaptDL) and give ``fit`` no ``steps_per_epoch``.

    The workers' micro-batches may also differ
    (:attr:`rank_micro_batch_sizes`, set by
    :class:`keras_adapt.actuators.RankBatchSizes` to rebalance a straggler):
    from then on each step takes the next ``sum(sizes)`` samples of the
    pass's permutation as one global block, and worker r takes its own
    consecutive slice of it (after the slices of ranks 0..r-1), so the
    workers' batches are disjoint and together exactly the global batch. The
    switch continues the pass where the equal shares left it: no sample is
    seen twice in a pass.

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
        self._rank_sizes = None  # per-rank sizes once set: global blocks from then on
        self.micro_batch_size = micro_batch_size
        self.initial_micro_batch_size = self._micro_batch_size
        self.produced = 0  # micro-batches handed out so far
        self.samples = 0  # samples handed out so far by this worker
        #: ``[(batch index, new size)]`` of every change of the micro-batch size.
        self.changes = []
        self._pass = 0
        self._order = None
        self._cursor = 0
        self._global_order = None
        self._global_cursor = 0
        self._global_samples = 0  # samples of all workers, counted from the blocks
        self._dataset = None

    @property
    def micro_batch_size(self):
        """The per-worker batch size of the next batch."""
        return self._micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, value):
        check_int("micro_batch_size", value)
        if int(value) > self.shard_size:
            raise ValueError(
                f"micro_batch_size={value} is larger than this worker's share of the "
                f"data ({self.shard_size} samples); use at most {self.shard_size}"
            )
        if self._micro_batch_size is not None and int(value) != self._micro_batch_size:
            self.changes.append((self.produced, int(value)))
        self._micro_batch_size = int(value)
        if self._rank_sizes is not None:
            self._rank_sizes = [int(value)] * self.num_workers

    @property
    def rank_micro_batch_sizes(self):
        """Every worker's micro-batch, by rank (all :attr:`micro_batch_size`
        until set). Setting a list of ``num_workers`` positive ints (the same
        list on every worker) makes every step a global block of their sum,
        sliced by rank; :attr:`micro_batch_size` is then this worker's entry
        (setting it gives every worker that size)."""
        if self._rank_sizes is None:
            return [self._micro_batch_size] * self.num_workers
        return list(self._rank_sizes)

    @rank_micro_batch_sizes.setter
    def rank_micro_batch_sizes(self, sizes):
        sizes = list(sizes) if isinstance(sizes, (list, tuple, np.ndarray)) else None
        ok = sizes is not None and len(sizes) == self.num_workers and all(
            isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1
            for b in sizes)
        if not ok:
            raise invalid(
                "rank_micro_batch_sizes", sizes, "use a list of "
                f"{self.num_workers} positive ints, one per rank")
        if sum(sizes) > self._pass_length():
            raise ValueError(
                f"rank_micro_batch_sizes={sizes} sum to {sum(sizes)}, more than one pass "
                f"({self._pass_length()} samples); use a smaller global batch")
        if self._rank_sizes is None:
            # The equal shares took order[r::N][:cursor] on rank r, that is the
            # first N * cursor samples of the pass's permutation: continue there.
            self._global_order = None if self._order is None else self._permutation()
            self._global_cursor = 0 if self._order is None else self.num_workers * self._cursor
            self._global_samples = self.num_workers * self.samples
        self._rank_sizes = [int(b) for b in sizes]
        mine = self._rank_sizes[self.rank]
        if mine != self._micro_batch_size:
            self.changes.append((self.produced, mine))
        self._micro_batch_size = mine

    def _pass_length(self):
        # The samples of a pass that the equal shares use (a remainder of
        # fewer than num_workers samples is left out, as by the shares).
        return self.shard_size * self.num_workers

    @property
    def samples_per_pass(self):
        """Global samples of one pass: every worker's equal share together
        (a remainder of fewer than ``num_workers`` samples is left out).

        Example:

        >>> import numpy as np
        >>> from keras_adapt.data import AdaptiveBatchDataset
        >>> AdaptiveBatchDataset(np.arange(21.0), micro_batch_size=4, num_workers=2, rank=0).samples_per_pass
        20
        """
        return self._pass_length()

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
        """Passes over the data completed so far (fractional; by all workers
        together once the per-rank sizes are set)."""
        if self._rank_sizes is not None:
            return self._global_samples / self._pass_length()
        return self.samples / self.shard_size

    def _permutation(self):
        # The same global permutation of the pass on every rank.
        if self.shuffle:
            return np.random.default_rng((self.seed, self._pass)).permutation(self.num_samples)
        return np.arange(self.num_samples)

    def _shard_order(self):
        # Rank r takes every N-th sample, so the shards are disjoint and equally long.
        return self._permutation()[self.rank::self.num_workers][: self.shard_size]

    def _next_block_slice(self):
        """This worker's slice of the next global block (per-rank sizes)."""
        sizes = self._rank_sizes
        start = sum(sizes[: self.rank])
        parts, need, skip = [], sum(sizes), start
        while need:
            if self._global_cursor >= self._pass_length() or self._global_order is None:
                if self._global_order is not None:
                    self._pass += 1
                self._global_order = self._permutation()
                self._global_cursor = 0
            take = self._global_order[self._global_cursor: min(
                self._global_cursor + need, self._pass_length())]
            self._global_cursor += len(take)
            need -= len(take)
            parts.append(take)
        block = np.concatenate(parts)
        return block[skip: skip + sizes[self.rank]]

    def next_indices(self):
        """Indices of the next micro-batch (continuing into the next pass)."""
        b = self._micro_batch_size
        if self._rank_sizes is not None:
            self.produced += 1
            self.samples += b
            self._global_samples += sum(self._rank_sizes)
            return self._next_block_slice().astype(np.int64)
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
                "num_workers": self.num_workers, "seed": self.seed, "shuffle": self.shuffle,
                "rank_sizes": self._rank_sizes, "global_cursor": self._global_cursor,
                "global_samples": self._global_samples,
                "global_started": self._global_order is not None}

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
        if state.get("rank_sizes") is not None:  # per-rank sizes: global blocks
            self._rank_sizes = [int(b) for b in state["rank_sizes"]]
            self._micro_batch_size = self._rank_sizes[self.rank]
            self._global_cursor = int(state["global_cursor"])
            self._global_samples = int(state["global_samples"])
            self._global_order = self._permutation() if state["global_started"] else None

    def reshard(self, num_workers, rank, micro_batch_size, state=None):
        """Continues the stream with another sharding (an elastic job whose
        workers changed): ``num_workers`` workers, this one ``rank``, each
        taking ``micro_batch_size`` samples per step, from the position of
        ``state`` (a :meth:`get_state` of any worker of the previous
        sharding; default this stream's own).

        The position is global: the samples of the pass the previous workers
        took together (the first ``N x cursor`` of the pass's permutation
        with equal shares, or the global blocks' cursor) are not taken again
        and none of the pass is skipped. From then on every step takes the
        next ``num_workers x micro_batch_size`` samples of the permutation
        as one global block and worker r its r-th slice (equal
        :attr:`rank_micro_batch_sizes`; unequal ones set before are dropped).

        Example:

        >>> import numpy as np
        >>> from keras_adapt.data import AdaptiveBatchDataset
        >>> two = [AdaptiveBatchDataset(np.arange(16.0), micro_batch_size=2, num_workers=2,
        ...                             rank=r, shuffle=False) for r in (0, 1)]
        >>> [d.next_indices().tolist() for d in two]      # step 0: samples 0-3
        [[0, 2], [1, 3]]
        >>> one = two[1]
        >>> one.reshard(1, 0, 4, state=two[0].get_state())
        >>> one.next_indices().tolist(), one.num_workers  # step 1: samples 4-7
        ([4, 5, 6, 7], 1)
        """
        state = self.get_state() if state is None else state
        for key, now in (("num_samples", self.num_samples), ("seed", self.seed),
                         ("shuffle", self.shuffle)):
            if state.get(key) != now:
                raise ValueError(
                    f"the data position to re-shard was taken with {key}={state.get(key)!r}, "
                    f"this AdaptiveBatchDataset has {key}={now!r}; make the dataset with the "
                    "same data, seed and shuffle on every worker")
        for name, value in (("num_workers", num_workers), ("rank", rank),
                            ("micro_batch_size", micro_batch_size)):
            check_int(name, value, 0 if name == "rank" else 1, owner="reshard")
        if rank >= num_workers:
            raise ValueError(f"reshard(rank={rank}) must be in [0, num_workers={num_workers})")
        shard = self.num_samples // num_workers
        if not 1 <= micro_batch_size <= shard:
            raise ValueError(
                f"reshard(micro_batch_size={micro_batch_size}) does not fit a worker's share "
                f"of {shard} samples with {num_workers} workers; use at most {shard}")
        if state.get("rank_sizes") is not None:
            cursor, seen = int(state["global_cursor"]), int(state["global_samples"])
            started = bool(state["global_started"])
        else:
            n = int(state["num_workers"])
            cursor, seen, started = n * int(state["cursor"]), n * int(state["samples"]), bool(
                state["started"])
        self.num_workers, self.rank, self.shard_size = int(num_workers), int(rank), shard
        self.produced = int(state["produced"])
        self._pass = int(state["pass"])
        self._order, self._cursor = None, 0
        self._global_order = self._permutation() if started else None
        self._global_cursor, self._global_samples = cursor, seen
        self.samples = seen // self.num_workers
        if int(micro_batch_size) != self._micro_batch_size:
            self.changes.append((self.produced, int(micro_batch_size)))
        self._micro_batch_size = int(micro_batch_size)
        self._rank_sizes = [self._micro_batch_size] * self.num_workers

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
