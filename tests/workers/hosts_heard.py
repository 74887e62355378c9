"""HostsHeard: lets a test worker hold its steps until the elastic driver
has announced a change of hosts (tests/workers/elastic_train.py,
elastic_target_checks.py).

A worker that asked for a change (rewrote the discovery file, requested a
worker count) holds its steps until the announcement; the next commit then
raises ``HostsUpdatedInterrupt``, so the change lands at a known step however
slow discovery is on a loaded machine.
"""

import threading
import time

from horovod.runner.elastic.worker import HostUpdateResult


class HostsHeard:
    """Wraps ``state.on_hosts_updated`` (Horovod's listener of the driver's
    announcements): the events ``added``, ``removed`` and ``any`` are set
    once an announcement of that kind arrived, after the state has queued it."""

    def __init__(self, state):
        self.added, self.removed, self.any = (threading.Event() for _ in range(3))
        self._listener = state.on_hosts_updated
        state.on_hosts_updated = self

    def __call__(self, timestamp, update_res):
        self._listener(timestamp, update_res)  # first: the next commit must see it
        self.any.set()
        if update_res & HostUpdateResult.added:
            self.added.set()
        if update_res & HostUpdateResult.removed:
            self.removed.set()

    def wait(self, kind, timeout):
        """Waits (at most ``timeout`` s) for an announcement of ``kind``
        ("added", "removed" or "any"); returns the seconds waited."""
        start = time.time()
        getattr(self, kind).wait(timeout)
        return time.time() - start
