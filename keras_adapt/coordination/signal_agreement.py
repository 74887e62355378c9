"""SignalAgreement: a signal or cloud notice only sets a flag; one tiny allreduce tells every rank who got one."""

import collections
import signal
import threading
import time

import numpy as np

from keras_adapt import _hvd
from keras_adapt.checks import invalid
from keras_adapt.coordination.revocation_notices import PROVIDERS

#: The signals a preempted machine (SIGTERM) or a user (SIGINT, Ctrl-C) sends.
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The default exit code of a process that stops for one of them:
#: ``EX_TEMPFAIL`` of ``sysexits.h``, "a temporary failure, the user is
#: invited to retry".
EXIT_CODE = 75
#: The number that stands for a notice source in the agreement (above every
#: signal number): 1000 + its place among the providers, sorted by name.
_SOURCE_CODES = {name: 1000 + i for i, name in enumerate(sorted(PROVIDERS))}
_SOURCE_NAMES = {code: name for name, code in _SOURCE_CODES.items()}


class SignalAgreement:
    """This process's signal flag, and the one collective by which all
    ranks learn, at the same step, which ranks were signalled and when.

    The handler (installed by :meth:`install`, on the main thread) only
    records the first signal: its name and time, then calls ``on_signal``
    if given. A revocation notice of a cloud VM
    (:class:`~keras_adapt.coordination.RevocationNotices`, from its thread)
    is recorded the same way by :meth:`request`, with its source (``"gce"``,
    ``"aws"``, ``"azure"``) for the signal's name and the deadline it gives.
    :meth:`agree`, called by every rank at the same point, is one host
    allreduce of ``3 x workers`` numbers (each rank's request time, signal
    number or source code, deadline; 0 when none) plus any ``extra`` numbers
    the caller wants averaged in the same collective. Used by
    :class:`~keras_adapt.callbacks.PreemptionCheckpoint` (every rank stops)
    and :class:`~keras_adapt.elastic.LeaveOnSignalCallback` (the signalled
    ranks leave an elastic job).

    Args:
        name: the allreduce's name (one per user, so two never mix).
        signals: the signals handled.
        on_signal: called as ``on_signal(name, deadline)`` after the first
            request is recorded (``deadline``: a notice's ``time.time()``
            deadline, None for a signal; in the handler: keep it short), or
            None.

    Attributes:
        requested: whether this process got a signal or a notice.
        signal: the name of the first one (``"SIGTERM"``, ``"gce"``), or None.
        signal_time: its ``time.time()``, or None.
        deadline: the notice's deadline (``time.time()``), or None.
        signalled: after :meth:`agree`, ``{rank: (signal name, time)}`` of
            every signalled rank.
        deadlines: after :meth:`agree`, ``{rank: deadline}`` of the ranks
            whose request came with a deadline.

    Example:

    >>> import os, signal
    >>> from keras_adapt.coordination import SignalAgreement
    >>> agreement = SignalAgreement("demo_signals", signals=(signal.SIGUSR1,))
    >>> agreement.install()
    >>> os.kill(os.getpid(), signal.SIGUSR1)
    >>> agreement.requested, agreement.signal
    (True, 'SIGUSR1')
    >>> signalled, extra = agreement.agree([2.5])
    >>> sorted(signalled), signalled[0][0], float(extra[0])
    ([0], 'SIGUSR1', 2.5)
    >>> agreement.remove()
    >>> agreement.clear(); agreement.request("aws", deadline=2e9)
    >>> signalled, _ = agreement.agree()
    >>> signalled[0][0], agreement.deadlines
    ('aws', {0: 2000000000.0})
    """

    def __init__(self, name, signals=SIGNALS, on_signal=None):
        if not isinstance(name, str) or not name:
            raise invalid("name", name, "use a non-empty string naming the allreduce")
        signals = tuple(signals)
        if not signals or not all(isinstance(s, int) and not isinstance(s, bool)
                                  for s in signals):
            raise invalid("signals", signals, "use signal numbers such as "
                          "(signal.SIGTERM, signal.SIGINT)")
        if on_signal is not None and not callable(on_signal):
            raise TypeError(f"on_signal must be callable or None, got {on_signal!r}")
        self.name = name
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.on_signal = on_signal
        self.requested = False
        self.signal = None
        self.signal_time = None
        self.deadline = None
        self.signalled = {}
        self.deadlines = {}
        self._old_handlers = {}
        # Reentrant: a signal may come while the main thread records one.
        self._lock = threading.RLock()

    def clear(self):
        """Forgets a signal recorded before (a new run starts)."""
        with self._lock:
            self.requested, self.signal, self.signal_time = False, None, None
            self.deadline, self.signalled, self.deadlines = None, {}, {}

    def install(self):
        """Installs the handlers (on the main thread; again: no effect)."""
        if self._old_handlers:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be set on the main thread: run fit "
                               "there")
        for sig in self.signals:
            self._old_handlers[sig] = signal.signal(sig, self._handle)

    def remove(self):
        """Puts the previous handlers back."""
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}

    def _handle(self, signum, frame):
        self._record(signal.Signals(signum).name, None)

    def request(self, source, deadline=None):
        """Records a stop request from ``source`` (a provider of
        :data:`~keras_adapt.coordination.revocation_notices.PROVIDERS`), due
        by ``deadline`` (``time.time()``, or None), as a signal would be
        (after the first: no effect). Any thread may call it."""
        if source not in _SOURCE_CODES:
            raise invalid("source", source, f"use one of {sorted(_SOURCE_CODES)}")
        self._record(source, None if deadline is None else float(deadline))

    def _record(self, name, deadline):
        with self._lock:
            if self.requested:
                return
            self.requested = True
            self.signal, self.signal_time, self.deadline = name, time.time(), deadline
        if self.on_signal is not None:
            self.on_signal(name, deadline)

    def agree(self, extra=()):
        """The collective: every rank must call it at the same point.

        Returns ``(signalled, extra_mean)``: ``{rank: (signal name, signal
        time)}`` of the ranks that got a signal or a notice (the same on
        every rank; :attr:`deadlines` their notices' deadlines), and the
        mean over the ranks of ``extra`` (a numpy array).
        """
        size, rank = _hvd.size(), _hvd.rank()
        extra = np.asarray(extra, dtype=np.float64).reshape(-1)
        values = np.zeros(3 * size + extra.size)
        with self._lock:
            if self.requested:
                # The mean of values that are 0 on every other rank: times size.
                values[rank] = self.signal_time * size
                code = _SOURCE_CODES.get(self.signal) or signal.Signals[self.signal].value
                values[size + rank] = float(code) * size
                values[2 * size + rank] = (self.deadline or 0.0) * size
        values[3 * size:] = extra
        values = _hvd.host_allreduce_mean(values, self.name)
        codes = [int(round(v)) for v in values[size:2 * size]]
        self.signalled = {r: (_SOURCE_NAMES.get(codes[r]) or signal.Signals(codes[r]).name,
                              float(values[r]))
                          for r in range(size) if values[r] > 0.0}
        self.deadlines = {r: float(values[2 * size + r]) for r in self.signalled
                          if values[2 * size + r] > 0.0}
        return self.signalled, values[3 * size:]


