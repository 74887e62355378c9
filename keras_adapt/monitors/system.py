"""Host metrics: CPU, memory, network traffic and, where present, NVIDIA GPUs.

:class:`SystemSampler` reads them on the host (psutil; NVML through
``pynvml`` when it is installed and sees a GPU). Rates (CPU use, network
bytes) are measured between two calls of :meth:`SystemSampler.sample`, so
each sample describes the interval since the previous one.
"""

import logging
import math
import time

from keras_adapt.checks import check_bool
from keras_adapt.extras import require

_LOG = logging.getLogger("keras_adapt")
_MB = 1e6


def _nvml_handles():
    """NVML device handles, or ``(None, reason)`` when no NVIDIA GPU can be read."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install 'keras-adapt[system]')"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - NVML reports a missing driver many ways
        return None, f"NVML is not available ({exc})"
    if count == 0:
        return None, "NVML sees no GPU"
    return (pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]), None


class SystemSampler:
    """Samples this host's CPU use, memory use, network traffic and GPUs.

    Keys of :meth:`sample` (the metric names of
    ``keras_adapt.record.metadata.SYSTEM_METRICS``): ``cpu_percent`` (use of
    all cores since the previous sample, 0-100), ``memory_percent`` (of the
    host's memory, now), ``net_in_mb_s`` and ``net_out_mb_s`` (bytes
    received and sent by all interfaces since the previous sample, in MB/s,
    loopback included: on one machine that is the workers' traffic) and,
    where an NVIDIA GPU and NVML are present, ``gpu_percent`` and
    ``gpu_memory_percent`` (means over the host's GPUs). A metric that
    cannot be read is NaN; without a GPU the GPU metrics are NaN and one
    log line says why.

    Args:
        gpus: read GPUs through NVML when available (``False`` skips them).

    Example:

    >>> from keras_adapt.monitors.system import SystemSampler
    >>> sampler = SystemSampler(gpus=False)
    >>> sample = sampler.sample()
    >>> 0.0 <= sample["memory_percent"] <= 100.0, sample["net_in_mb_s"] >= 0.0
    (True, True)
    """

    def __init__(self, gpus=True):
        check_bool("gpus", gpus)
        self._psutil = require("psutil", "system", "SystemSampler (SystemMonitor)")
        self._nvml = None
        if gpus:
            self._nvml, why = _nvml_handles()
            if self._nvml is None:
                _LOG.info("keras-adapt: no GPU metrics on this host: %s", why)
        self._psutil.cpu_percent(interval=None)  # starts the CPU interval
        self._last_net = self._net_bytes()
        self._last_time = time.monotonic()

    def _net_bytes(self):
        counters = self._psutil.net_io_counters()
        return (counters.bytes_recv, counters.bytes_sent) if counters is not None else None

    def sample(self):
        """The metrics now (a dict of floats), rates since the previous call."""
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        net = self._net_bytes()
        out = {
            "cpu_percent": float(self._psutil.cpu_percent(interval=None)),
            "memory_percent": float(self._psutil.virtual_memory().percent),
            "net_in_mb_s": math.nan,
            "net_out_mb_s": math.nan,
            "gpu_percent": math.nan,
            "gpu_memory_percent": math.nan,
        }
        if net is not None and self._last_net is not None:
            out["net_in_mb_s"] = max(net[0] - self._last_net[0], 0) / elapsed / _MB
            out["net_out_mb_s"] = max(net[1] - self._last_net[1], 0) / elapsed / _MB
        self._last_net, self._last_time = net, now
        if self._nvml is not None:
            pynvml, handles = self._nvml
            try:
                util = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
                mem = [pynvml.nvmlDeviceGetMemoryInfo(h) for h in handles]
                out["gpu_percent"] = float(sum(util)) / len(util)
                out["gpu_memory_percent"] = 100.0 * sum(m.used / m.total for m in mem) / len(mem)
            except Exception as exc:  # noqa: BLE001 - a GPU lost mid-run
                _LOG.info("keras-adapt: GPU metrics stopped: %s", exc)
                self._nvml = None
        return out
