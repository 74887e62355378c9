"""SystemMonitor: every host's CPU, memory, network and GPU use, in the logs."""

import math

import numpy as np
import tensorflow as tf

from keras_adapt import _hvd
from keras_adapt.callbacks._common import CachedLogs
from keras_adapt.checks import check_bool, check_interval
from keras_adapt.monitors.system import SystemSampler
from keras_adapt.record import metadata


class SystemMonitor(CachedLogs):
    """Samples every host's CPU, memory, network and GPU use while ``fit`` runs.

    One worker per host (``local_rank() == 0``) samples its host with
    :class:`~keras_adapt.monitors.system.SystemSampler` every ``interval``
    steps; one small allgather brings every host's sample to every worker,
    so all workers log the same values. The values go into the logs as
    ``system/host_<h>/<metric>`` (h: the host's index, Horovod's
    ``cross_rank``; the metrics of ``keras_adapt.record.metadata.SYSTEM_METRICS``):
    ``AdaptTensorBoard`` writes them as ``adapt/system/...`` series, which the
    Adapt tab's System section and ``keras-adapt report`` show; History and
    CSVLogger see them too. Rates (CPU, network) cover the interval since
    the previous sample; metrics a host cannot read (GPUs without NVML) are
    left out. Between samples the last values are repeated, so every batch's
    logs carry the same keys.

    Put it before ``AdaptTensorBoard`` in the callback list, so the values
    reach the logs that callback writes.

    Args:
        interval: steps between samples (positive int). Every worker must
            use the same interval (the allgather must match).
        gpus: read NVIDIA GPUs through NVML where available.

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.callbacks import SystemMonitor
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.SGD(0.01), "mse")
    >>> monitor = SystemMonitor(interval=2)
    >>> h = model.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, verbose=0, callbacks=[monitor])
    >>> "system/host_0/cpu_percent" in h.history, sorted(monitor.hosts)
    (True, [0])
    """

    def __init__(self, interval=10, gpus=True):
        super().__init__()
        self.interval = check_interval("interval", interval, "samples")
        self.gpus = check_bool("gpus", gpus)
        # The sampling and its collective run in on_train_batch_begin, on the
        # training thread in the same order on every worker; the batch-end
        # hook only copies cached floats, so Keras need not sync per step.
        self.async_safe = True
        self._supports_tf_logs = True
        self._sampler = None
        self._values = {}
        self._steps = 0

    def on_train_begin(self, logs=None):
        self._sampler = SystemSampler(self.gpus) if _hvd.local_rank() == 0 else None
        self._host = _hvd.cross_rank()
        self._values = {}
        self._steps = 0

    def on_train_batch_begin(self, batch, logs=None):
        if self._steps > 0 and self._steps % self.interval == 0:
            self._gather()
        self._steps += 1

    def _gather(self):
        names = list(metadata.SYSTEM_METRICS)
        row = [math.nan] * (1 + len(names))
        if self._sampler is not None:
            sample = self._sampler.sample()
            row = [float(self._host)] + [sample[m] for m in names]
        gathered = np.asarray(_hvd.allgather(tf.constant([row], dtype=tf.float64),
                                             name="keras_adapt_system")).reshape(-1, 1 + len(names))
        values = {}
        for host, *metrics in gathered.tolist():
            if not math.isfinite(host):
                continue  # not the sampling worker of its host
            for name, value in zip(names, metrics):
                if math.isfinite(value):
                    values[metadata.system_key(int(host), name)] = value
        self._values = values

    @property
    def hosts(self):
        """The last samples: ``{host index: {metric: value}}``."""
        out = {}
        for key, value in self._values.items():
            host, metric = metadata.parse_system_tag(key)
            out.setdefault(host, {})[metric] = value
        return out
