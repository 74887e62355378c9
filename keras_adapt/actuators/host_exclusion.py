"""HostExclusion: leaves a host out of the job, through ``keras-adapt discover``."""

import os
import warnings

import numpy as np

from keras_adapt import _hvd, discover

#: Set by ``horovodrun`` in every worker of an elastic job: the host's name
#: as the discovery script printed it.
HOSTNAME_ENV = "HOROVOD_HOSTNAME"
#: Set to 1 by ``horovodrun`` in the workers of an elastic job.
ELASTIC_ENV = "HOROVOD_ELASTIC"
# Bytes per host name in the allgather (a DNS name has at most 253).
_HOST_BYTES = 256


class HostExclusion:
    """Adds hosts to the exclusion file that ``keras-adapt discover`` reads.

    ``keras-adapt discover`` (the ``--host-discovery-script`` of
    ``horovodrun``) leaves the hosts named in this file out of its answer,
    so Horovod Elastic stops the workers running there and the job goes on
    without them. :meth:`exclude` appends a host atomically on rank 0 only
    (:func:`keras_adapt.discover.exclude_host`; nothing is written when the
    file names it already); every rank may call it with the same host
    (policies decide from identical inputs), the others only keep the name.
    A host stays excluded until its line is removed from the file (or the
    file is); it can then join again, and be excluded again.

    Args:
        exclude_file: the exclusion file (default: the environment variable
            ``KERAS_ADAPT_EXCLUDE_FILE``, which ``horovodrun`` passes on to
            the workers). An existing file must be well formed.

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.actuators import HostExclusion
    >>> from keras_adapt.discover import read_excluded
    >>> path = os.path.join(tempfile.mkdtemp(), "excluded")
    >>> exclusion = HostExclusion(path)
    >>> exclusion.exclude("node-b"); exclusion.exclude("node-c"); exclusion.exclude("node-b")
    >>> exclusion.excluded, read_excluded(path)
    (['node-b', 'node-c'], ['node-b', 'node-c'])
    """

    def __init__(self, exclude_file=None):
        self.exclude_file = discover.input_file(exclude_file, discover.ENV_EXCLUDE_FILE,
                                                "HostExclusion", "--exclude-file")
        discover.read_excluded(self.exclude_file)  # a malformed file fails now, not mid-run
        self._excluded = []

    @property
    def excluded(self):
        """The hosts this job excluded, in order, each once (the same list on
        every rank)."""
        return list(self._excluded)

    @staticmethod
    def this_host():
        """This worker's host as the discovery script names it (``HOROVOD_HOSTNAME``).

        Raises ``ValueError`` outside an elastic ``horovodrun`` job, where
        no discovery script could leave a host out.
        """
        host = os.environ.get(HOSTNAME_ENV)
        if os.environ.get(ELASTIC_ENV) != "1" or not host:
            raise ValueError(
                "excluding a host needs a Horovod Elastic job: start it with horovodrun "
                "--host-discovery-script S (S runs keras-adapt discover --exclude-file F), "
                f"which sets {ELASTIC_ENV}=1 and {HOSTNAME_ENV} in every worker; here "
                f"{ELASTIC_ENV}={os.environ.get(ELASTIC_ENV)!r}, "
                f"{HOSTNAME_ENV}={host!r}")
        return host

    def worker_hosts(self):
        """Every worker's host, by rank (one small allgather: every rank
        must call it at the same point). With one worker: ``[this_host()]``."""
        host = self.this_host()
        raw = host.encode("utf-8")
        if len(raw) > _HOST_BYTES:
            raise ValueError(f"{HOSTNAME_ENV}={host!r} is longer than {_HOST_BYTES} bytes; "
                             "name the hosts in the discovery output by shorter names")
        if _hvd.size() == 1:
            return [host]
        import tensorflow as tf

        row = np.zeros((1, _HOST_BYTES), np.uint8)
        row[0, :len(raw)] = np.frombuffer(raw, np.uint8)
        gathered = np.asarray(_hvd.allgather(tf.constant(row), name="keras_adapt_worker_hosts"))
        return [bytes(r).rstrip(b"\0").decode("utf-8") for r in gathered]

    def exclude(self, host):
        """Excludes ``host``: rank 0 appends it to the file unless the file
        names it already.

        If rank 0 cannot write it (the file was made malformed or
        unwritable during the run), it warns, naming the file and the
        error, and the job goes on with the host: a training run is never
        stopped for this.
        """
        if _hvd.rank() == 0:
            try:
                discover.exclude_host(self.exclude_file, host)
            except (OSError, ValueError) as exc:
                warnings.warn(f"keras-adapt: host {host!r} could not be excluded: {exc}",
                              RuntimeWarning, stacklevel=2)
        if host not in self._excluded:
            self._excluded.append(host)
