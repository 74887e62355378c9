"""In-graph timing of the collectives of a train step, and the slow-rank test hook.

:class:`CollectiveTiming` (``optimizer.adapt_state.timing``) brackets each
collective of the optimizer update with ``tf.timestamp()`` -- one stamp once
its inputs are ready, one once its outputs are -- and adds the seconds in
between to a float64 variable. ``WorkerTimingMonitor`` turns it on and reads
the variable once per interval; without it the update's graph holds no
stamps at all.

The slow-rank hook (``KERAS_ADAPT_SLOW_RANK=<rank>:<factor>``, see
:func:`slow_rank`) stretches one worker's computation by a factor, in the
same place: before a collective starts, that worker sleeps (factor - 1)
times the time since its previous collective ended.
"""

import math
import os
import time

import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt._traced_option import TracedOption
from keras_adapt.checks import invalid

#: Environment variable of the slow-rank test hook (see :func:`slow_rank`).
SLOW_RANK_ENV = "KERAS_ADAPT_SLOW_RANK"
#: A gap longer than this between two collectives (an epoch boundary with
#: evaluation, a new ``fit``) is not stretched by the slow-rank hook.
SLOW_RANK_MAX_GAP_S = 5.0


def slow_rank():
    """``(rank, factor)`` of the slow-rank test hook, or None when it is off.

    ``KERAS_ADAPT_SLOW_RANK=<rank>:<factor>`` (e.g. ``1:3``) makes that
    worker's computation ``factor`` times slower: before each collective of
    the optimizer update it sleeps (factor - 1) times the time since its
    previous collective ended (gaps longer than :data:`SLOW_RANK_MAX_GAP_S`
    are left alone), so its measured compute time is about ``factor`` times
    the others' and the other workers wait for it. It is read when the train
    function is traced, and only in jobs of two or more workers. A malformed
    value raises a ``ValueError`` naming it.

    Example:

    >>> import os
    >>> from keras_adapt.monitors.worker_timing import SLOW_RANK_ENV, slow_rank
    >>> os.environ[SLOW_RANK_ENV] = "1:3"
    >>> slow_rank()
    (1, 3.0)
    >>> os.environ[SLOW_RANK_ENV] = "one:3"
    >>> slow_rank()
    Traceback (most recent call last):
    ...
    ValueError: KERAS_ADAPT_SLOW_RANK='one:3' is not valid; use <rank>:<factor> ...
    >>> del os.environ[SLOW_RANK_ENV]
    >>> slow_rank() is None
    True
    """
    raw = os.environ.get(SLOW_RANK_ENV, "").strip()
    if not raw:
        return None
    rank_text, sep, factor_text = raw.partition(":")
    try:
        rank, factor = int(rank_text), float(factor_text)
    except ValueError:
        rank, factor = -1, math.nan
    if not sep or rank < 0 or not (math.isfinite(factor) and factor >= 1.0):
        raise invalid(
            SLOW_RANK_ENV, raw, "use <rank>:<factor> with a rank "
            "of this job and a factor >= 1 (for example 1:3 makes rank 1 three times "
            "slower), or unset it"
        )
    return rank, factor


def _stretch_factor(size):
    """This worker's slow-rank factor in a job of ``size`` workers (1.0 on
    the other workers), or None when the hook is off. Every worker builds
    the same ops (Horovod matches collectives across workers by the names
    TensorFlow gives them, which other ops in the graph shift)."""
    hook = slow_rank()
    if hook is None or size < 2:
        return None
    rank, factor = hook
    if rank >= size:
        raise ValueError(
            f"{SLOW_RANK_ENV}={os.environ[SLOW_RANK_ENV]!r} names rank {rank}, but this "
            f"job has {size} workers (ranks 0-{size - 1}); use one of those ranks, or unset it"
        )
    return factor if rank == _hvd.rank() else 1.0


def _flat(tensors):
    return [t.values if isinstance(t, tf.IndexedSlices) else t for t in tensors]