def auto_check_interval(check_s, step_s, deadline_s, overhead=0.01):
    """Steps between two agreements on the stop flag under
    ``check_interval="auto"``: the fewest that keep one agreement of
    ``check_s`` seconds under ``overhead`` of the step time ``step_s``,
    capped so that the steps between two agreements take at most a quarter
    of ``deadline_s`` (at least 1 step; 1000 without a deadline).

    Example (an agreement of 5 ms, steps of 7 ms and of 1 s, 25 s deadline):

    >>> from keras_adapt.coordination.signal_agreement import auto_check_interval
    >>> auto_check_interval(0.005, 0.007, 25.0), auto_check_interval(0.005, 1.0, 25.0)
    (72, 1)
    >>> auto_check_interval(0.005, 0.001, 2.0)   # capped: 500 steps = 0.5 s
    500
    """
    wanted = int(np.ceil(check_s / (overhead * step_s))) if step_s > 0 else 1
    cap = 1000 if deadline_s is None else int(0.25 * deadline_s / step_s) if step_s > 0 else 1
    return max(1, min(wanted, cap))


class CheckInterval:
    """When the ranks agree on the signal flags: every ``setting`` steps, or
    under ``"auto"`` as the measured step and agreement times say.

    Each agreement also averages the ranks' median step time since the last
    one and their agreement time (the shortest of their last 8: a longer
    one mostly waited for a slower rank), and under ``"auto"`` the next
    interval is :func:`auto_check_interval` of them, at most twice the last
    (one slow early agreement, a rank still tracing, must not space the
    next ones by seconds); the same on every rank.

    Args:
        setting: an int (steps) or ``"auto"`` (starts at 1).
        deadline_s: the grace period after a signal (None: no limit).

    Attributes:
        interval: steps to the next agreement.

    Example:

    >>> from keras_adapt.coordination.signal_agreement import CheckInterval, SignalAgreement
    >>> schedule = CheckInterval("auto", deadline_s=25.0)
    >>> schedule.start(); schedule.step_ended(); schedule.step_ended()
    >>> signalled = schedule.agree(SignalAgreement("demo_schedule"))
    >>> signalled, schedule.interval >= 1
    ({}, True)
    """

    def __init__(self, setting, deadline_s):
        self.setting = setting
        self.deadline_s = deadline_s
        self.interval = 1
        self._last_end = None
        self._step_seconds = []
        self._check_seconds = collections.deque(maxlen=8)

    def start(self):
        """A new ``fit``: the first interval, no step timed yet."""
        self.interval = 1 if self.setting == "auto" else self.setting
        self._last_end = None
        self._step_seconds = []

    def step_ended(self):
        """Times the step that just ended (from the end of the last one)."""
        now = time.perf_counter()
        if self._last_end is not None:
            self._step_seconds.append(now - self._last_end)
        self._last_end = now

    def agree(self, agreement):
        """Runs ``agreement.agree`` (every rank at the same step) with the
        timings, sets the next interval; returns the signalled ranks."""
        extra = [float(np.median(self._step_seconds)) if self._step_seconds else 0.0,
                 min(self._check_seconds, default=0.0)]
        start = time.perf_counter()
        signalled, (step_s, check_s) = agreement.agree(extra)
        self._check_seconds.append(time.perf_counter() - start)
        self._step_seconds = []
        if self.setting == "auto" and step_s > 0.0:
            self.interval = min(2 * self.interval,
                                auto_check_interval(check_s, step_s, self.deadline_s))
        self._last_end = time.perf_counter()  # the agreement is not step time
        return signalled
