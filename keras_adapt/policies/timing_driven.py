"""TimingDrivenPolicy: the loop of the policies that decide on a timing monitor's measurements."""

from keras_adapt.checks import invalid


class TimingDrivenPolicy:
    """Mixin base of the policies that act once per new measurement of a
    timing monitor (``WorkerTimingMonitor``): the straggler and the
    throughput worker-scaling policies.

    It owns the loop they share: at every check (``adapt`` and the epoch's
    end) it asks the monitor for a measurement newer than the last one taken
    and hands it to :meth:`on_measurement`; measurements made before
    :meth:`skip_past_measurements` (called at the start of each ``fit``) are
    never handed on, so after an elastic reset a new worker and the others
    see the same ones. The monitor's measurements are allgathered, so every
    rank takes the same measurement at the same step.

    Put it first among the bases (``class P(TimingDrivenPolicy,
    AdaptationPolicy)``) and call :meth:`follow` in ``__init__``.

    Example:

    >>> from keras_adapt.callbacks import WorkerTimingMonitor
    >>> from keras_adapt.policies import AdaptationPolicy, TimingDrivenPolicy
    >>> class StepTimes(TimingDrivenPolicy, AdaptationPolicy):
    ...     def __init__(self, monitor):
    ...         super().__init__(interval=monitor.interval)
    ...         self.follow(monitor, "StepTimes(m)")
    ...         self.seen = []
    ...     def on_measurement(self, result):
    ...         self.seen.append(result["steps"])
    >>> monitor = WorkerTimingMonitor(interval=2)
    >>> policy = StepTimes(monitor)
    >>> policy.monitor is monitor, policy.seen
    (True, [])
    """

    def follow(self, monitor, example, monitor_type=None):
        """Takes ``monitor``'s measurements from now on; ``example`` (how to
        make this policy with ``m``, e.g. ``"StragglerPolicy(m)"``) goes into
        the error for an object that is no timing monitor: one without
        ``measurements`` and ``new_measurement(since)``, or not a
        ``monitor_type`` when one is given."""
        if monitor_type is not None:
            ok = isinstance(monitor, monitor_type)
        else:
            ok = callable(getattr(monitor, "new_measurement", None)) and hasattr(
                monitor, "measurements")
        if not ok:
            raise invalid("monitor", monitor, "pass the WorkerTimingMonitor of the same fit, "
                          f"e.g. m = WorkerTimingMonitor(10); {example}, callbacks=[m, policy]",
                          error=TypeError)
        #: The timing monitor whose measurements this policy takes.
        self.monitor = monitor
        self._taken = monitor.measurements

    def skip_past_measurements(self):
        """Only measurements made from now on are handed to :meth:`on_measurement`."""
        self._taken = self.monitor.measurements

    def on_measurement(self, result):
        """Called with each new measurement (the monitor's result dict:
        ``steps``, ``step_time``, ``compute_time``, ``throughput``, ...)."""
        raise NotImplementedError

    def adapt(self, step, values):
        self._take_measurement()

    def on_epoch_adapt(self, epoch, values):
        self._take_measurement()

    def _take_measurement(self):
        new = self.monitor.new_measurement(self._taken)
        if new is not None:
            self._taken, result = new
            self.on_measurement(result)