def _after(deps, tensors):
    """``tensors`` (dense or ``tf.IndexedSlices``), made to wait for ``deps``."""
    with tf.control_dependencies(deps):
        return [tf.IndexedSlices(tf.identity(t.values), t.indices, t.dense_shape)
                if isinstance(t, tf.IndexedSlices) else tf.identity(t) for t in tensors]


def _sleep(seconds):
    time.sleep(float(seconds))
    return 0


class CollectiveTiming(TracedOption):
    """Seconds the workers spend in the collectives of their optimizer updates.

    ``optimizer.adapt_state.timing``: a small public object. Once
    :meth:`enable` ran (``WorkerTimingMonitor`` calls it before the train
    function is traced), every collective of the update is bracketed
    in-graph by two ``tf.timestamp()`` ops, the first once the collective's
    inputs are ready, the second once its outputs are, and the seconds in
    between are added to :attr:`wait_seconds` (:attr:`collectives` counts
    them). That time is the worker's wait: for the slowest worker to arrive,
    plus the transfer. Nothing is added to the graph while it is off (and
    the slow-rank hook is unset). One worker has no collective to time.

    Attributes:
        enabled: whether the stamps are traced into the update.
        monitored: whether a ``WorkerTimingMonitor`` reports these times in
            the ``fit`` that runs (set from its ``set_model`` to its
            ``on_train_end``); ``AdaptTensorBoard`` then writes the
            monitor's step times instead of gathering its own.
        wait_seconds: float64 variable, total seconds in collectives.
        collectives: int64 variable, number of collectives timed.
        slept_seconds: float64 variable, total seconds the slow-rank hook
            asked this worker to sleep (0 on the other workers, and without
            the hook): the slow-down it injected, read back.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.monitors.worker_timing import CollectiveTiming
    >>> timing = CollectiveTiming()
    >>> timing.enable()
    True
    >>> out = timing.bracket(lambda ts: [t * 2.0 for t in ts], [tf.constant(1.0)], size=2)
    >>> float(out[0]), timing.read()[1], timing.read()[0] >= 0.0
    (2.0, 1, True)
    """

    def __init__(self):
        super().__init__()
        self.monitored = False
        self.wait_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                        name="collective_wait_seconds")
        self.collectives = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="collectives_timed")
        self.slept_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                         name="slow_rank_slept_seconds")
        # When this worker's previous collective ended (slow-rank hook only).
        self._last_end = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                     name="last_collective_end")

    def read(self):
        """``(wait_seconds, collectives)`` so far, as python numbers (a host read)."""
        return float(self.wait_seconds.numpy()), int(self.collectives.numpy())

    def bracket(self, collective, tensors, size):
        """``collective(tensors)``, timed when enabled (and stretched by the
        slow-rank hook on its rank) in a job of ``size`` workers."""
        factor = _stretch_factor(size)
        if not self.enabled and factor is None:
            return collective(tensors)
        # Copies made here: inside a tf.cond branch (the update reduces in
        # one) a control dependency on a tensor of the enclosing graph is
        # dropped, and the stamp would run before the gradients are computed.
        tensors = _after([], tensors)
        with tf.control_dependencies(_flat(tensors)):
            start = tf.timestamp()
        if factor is not None:
            gap = start - self._last_end.read_value()
            extra = tf.where((self._last_end > 0.0) & (gap < SLOW_RANK_MAX_GAP_S),
                             (factor - 1.0) * gap, tf.constant(0.0, tf.float64))
            slept = tf.py_function(_sleep, [extra], tf.int32, name="keras_adapt_slow_rank")
            with tf.control_dependencies([slept]):
                start = tf.timestamp()
        out = collective(_after([start], tensors))
        with tf.control_dependencies(_flat(out)):
            end = tf.timestamp()
        updates = []
        if self.enabled:
            updates += [self.wait_seconds.assign_add(end - start),
                        self.collectives.assign_add(1)]
        if factor is not None:
            updates += [self._last_end.assign(end), self.slept_seconds.assign_add(extra)]
        return _after(updates, out)
