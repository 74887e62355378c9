"""WorkerTarget: asks the job for a number of workers, through ``keras-adapt discover``."""

from keras_adapt import _hvd, discover
from keras_adapt.checks import check_int, invalid


class WorkerTarget:
    """Writes the worker count the job should have into the target file.

    ``keras-adapt discover`` (the ``--host-discovery-script`` of
    ``horovodrun``) caps the hosts it lists at this count, so Horovod
    Elastic starts or stops workers to match (within ``--min-np`` and
    ``--max-np`` and the slots the hosts have). :meth:`request` writes the
    file atomically on rank 0 only; every rank may call it with the same
    value (policies decide from identical inputs), the others only keep
    the value. The change of membership happens later, when Horovod sees
    the new hosts (about a second) and the workers reach their next
    commit or ``check_host_updates``.

    Args:
        target_file: the target file ``keras-adapt discover`` reads
            (default: the environment variable ``KERAS_ADAPT_TARGET_FILE``,
            which ``horovodrun`` passes on to the workers).
        min_workers, max_workers: the counts :meth:`request` accepts.

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.actuators import WorkerTarget
    >>> from keras_adapt.discover import read_target
    >>> path = os.path.join(tempfile.mkdtemp(), "target")
    >>> target = WorkerTarget(path, min_workers=1, max_workers=4)
    >>> target.request(3), read_target(path), target.requested
    (True, 3, 3)
    >>> target.request(3)   # already asked for: nothing written
    False
    """

    def __init__(self, target_file=None, min_workers=1, max_workers=None):
        self.target_file = discover.input_file(target_file, discover.ENV_TARGET_FILE,
                                               "WorkerTarget", "--target-file")
        self.min_workers = check_int("min_workers", min_workers)
        self.max_workers = check_int("max_workers", max_workers, none=True)
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"max_workers={max_workers} is below min_workers={min_workers}; "
                             "use min_workers <= max_workers")
        self._requested = None

    @property
    def requested(self):
        """The count last requested by this job (None before the first request)."""
        return self._requested

    def read(self):
        """The count in the target file now (None: no cap or no file; raises
        ``ValueError`` when the file holds something else)."""
        return discover.read_target(self.target_file)

    def request(self, workers):
        """Asks for ``workers`` workers; returns False when that is the count
        already requested (nothing written), True otherwise."""
        workers = check_int("workers", workers)
        high = "" if self.max_workers is None else f" and <= max_workers={self.max_workers}"
        if workers < self.min_workers or (self.max_workers is not None
                                          and workers > self.max_workers):
            raise invalid("workers", workers, f"use a count >= min_workers="
                          f"{self.min_workers}{high}")
        if workers == self._requested:
            return False
        if _hvd.rank() == 0:
            discover.write_target(self.target_file, workers)
        self._requested = workers
        return True
