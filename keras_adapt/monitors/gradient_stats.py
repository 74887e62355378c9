"""In-graph gradient statistics: |G|^2, tr(Sigma), the noise scale and the SNR.

The estimators are those of McCandlish et al. 2018 ("An Empirical Model of
Large-Batch Training", App. A). Given M independent micro-gradients g_m, each
the mean over b samples, with

    local_sqr = mean_m |g_m|^2        total_sqr = |mean_m g_m|^2

the unbiased estimates of the true gradient's squared norm and of the trace
of the per-sample gradient covariance are

    |G|^2 = (M * total_sqr - local_sqr) / (M - 1)
    tr(S) = b * M * (local_sqr - total_sqr) / (M - 1)

which are DESIGN.md's (B*total - b*local)/(B - b) and
(local - total)/(1/b - 1/B) with B = M*b. Each is unbiased, their ratio is not,
so each gets its own bias-corrected exponential moving average and the noise
scale is the ratio of the averages: B_simple = EMA(tr S) / EMA(|G|^2).

Everything here runs inside the compiled train function and lives in
``tf.Variable``s; callbacks read them every few steps without a collective.
"""

import math

import tensorflow as tf

_F64 = tf.float64


class GradientStatistics(tf.Module):
    """State and update rule of the in-graph gradient statistics.

    ``DistributedOptimizer`` owns one of these and calls :meth:`update` once
    per optimizer step; :meth:`result` reads the current estimates on the host.

    Args:
        ema_decay: decay of the exponential moving averages, in (0, 1).
            0.99 averages over roughly the last 100 steps.
        batch_size: the per-worker micro-batch size b if fixed and known;
            otherwise it is recorded from the data each step (see
            ``GradientStatsMonitor``).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.monitors import GradientStatistics
    >>> stats = GradientStatistics(ema_decay=0.5, batch_size=8)
    >>> # two workers: mean of |g_i|^2 = 5, |mean g|^2 = 4
    >>> _ = stats.update(tf.constant(5.0), tf.constant(4.0), num_gradients=2)
    >>> r = stats.result()
    >>> r["grad_sqr"], r["grad_var"], r["gns"]   # |G|^2=3, tr(S)=8*2*1/1=16
    (3.0, 16.0, 5.333333333333333)
    """

    def __init__(self, ema_decay=0.99, batch_size=None, name="gradient_statistics"):
        super().__init__(name=name)
        self.check_arguments(ema_decay, batch_size)
        self.ema_decay = float(ema_decay)
        self.fixed_batch_size = batch_size
        with tf.init_scope(), tf.name_scope(name):
            def var(value, dtype, vname):
                return tf.Variable(value, dtype=dtype, trainable=False, name=vname)

            self.batch_size = var(batch_size or 0, tf.int64, "batch_size")
            self.ema_grad_sqr = var(0.0, _F64, "ema_grad_sqr")
            self.ema_grad_var = var(0.0, _F64, "ema_grad_var")
            self.updates = var(0, tf.int64, "updates")
            self.nonfinite = var(0, tf.int64, "nonfinite")
            self.global_batch = var(0.0, _F64, "global_batch")
            self.last_local_sqr = var(0.0, _F64, "last_local_sqr")
            self.last_total_sqr = var(0.0, _F64, "last_total_sqr")

    @staticmethod
    def check_arguments(ema_decay, batch_size):
        """Raises a ``ValueError`` naming the fix for a bad ``ema_decay`` or ``batch_size``.

        Example:

        >>> from keras_adapt.monitors import GradientStatistics
        >>> GradientStatistics.check_arguments(1.5, None)
        Traceback (most recent call last):
        ...
        ValueError: ema_decay=1.5 is not valid; use a float strictly between 0 and 1 (e.g. 0.99 averages over about 100 steps)
        """
        if isinstance(ema_decay, bool) or not isinstance(ema_decay, (int, float)) or not (
            0.0 < float(ema_decay) < 1.0
        ):
            raise ValueError(
                f"ema_decay={ema_decay!r} is not valid; use a float strictly "
                "between 0 and 1 (e.g. 0.99 averages over about 100 steps)"
            )
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(
                f"batch_size={batch_size!r} is not valid; use a positive int (the "
                "per-worker batch size) or None to record it from the data"
            )

    def record_batch_size(self, batch_size):
        """Records the per-worker batch size b of the current step (in-graph)."""
        if self.fixed_batch_size is None:
            self.batch_size.assign(tf.cast(batch_size, tf.int64))

    def update(self, local_sqr, total_sqr, num_gradients, valid=True, batches_per_step=None):
        """Folds one step's measurements into the averages (in-graph).

        Args:
            local_sqr: mean over the M micro-gradients of their squared norms.
            total_sqr: squared norm of the mean gradient.
            num_gradients: M, the number of independent micro-gradients that
                were averaged (workers x accumulation steps). Must be >= 2;
                a python int or scalar tensor.
            valid: optional boolean (tensor) that must also hold for the
                measurement to be used (e.g. "a previous gradient exists").
            batches_per_step: how many micro-batches of size b make one
                optimizer step's global batch B (default: num_gradients).
                One worker differencing two steps has M = 2 but B = b.

        Returns:
            A boolean scalar tensor: True when the measurements were finite and
            entered the averages; False when they were skipped and counted in
            ``nonfinite``. Steps with an unknown batch size (b = 0) are skipped
            without being counted as non-finite.
        """
        local_sqr = tf.cast(local_sqr, _F64)
        total_sqr = tf.cast(total_sqr, _F64)
        m = tf.cast(num_gradients, _F64)
        per_step = m if batches_per_step is None else tf.cast(batches_per_step, _F64)
        b = tf.cast(self.batch_size, _F64)
        finite = tf.math.is_finite(local_sqr) & tf.math.is_finite(total_sqr)
        # m >= 2 is guaranteed by the callers; the maximum only keeps the
        # untaken branch free of a division by zero.
        denom = tf.maximum(m - 1.0, 1.0)
        grad_sqr = (m * total_sqr - local_sqr) / denom
        grad_var = b * m * (local_sqr - total_sqr) / denom
        usable = finite & (b > 0) & (m >= 2.0) & tf.cast(valid, tf.bool)
        beta = tf.constant(self.ema_decay, _F64)

        # Branch-free: no tf.cond (and its branch functions) on the per-step
        # path for a handful of scalars. tf.where keeps the old value when the
        # measurement is unusable, so a NaN never enters an average.
        def keep_or(var, new):
            var.assign(tf.where(usable, new, var.read_value()))

        keep_or(self.ema_grad_sqr, beta * self.ema_grad_sqr + (1.0 - beta) * grad_sqr)
        keep_or(self.ema_grad_var, beta * self.ema_grad_var + (1.0 - beta) * grad_var)
        keep_or(self.global_batch, per_step * b)
        keep_or(self.last_local_sqr, local_sqr)
        keep_or(self.last_total_sqr, total_sqr)
        self.updates.assign_add(tf.cast(usable, tf.int64))
        self.nonfinite.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        return usable

    def result(self):
        """Reads the current estimates on the host (one small device-to-host copy).

        Returns a dict of python floats with the DESIGN.md log keys:
        ``grad_sqr`` (|G|^2), ``grad_var`` (tr Sigma, per sample), ``gns``
        (B_simple), ``grad_snr`` (B / B_simple), plus ``batch_size`` (global
        batch B of the last update), ``updates`` and ``nonfinite`` counts.
        Before the first update the estimates are NaN. A non-positive
        EMA(|G|^2) means the signal is not yet resolved from the noise: the
        noise scale is reported as +inf and the SNR as 0.
        """
        updates = int(self.updates.numpy())
        out = {
            "updates": updates,
            "nonfinite": int(self.nonfinite.numpy()),
            "batch_size": float(self.global_batch.numpy()),
        }
        if updates == 0:
            nan = float("nan")
            out.update(grad_sqr=nan, grad_var=nan, gns=nan, grad_snr=nan)
            return out
        correction = 1.0 - self.ema_decay ** updates
        grad_sqr = float(self.ema_grad_sqr.numpy()) / correction
        grad_var = float(self.ema_grad_var.numpy()) / correction
        if grad_sqr > 0.0:
            # A negative variance estimate means no noise is resolved yet.
            gns = max(grad_var, 0.0) / grad_sqr
            snr = out["batch_size"] / gns if gns > 0 else math.inf
        else:
            gns, snr = math.inf, 0.0
        out.update(grad_sqr=grad_sqr, grad_var=grad_var, gns=gns, grad_snr=snr)
        return out

    def reset(self):
        """Forgets all measurements (e.g. after the model changed a lot)."""
        for v in (self.ema_grad_sqr, self.ema_grad_var, self.global_batch,
                  self.last_local_sqr, self.last_total_sqr):
            v.assign(tf.zeros_like(v))
        self.updates.assign(0)
        self.nonfinite.assign(0)
