"""In-graph gradient statistics: |G|^2, tr(Sigma), the noise scale and the SNR.

The estimators are those of McCandlish et al. 2018 ("An Empirical Model of
Large-Batch Training", App. A), generalised to micro-gradients of unequal
size. Given M independent micro-gradients g_m at the same weights, g_m the
mean over b_m samples (so E g_m = G and Cov g_m = Sigma / b_m), with

    local_sqr = mean_m |g_m|^2        total_sqr = |mean_m g_m|^2
    h         = mean_m 1/b_m          (1/h is the harmonic mean batch)

the expectations are E local_sqr = |G|^2 + h tr(Sigma) and
E total_sqr = |G|^2 + h tr(Sigma) / M, so the unbiased estimates are

    |G|^2 = (M * total_sqr - local_sqr) / (M - 1)
    tr(S) = M * (local_sqr - total_sqr) / ((M - 1) * h)

With equal sizes (h = 1/b) these are (B*total - b*local)/(B - b) and
(local - total)/(1/b - 1/B) with B = M*b (docs/design.md#gradient-statistics).
For M = 2 they read |G|^2 = g_1 . g_2 and tr(S) = |g_1 - g_2|^2 / (1/b_1 +
1/b_2): one worker pairing a full batch with an epoch's smaller last batch
stays unbiased.

Each estimate is unbiased, their ratio is not, so each gets its own
bias-corrected exponential moving average and the noise scale is the ratio
of the averages: B_simple = EMA(tr S) / EMA(|G|^2). The SNR compares
B_simple with the global batch of the measured updates, averaged the same
way (see :meth:`GradientStatistics.result`).

The averages decay per optimizer update, not per measurement: measuring one
update in N, a measurement stands for the N updates up to the next one and
enters with weight 1 - decay^N. The averages then span the same stretch of
training whatever N is (about 1 / (1 - decay) updates); a larger N only
means fewer measurements in it. The bias correction is the average of 1
kept the same way, so N may change in the middle of training.

Everything here runs inside the compiled train function and lives in
``tf.Variable``s; callbacks read them every few steps without a collective.
"""

import math

import tensorflow as tf

from keras_adapt.checks import check_float, check_int

_F64 = tf.float64

#: The entries of ``GradientStatistics.averages``, in order: the moving
#: averages of |G|^2, tr(Sigma) and the global batch, their bias correction
#: (the average of 1 kept the same way), the global batch of the last used
#: measurement, the measurements used, the updates they stand for, and the
#: non-finite measurements skipped. The counts are exact in float64 up to 2^53.
AVERAGES = ("ema_grad_sqr", "ema_grad_var", "ema_global_batch", "ema_weight", "global_batch",
            "updates", "covered_updates", "nonfinite")


def unbiased_estimates(local_sqr, total_sqr, inv_batch, total_inv_batch):
    """Unbiased ``(|G|^2, tr(Sigma))`` from one update's two squared norms.

    The one estimator of the gradient statistics (the graph calls it from
    :meth:`GradientStatistics.update`; plain arithmetic, so it also runs on
    numpy values). Its inputs are two squared norms whose expectations are

        E local_sqr = |G|^2 + h tr(Sigma)        (h = ``inv_batch``)
        E total_sqr = |G|^2 + c tr(Sigma)        (c = ``total_inv_batch``)

    so that, solving the two equations (h > c),

        tr(Sigma) = (local_sqr - total_sqr) / (h - c)
        |G|^2     = (h total_sqr - c local_sqr) / (h - c)

    ``local_sqr`` is the mean over the M micro-gradients g_m (each the mean
    over b_m samples) of |g_m|^2, and h the mean of 1/b_m. For the
    unweighted mean of the g_m, c = h / M (McCandlish et al.'s estimators;
    with equal sizes the formulas of docs/design.md#gradient-statistics).
    For the batch-weighted mean sum_m (b_m / B) g_m, B = sum_m b_m,
    c = sum_m (b_m/B)^2 / b_m = 1 / B: workers with rebalanced, unequal
    micro-batches.

    Example:

    >>> from keras_adapt.monitors.gradient_stats import unbiased_estimates
    >>> # two equal micro-gradients of 8 samples: h = 1/8, c = h / 2
    >>> unbiased_estimates(5.0, 4.0, 1 / 8, 1 / 16)
    (3.0, 16.0)
    >>> # micro-batches of 4 and 12, batch-weighted mean: h = (1/4 + 1/12) / 2, c = 1/16
    >>> g2, s = unbiased_estimates(5.0, 4.0, (1 / 4 + 1 / 12) / 2, 1 / 16)
    >>> round(g2, 6), round(s, 6)
    (3.4, 9.6)
    """
    spread = inv_batch - total_inv_batch
    return ((inv_batch * total_sqr - total_inv_batch * local_sqr) / spread,
            (local_sqr - total_sqr) / spread)


