"""CommunicationPolicy: float16 gradients while their transfer takes a large share of a step."""

import math

from keras_adapt.actuators import GradientCompression
from keras_adapt.checks import check_float, check_int
from keras_adapt.formulas.communication import float32_share, transfer_share
from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.policies.timing_driven import TimingDrivenPolicy


class CommunicationPolicy(TimingDrivenPolicy, AdaptationPolicy):
    """Switches the gradients' allreduce between float32 and float16 from measured transfer time.

    At each measurement of ``monitor`` (a ``WorkerTimingMonitor``, whose
    measurements every worker shares) the policy takes the transfer's share
    of a step (:func:`~keras_adapt.formulas.communication.transfer_share`:
    the smallest wait over the workers, so waiting for a slow worker does
    not count) and its float32 equivalent
    (:func:`~keras_adapt.formulas.communication.float32_share`: what the
    share would be at float32 when float16 is on). After ``patience``
    measurements in a row at ``fp16_above`` or more it sends float16
    (Horovod's ``Compression.fp16``); after ``patience`` at ``fp32_below``
    or less, float32 again. The switch is a variable under a ``tf.cond``
    (:class:`~keras_adapt.actuators.GradientCompression`): no retrace. Each
    switch is a ``communication`` event, ``before``/``after``
    ``{"compression": ...}``.

    float16 keeps about 3 significant digits and overflows above 65504;
    a gradient that overflows becomes inf, which ``skip_nonfinite`` (on by
    default) skips. The statistics' scalars always travel as float32.

    Args:
        monitor: the ``WorkerTimingMonitor`` of the same ``fit``.
        fp16_above: float32 transfer share at or above which float16 is
            sent (0 < ``fp32_below`` < ``fp16_above`` < 1; default 0.3).
        fp32_below: float32 share at or below which float32 is sent again
            (default 0.15).
        patience: measurements in a row that must agree (>= 1; default 2).
        log_dir, verbose: see :class:`AdaptationPolicy`.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.callbacks import WorkerTimingMonitor
    >>> from keras_adapt.policies import CommunicationPolicy
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> monitor = WorkerTimingMonitor(interval=10)
    >>> policy = CommunicationPolicy(monitor, fp16_above=0.4)
    >>> policy.set_model(model); monitor.set_model(model)
    >>> policy.compression.mode
    'none'
    >>> CommunicationPolicy(monitor, fp16_above=0.1, fp32_below=0.2)
    Traceback (most recent call last):
    ...
    ValueError: fp32_below=0.2 must be below fp16_above=0.1 (a band between them keeps the compression from flipping); e.g. fp16_above=0.3, fp32_below=0.15
    """

    def __init__(self, monitor, fp16_above=0.3, fp32_below=0.15, patience=2, log_dir=None,
                 verbose=0):
        from keras_adapt.callbacks.worker_timing_monitor import WorkerTimingMonitor

        self.follow(monitor, "CommunicationPolicy(m)", WorkerTimingMonitor)
        super().__init__(interval=monitor.interval, log_dir=log_dir, verbose=verbose)
        fix = "use a share of a step in (0, 1), e.g. fp16_above=0.3, fp32_below=0.15"
        self.fp16_above = check_float("fp16_above", fp16_above, low_open=True, fix=fix)
        self.fp32_below = check_float("fp32_below", fp32_below, low_open=True, fix=fix)
        if not self.fp16_above < 1.0:
            raise ValueError(f"fp16_above={fp16_above!r} is not a share of a step; {fix}")
        if not self.fp32_below < self.fp16_above:
            raise ValueError(
                f"fp32_below={fp32_below!r} must be below fp16_above={fp16_above!r} (a band "
                "between them keeps the compression from flipping); e.g. fp16_above=0.3, "
                "fp32_below=0.15")
        self.patience = check_int("patience", patience)
        self.compression = None  # the GradientCompression actuator, made in on_attach
        self._streak = 0

    def on_attach(self, model):
        self.compression = GradientCompression(model)

    def on_adapt_begin(self, values):
        self.skip_past_measurements()
        self._streak = 0

    def wanted(self, share):
        """The mode a float32 transfer share of ``share`` asks for, or None
        (inside the band: keep the current one).

        Example:

        >>> from keras_adapt.callbacks import WorkerTimingMonitor
        >>> from keras_adapt.policies import CommunicationPolicy
        >>> policy = CommunicationPolicy(WorkerTimingMonitor(10))
        >>> policy.wanted(0.5), policy.wanted(0.2), policy.wanted(0.1)
        ('fp16', None, 'none')
        """
        if share >= self.fp16_above:
            return "fp16"
        if share <= self.fp32_below:
            return "none"
        return None

    def on_measurement(self, result):
        waits = result["wait_time"]
        steps = [c + w for c, w in zip(result["compute_time"], waits)]
        current = self.compression.mode
        share = transfer_share(steps, waits)
        if not math.isfinite(share):
            return
        share32 = float32_share(share, current == "fp16")
        wanted = self.wanted(share32)
        if wanted is None or wanted == current:
            self._streak = 0
            return
        self._streak += 1
        if self._streak < self.patience:
            return
        self._streak = 0
        self.compression.set(wanted)
        if wanted == "fp16":
            reason = (f"transfer {share32:.0%} of a step at float32 >= {self.fp16_above:.0%} "
                      f"for {self.patience} measurements")
        else:
            reason = (f"transfer {share32:.0%} of a step at float32 (measured {share:.0%} at "
                      f"float16) <= {self.fp32_below:.0%} for {self.patience} measurements")
        self.record("communication", reason, {"compression": current}, {"compression": wanted})
