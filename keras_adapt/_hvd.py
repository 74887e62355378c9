"""The few Horovod core collectives keras-adapt uses, behind one small facade.

keras-adapt builds only on ``horovod.tensorflow`` (allreduce, grouped
allreduce, broadcast), never on ``horovod.tensorflow.keras``, whose internals
break on Keras 3. If Horovod is not installed the facade runs as a single
process (size 1, rank 0) so that the library stays usable and testable.
"""

import os
import time
import warnings

from keras_adapt.checks import check_float, invalid

try:  # pragma: no cover - exercised on both branches by the test matrix
    import horovod.tensorflow as hvd
except ImportError:
    hvd = None

_warned = []

#: Environment variable of the slow-network test hook (see :func:`collective_delay_ms`).
DELAY_ENV = "KERAS_ADAPT_COLLECTIVE_DELAY_MS"
_delays = [0]


def collective_delay_ms():
    """The fixed delay, in milliseconds, added before each collective keras-adapt
    issues: the ``KERAS_ADAPT_COLLECTIVE_DELAY_MS`` environment variable (0 if unset).

    A test hook that simulates a slow network on one machine. It is read when
    a collective is built (in a compiled train function: when it is traced),
    and only for jobs of two or more workers. Bad values raise an error naming it.

    Example:

    >>> import os
    >>> from keras_adapt import _hvd
    >>> os.environ.pop(_hvd.DELAY_ENV, None) and None
    >>> _hvd.collective_delay_ms()
    0.0
    """
    raw = os.environ.get(DELAY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise invalid(
            DELAY_ENV, raw, "use a number of milliseconds >= 0 "
            "(for example 20), or unset it"
        )
    return value


def delayed_collectives():
    """How many collectives this process has delayed so far (the test hook's count).

    Example:

    >>> from keras_adapt import _hvd
    >>> _hvd.delayed_collectives() >= 0
    True
    """
    return _delays[0]


def _sleep(seconds):
    _delays[0] += 1
    time.sleep(seconds)


def _with_delay(tensors, delay=None):
    """``tensors``, made to wait ``delay`` ms (by default
    :func:`collective_delay_ms`) first, in-graph or eagerly; unchanged when
    no delay is set."""
    delay = collective_delay_ms() if delay is None else delay
    if delay == 0.0:
        return tensors
    import tensorflow as tf

    if tf.executing_eagerly():
        _sleep(delay / 1000.0)
        return tensors

    def wait():
        _sleep(delay / 1000.0)
        return 0

    # The sleep waits for the inputs: copies made here, since inside a
    # tf.cond branch a control dependency on a tensor of the enclosing graph
    # is dropped (the sleep would overlap the computation).
    ready = [tf.identity(t.values if isinstance(t, tf.IndexedSlices) else t) for t in tensors]
    with tf.control_dependencies(ready):
        done = tf.py_function(wait, [], tf.int32, name="keras_adapt_collective_delay")
    with tf.control_dependencies([done]):
        return [tf.identity(t) if not isinstance(t, tf.IndexedSlices) else
                tf.IndexedSlices(tf.identity(t.values), t.indices, t.dense_shape)
                for t in tensors]


def ensure_initialized():
    """Initialises Horovod once (a no-op if the user already called ``hvd.init()``)."""
    if hvd is None:
        if not _warned:
            _warned.append(True)
            warnings.warn(
                "keras-adapt: horovod is not installed; running as a single "
                "process. Install horovod==0.28.1 (see docs/install.md).",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    if not hvd.is_initialized():
        hvd.init()


def size():
    """Number of Horovod workers in the job (1 without horovodrun or Horovod).

    Example:

    >>> import keras_adapt
    >>> keras_adapt.size() >= 1
    True
    """
    ensure_initialized()
    return 1 if hvd is None else hvd.size()


def rank():
    """This worker's rank, 0 .. size()-1 (0 without horovodrun or Horovod).

    Example:

    >>> import keras_adapt
    >>> 0 <= keras_adapt.rank() < keras_adapt.size()
    True
    """
    ensure_initialized()
    return 0 if hvd is None else hvd.rank()


def local_rank():
    """This worker's rank among the workers on its machine (pick a GPU with it).

    Example:

    >>> import keras_adapt
    >>> keras_adapt.local_rank() >= 0
    True
    """
    ensure_initialized()
    return 0 if hvd is None else hvd.local_rank()


def cross_rank():
    """The index of this worker's machine among the machines of the job, as
    seen by the workers with the same ``local_rank`` (0 without Horovod).

    Example:

    >>> from keras_adapt import _hvd
    >>> _hvd.cross_rank() >= 0
    True
    """
    ensure_initialized()
    return 0 if hvd is None else hvd.cross_rank()


def _op_name(op):
    if hvd is not None:
        for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"):
            if getattr(hvd, name, object()) is op:
                return name
    return repr(op)


class Reduction:
    """How gradients are combined over workers: Horovod's ``op``,
    ``compression``, ``gradient_predivide_factor`` and ``process_set``.

    One object per optimizer; :meth:`allreduce` is the only collective of a
    train step. The gradients travel in one grouped allreduce per dtype;
    scalars given as ``scalars`` (the monitoring scalar) ride in the same
    grouped allreduce and always come back *averaged*, whatever ``op`` is.
    Exceptions, as in Horovod: ``tf.IndexedSlices`` (when the optimizer was
    made with ``sparse_as_dense=False``) are allgathered, and with
    ``compression=Compression.fp16`` the float32 scalars stay uncompressed
    and so travel in a float32 group of their own (an fp16 squared norm
    would overflow above 65504).

    Args:
        op: ``horovod.tensorflow.Average`` (default) or ``Sum``. Adasum is
            refused, as in Horovod's Keras optimizer.
        compression: ``horovod.tensorflow.Compression.none`` (default) or
            ``Compression.fp16`` (floating gradients are sent as float16).
        gradient_predivide_factor: f > 0; with ``op=Average`` gradients are
            scaled by 1/f before the sum and f/size after it (Horovod's
            split of the average). Must be 1.0 with ``op=Sum``.
        process_set: a ``horovod.tensorflow.ProcessSet``: reduce over its
            ranks only (default: all workers).
        timing: a :class:`~keras_adapt.monitors.worker_timing.CollectiveTiming`
            that brackets each reduction (``optimizer.adapt_state.timing``),
            or None.
        switch: a :class:`~keras_adapt.optimizer.CompressionSwitch`
            (``optimizer.adapt_state.compression``), or None. Once enabled,
            the dense gradients and the scalars are reduced under a
            ``tf.cond`` on its variable, float16 (``Compression.fp16``) or
            float32 (``Compression.none``), instead of by ``compression``;
            the variable starts from ``compression``.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt._hvd import Reduction
    >>> r = Reduction()
    >>> [t.numpy().tolist() for t in r.allreduce([tf.constant([1.0, 2.0])], [tf.constant(4.0)])]
    [[1.0, 2.0], 4.0]
    """

    def __init__(self, op=None, compression=None, gradient_predivide_factor=1.0, process_set=None,
                 timing=None, switch=None):
        self.op = op
        self.timing = timing
        self.switch = switch
        self.compression = compression
        self.process_set = process_set
        factor = gradient_predivide_factor
        self.gradient_predivide_factor = check_float(
            "gradient_predivide_factor", factor, low_open=True, finite=False,
            fix="use a float > 0 (1.0: plain average)")
        if hvd is None:
            if op is not None or compression is not None or process_set is not None:
                raise ValueError(
                    "op, compression and process_set need horovod; install "
                    "horovod==0.28.1 (see docs/install.md) or leave them at their defaults"
                )
            return
        if op is None:
            self.op = hvd.Average
        elif op is not hvd.Average and op is not hvd.Sum:
            raise ValueError(
                f"op={_op_name(op)} is not supported; use horovod.tensorflow.Average "
                "(default) or horovod.tensorflow.Sum. Adasum is not offered by "
                "Horovod's Keras optimizer either: average, and scale the learning rate instead"
            )
        if self.op is hvd.Sum and self.gradient_predivide_factor != 1.0:
            raise ValueError(
                f"gradient_predivide_factor={factor!r} only applies to op=Average; "
                "leave it at 1.0 with op=Sum"
            )
        if compression is None:
            self.compression = hvd.Compression.none
        elif not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise invalid(
                "compression", compression, "use "
                "horovod.tensorflow.Compression.none or Compression.fp16"
            )
        if process_set is None:
            self.process_set = hvd.global_process_set
        elif not isinstance(process_set, hvd.ProcessSet):
            raise invalid(
                "process_set", process_set, "use a "
                "horovod.tensorflow.ProcessSet registered with hvd.init(process_sets=...) "
                "or hvd.add_process_set(...)"
            )

    @property
    def sends_fp16(self):
        """True when ``compression`` is Horovod's ``Compression.fp16``."""
        return hvd is not None and self.compression is hvd.Compression.fp16

    @property
    def is_sum(self):
        """True when gradients are summed rather than averaged."""
        return hvd is not None and self.op is hvd.Sum

    def size(self):
        """Number of workers the gradients are reduced over."""
        ensure_initialized()
        if hvd is None:
            return 1
        if self.process_set is hvd.global_process_set:
            return hvd.size()
        return self.process_set.size()

    def allreduce(self, tensors, scalars=()):
        """Reduces ``tensors`` (gradients: dense tensors or ``tf.IndexedSlices``)
        with ``op`` and averages ``scalars``; returns the reduced tensors
        followed by the averaged scalars, in their original order."""
        tensors, scalars = list(tensors), list(scalars)
        if self.size() == 1 or not (tensors or scalars):
            return tensors + scalars
        if self.timing is None:
            return self._reduce(tensors + scalars, len(tensors))
        return self.timing.bracket(lambda items: self._reduce(items, len(tensors)),
                                   tensors + scalars, self.size())

    def _reduce(self, items, count):
        """The collective of :meth:`allreduce`: ``items[:count]`` are the
        tensors, the rest the scalars."""
        import tensorflow as tf

        delayed = _with_delay(items)
        tensors, scalars = delayed[:count], delayed[count:]
        if self.op is hvd.Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            pre = post = 1.0
        kwargs = {"op": self.op, "process_set": self.process_set}
        sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
        dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
        out = [None] * (len(tensors) + len(scalars))
        if sparse:
            # Horovod allgathers IndexedSlices (no pre/postscale factors there).
            for i, r in zip(sparse, hvd.grouped_allreduce([tensors[i] for i in sparse], **kwargs)):
                out[i] = r
        dense_items = [tensors[i] for i in dense]
        slots = dense + list(range(len(tensors), len(tensors) + len(scalars)))
        if self.switch is not None and self.switch.enabled and (dense_items or scalars):
            # Both reductions are traced; the branch the variable picks runs,
            # the same on every worker (CompressionSwitch).
            reduced = tf.cond(
                self.switch.fp16,
                lambda: self._reduce_dense(dense_items, scalars, hvd.Compression.fp16, pre, post),
                lambda: self._reduce_dense(dense_items, scalars, hvd.Compression.none, pre, post))
        else:
            reduced = self._reduce_dense(dense_items, scalars, self.compression, pre, post)
        for slot, r in zip(slots, reduced):
            out[slot] = r
        return out

    def _reduce_dense(self, tensors, scalars, compression, pre, post):
        """The dense ``tensors`` reduced with ``op`` through ``compression``
        and the ``scalars`` averaged, in one grouped allreduce per dtype."""
        import tensorflow as tf

        kwargs = {"op": self.op, "process_set": self.process_set}
        compressed, contexts = [], []
        for t in tensors:
            c, ctx = compression.compress(t)
            compressed.append(c)
            contexts.append(ctx)
        # Scalars are averaged: with op=Sum they are divided by size after the sum.
        items = compressed + list(scalars)
        by_dtype = {}
        for k, t in enumerate(items):
            by_dtype.setdefault(t.dtype, []).append(k)
        reduced = [None] * len(items)
        for ks in by_dtype.values():
            group = hvd.grouped_allreduce([items[k] for k in ks], prescale_factor=pre,
                                          postscale_factor=post, **kwargs)
            for k, r in zip(ks, group):
                reduced[k] = r
        out = []
        for k, r in enumerate(reduced):
            if k < len(compressed):
                out.append(compression.decompress(r, contexts[k]))
            else:
                out.append(r / tf.cast(self.size(), r.dtype) if self.is_sum else r)
        return out


def broadcast(tensor, root_rank, name=None, delay_ms=None):
    if size() == 1:
        return tensor
    return hvd.broadcast(_with_delay([tensor], delay_ms)[0], root_rank, name=name)


def allreduce_average(tensor, name=None):
    if size() == 1:
        return tensor
    return hvd.allreduce(_with_delay([tensor])[0], op=hvd.Average, name=name)


def allgather(tensor, name=None):
    """Concatenates ``tensor`` from all workers along axis 0 (rank order).

    Every worker must call it at the same point with the same ``name``; with
    one worker it returns ``tensor`` unchanged.

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt import _hvd
    >>> _hvd.allgather(tf.constant([0.5])).shape[0] == _hvd.size()
    True
    """
    if size() == 1:
        return tensor
    return hvd.allgather(_with_delay([tensor])[0], name=name)


def host_allreduce_mean(values, name):
    """Averages a small float64 vector over all workers, from host code.

    For callbacks that must agree on host-side measurements (such as step
    times) before deciding. Every rank must call it at the same point with
    the same ``name`` and length. Returns a numpy array.
    """
    return _host_allreduce(values, name, "Average")


def host_allreduce_max(values, name):
    """The element-wise maximum of a small float64 vector over all workers,
    from host code (as :func:`host_allreduce_mean`)."""
    return _host_allreduce(values, name, "Max")


def _host_allreduce(values, name, op):
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    if size() == 1:
        return values
    import tensorflow as tf

    return hvd.allreduce(_with_delay([tf.constant(values)])[0], op=getattr(hvd, op),
                         name=name).numpy()