class GradientStatistics(tf.Module):
    """State and update rule of the in-graph gradient statistics.

    ``DistributedOptimizer`` owns one of these and calls :meth:`update` on
    every measured optimizer update (one in ``interval``); :meth:`result`
    reads the current estimates on the host.

    Args:
        ema_decay: decay of the exponential moving averages per optimizer
            update, in (0, 1). 0.99 averages over roughly the last 100
            updates, of which ``100 / interval`` are measured.
        batch_size: the per-worker micro-batch size b if fixed and known;
            otherwise it is recorded from the data each step (see
            ``GradientStatsMonitor``).
        interval: measure one optimizer update in ``interval`` (a positive
            int). Kept in a variable: :meth:`set_interval` changes it without
            retracing the train function.

    The state is three variables: ``batch_size``, ``interval`` and
    ``averages``, a float64 vector of the entries :data:`AVERAGES` names
    (:meth:`read_averages`, :meth:`assign_averages`).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.monitors import GradientStatistics
    >>> stats = GradientStatistics(ema_decay=0.5, batch_size=8)
    >>> # two workers: mean of |g_i|^2 = 5, |mean g|^2 = 4
    >>> _ = stats.update(tf.constant(5.0), tf.constant(4.0), num_gradients=2)
    >>> r = stats.result()
    >>> r["grad_sqr"], r["grad_var"], r["gns"]   # |G|^2=3, tr(S)=2*1/(1*(1/8))=16
    (3.0, 16.0, 5.333333333333333)
    """

    def __init__(self, ema_decay=0.99, batch_size=None, interval=1, name="gradient_statistics"):
        super().__init__(name=name)
        self.check_arguments(ema_decay, batch_size, interval)
        self.ema_decay = float(ema_decay)
        self.fixed_batch_size = batch_size
        with tf.init_scope(), tf.name_scope(name):
            def var(value, dtype, vname):
                return tf.Variable(value, dtype=dtype, trainable=False, name=vname)

            self.batch_size = var(batch_size or 0, tf.int64, "batch_size")
            self.interval = var(interval, tf.int64, "interval")
            # One variable for everything a measurement updates: the update
            # reads and writes it once, and the optimizer's branch that
            # measures captures one variable instead of eight (each captured
            # variable costs every update, measured or not).
            self.averages = var(tf.zeros([len(AVERAGES)], _F64), _F64, "averages")

    @staticmethod
    def check_arguments(ema_decay, batch_size, interval=1):
        """Raises a ``ValueError`` naming the fix for a bad ``ema_decay``, ``batch_size`` or ``interval``.

        Example:

        >>> from keras_adapt.monitors import GradientStatistics
        >>> GradientStatistics.check_arguments(1.5, None)
        Traceback (most recent call last):
        ...
        ValueError: ema_decay=1.5 is not valid; use a float strictly between 0 and 1 (e.g. 0.99 averages over about 100 steps)
        """
        check_float("ema_decay", ema_decay, 0.0, 1.0, low_open=True, high_open=True,
                    fix="use a float strictly between 0 and 1 (e.g. 0.99 averages over about "
                        "100 steps)")
        check_int("batch_size", batch_size, none=True,
                  fix="use a positive int (the per-worker batch size) or None to record it "
                      "from the data")
        _check_interval(interval)

    def set_interval(self, interval):
        """Measures one update in ``interval`` from now on (no retrace).

        Example:

        >>> from keras_adapt.monitors import GradientStatistics
        >>> stats = GradientStatistics(interval=4)
        >>> stats.set_interval(1)
        >>> int(stats.interval.numpy())
        1
        """
        _check_interval(interval)
        self.interval.assign(interval)

    def due(self, update_index):
        """Whether update number ``update_index`` (0-based) is measured (in-graph).

        The one rule for which updates are measured: every ``interval``-th,
        starting with the first. Every rank reads the same update count and
        interval, so every rank takes the same branch.
        """
        return tf.math.floormod(tf.cast(update_index, tf.int64), self.interval) == 0

    def record_batch_size(self, batch_size):
        """Records the per-worker batch size b of the current step (in-graph)."""
        if self.fixed_batch_size is None:
            self.batch_size.assign(tf.cast(batch_size, tf.int64))

    def inverse_batch_size(self):
        """1/b of the current step as float32 (0 while b is unknown), in-graph.

        The optimizer averages it over the micro-gradients of an update (over
        workers in the same collective as the gradients, over micro-steps by
        accumulating) to get the ``inv_batch`` of :meth:`update`.
        """
        b = tf.cast(self.batch_size, tf.float32)
        return tf.where(b > 0.0, 1.0 / tf.maximum(b, 1.0), 0.0)

    def update(self, local_sqr, total_sqr, num_gradients, inv_batch=None, global_batch=None,
               valid=True, weighted=False):
        """Folds one update's measurements into the averages (in-graph).

        Args:
            local_sqr: mean over the M micro-gradients of their squared norms.
            total_sqr: squared norm of the (unweighted) mean of the
                micro-gradients.
            num_gradients: M, the number of independent micro-gradients that
                were averaged (workers x accumulation steps, or 2 for one
                worker pairing consecutive updates). Must be >= 2; a python
                int or scalar tensor.
            inv_batch: h, the mean over the M micro-gradients of 1/b_m
                (default: 1/b of the recorded batch size, i.e. all of size b).
                0 means unknown.
            global_batch: the number of samples in the measured update's
                gradient (default: M * b). One worker pairing two updates has
                M = 2 but a global batch of its own b.
            valid: optional boolean (tensor) that must also hold for the
                measurement to be used (e.g. "a previous gradient exists").
            weighted: True when ``total_sqr`` is the squared norm of the
                batch-weighted mean sum_m b_m g_m / B (workers with unequal
                micro-batches, ``keras_adapt.optimizer.BatchWeighting``)
                rather than the unweighted mean; ``global_batch`` is then B.

        Returns:
            A boolean scalar tensor: True when the measurements were finite and
            entered the averages; False when they were skipped (non-finite ones
            are counted in ``nonfinite``). Measurements with an unknown batch
            size (h = 0) are skipped without being counted as non-finite.
        """
        local_sqr = tf.cast(local_sqr, _F64)
        total_sqr = tf.cast(total_sqr, _F64)
        m = tf.cast(num_gradients, _F64)
        if inv_batch is None:
            inv_batch = self.inverse_batch_size()
        h = tf.cast(inv_batch, _F64)
        if global_batch is None:
            global_batch = m * tf.cast(self.batch_size, _F64)
        global_batch = tf.cast(global_batch, _F64)
        finite = tf.math.is_finite(local_sqr) & tf.math.is_finite(total_sqr)
        if weighted:
            # The batch-weighted mean: E total_sqr = |G|^2 + tr(S) / B.
            total_h = 1.0 / tf.maximum(global_batch, 1.0)
        else:
            # The unweighted mean of M micro-gradients: E total_sqr = |G|^2 + h tr(S) / M.
            total_h = h / tf.maximum(m, 1.0)
        # m >= 2, h > 0 and h > total_h are checked in `usable`; the guard
        # only keeps the unused value free of a division by zero.
        spread = h - total_h
        usable = finite & (h > 0.0) & (m >= 2.0) & (spread > 0.0) & tf.cast(valid, tf.bool)
        grad_sqr, grad_var = unbiased_estimates(local_sqr, total_sqr, h,
                                                tf.where(usable, total_h, h - 1.0))
        # One measurement stands for the `interval` updates up to the next.
        interval = tf.cast(self.interval, _F64)
        beta = tf.pow(tf.constant(self.ema_decay, _F64), interval)

        # Branch-free, one read and one write of ``averages``: tf.where keeps
        # the old value when the measurement is unusable, so a NaN never
        # enters an average.
        old = dict(zip(AVERAGES, tf.unstack(self.averages.read_value())))

        def average(name, value):
            return tf.where(usable, beta * old[name] + (1.0 - beta) * value, old[name])

        new = {
            "ema_grad_sqr": average("ema_grad_sqr", grad_sqr),
            "ema_grad_var": average("ema_grad_var", grad_var),
            "ema_global_batch": average("ema_global_batch", global_batch),
            "ema_weight": average("ema_weight", tf.constant(1.0, _F64)),
            "global_batch": tf.where(usable, global_batch, old["global_batch"]),
            "updates": old["updates"] + tf.cast(usable, _F64),
            "covered_updates": old["covered_updates"] + tf.where(usable, interval, 0.0),
            "nonfinite": old["nonfinite"] + tf.cast(tf.logical_not(finite), _F64),
        }
        self.averages.assign(tf.stack([new[name] for name in AVERAGES]))
        return usable

    def read_averages(self):
        """The entries of :attr:`averages` as a dict of python floats (host,
        one small device-to-host copy): the raw state behind :meth:`result`.

        Example:

        >>> from keras_adapt.monitors import GradientStatistics
        >>> from keras_adapt.monitors.gradient_stats import AVERAGES
        >>> stats = GradientStatistics(batch_size=8)
        >>> values = stats.read_averages()
        >>> values["updates"], list(values) == list(AVERAGES)
        (0.0, True)
        """
        return dict(zip(AVERAGES, self.averages.numpy().tolist()))

    def assign_averages(self, **entries):
        """Sets entries of :attr:`averages` by name (host); the others keep
        their values. For restoring a state saved elsewhere, or to make
        :meth:`result` report a chosen noise scale (as the policies' tests do).

        Example:

        >>> from keras_adapt.monitors import GradientStatistics
        >>> stats = GradientStatistics(batch_size=8)
        >>> stats.assign_averages(updates=1, ema_weight=1.0, ema_grad_sqr=2.0, ema_grad_var=50.0)
        >>> stats.result()["gns"]
        25.0
        """
        unknown = sorted(set(entries) - set(AVERAGES))
        if unknown:
            raise ValueError(f"assign_averages got unknown entries {unknown}; "
                             f"the entries are {list(AVERAGES)}")
        values = self.read_averages()
        values.update({k: float(v) for k, v in entries.items()})
        self.averages.assign([values[name] for name in AVERAGES])

    def result(self):
        """Reads the current estimates on the host (one small device-to-host copy).

        Returns a dict of python floats with the log keys of
        docs/design.md#logs-keys:
        ``grad_sqr`` (|G|^2), ``grad_var`` (tr Sigma, per sample), ``gns``
        (B_simple) and ``grad_snr`` (B / B_simple), plus ``batch_size`` (the
        global batch of the last measured update), ``snr_batch_size`` (the B
        of ``grad_snr``), ``updates`` (measurements that entered the
        averages), ``covered_updates`` (the optimizer updates they stand for:
        the sum of ``interval`` over them) and the ``nonfinite`` count.

        B of ``grad_snr`` is the moving average of the measured updates'
        global batches, with the same decay and bias correction as the
        statistics: the batch the statistics describe. An epoch's smaller
        last batch, when measured, then moves it by ``1 - ema_decay **
        interval`` of the difference, not to its own size.

        Before the first update the estimates are NaN. A non-positive
        EMA(|G|^2) means the signal is not yet resolved from the noise: the
        noise scale is reported as +inf and the SNR as 0.
        """
        # One read of one variable: monitors call this every few steps.
        v = self.read_averages()
        updates = int(v["updates"])
        out = {
            "updates": updates,
            "covered_updates": int(v["covered_updates"]),
            "nonfinite": int(v["nonfinite"]),
            "batch_size": v["global_batch"],
        }
        if updates == 0:
            nan = float("nan")
            out.update(grad_sqr=nan, grad_var=nan, gns=nan, grad_snr=nan, snr_batch_size=nan)
            return out
        correction = v["ema_weight"]
        grad_sqr = v["ema_grad_sqr"] / correction
        grad_var = v["ema_grad_var"] / correction
        batch = v["ema_global_batch"] / correction
        if grad_sqr > 0.0:
            # A negative variance estimate means no noise is resolved yet.
            gns = max(grad_var, 0.0) / grad_sqr
            snr = batch / gns if gns > 0 else math.inf
        else:
            gns, snr = math.inf, 0.0
        out.update(grad_sqr=grad_sqr, grad_var=grad_var, gns=gns, grad_snr=snr,
                   snr_batch_size=batch)
        return out

    def reset(self):
        """Forgets all measurements (e.g. after the model changed a lot)."""
        self.averages.assign(tf.zeros_like(self.averages))


def _check_interval(interval):
    return check_int("stats_interval", interval, fix="use a positive int: the "
                     "statistics are measured on one optimizer update in that many "
                     "(1 measures every update)")
