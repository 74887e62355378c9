"""SystemSampler and SystemMonitor on one process: values against psutil and real traffic.

Two workers (one host sampled once, gathered to both ranks, written by rank
0) are covered in tests/test_adapt_tensorboard.py; the Adapt tab's System
section in tests/test_browser.py.
"""

import math
import socket
import threading
import time

import numpy as np
import psutil
import pytest

import keras
from keras_adapt.callbacks import SystemMonitor
from keras_adapt.monitors.system import SystemSampler
from keras_adapt.record import metadata


def _send_over_loopback(nbytes):
    """Sends ``nbytes`` from one local socket to another and waits until all arrived."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = []

    def receive():
        conn, _ = server.accept()
        with conn:
            total = 0
            while total < nbytes:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                total += len(chunk)
            received.append(total)

    thread = threading.Thread(target=receive)
    thread.start()
    with socket.create_connection(server.getsockname()) as client:
        client.sendall(b"x" * nbytes)
    thread.join(timeout=30)
    server.close()
    assert received == [nbytes]


def test_sampler_reads_memory_cpu_and_measures_real_loopback_traffic():
    sampler = SystemSampler(gpus=False)
    time.sleep(0.05)
    t0 = time.monotonic()
    sampler.sample()  # starts a fresh interval
    nbytes = 20 * 10 ** 6
    _send_over_loopback(nbytes)
    time.sleep(0.05)
    sample = sampler.sample()
    elapsed = time.monotonic() - t0  # a little longer than the sampler's interval
    # Loopback traffic counts as received and as sent; other processes may
    # add to it, never take away.
    assert sample["net_in_mb_s"] * elapsed * 1e6 >= 0.95 * nbytes
    assert sample["net_out_mb_s"] * elapsed * 1e6 >= 0.95 * nbytes
    assert sample["memory_percent"] == pytest.approx(psutil.virtual_memory().percent, abs=5.0)
    assert 0.0 <= sample["cpu_percent"] <= 100.0
    assert math.isnan(sample["gpu_percent"]) and math.isnan(sample["gpu_memory_percent"])
    assert set(sample) == set(metadata.SYSTEM_METRICS)


def test_sampler_without_nvml_logs_why_and_leaves_gpu_metrics_out(caplog):
    # This machine has no NVIDIA driver: with gpus=True the GPU metrics stay NaN
    # and one log line says why.
    with caplog.at_level("INFO", logger="keras_adapt"):
        sample = SystemSampler(gpus=True).sample()
    assert math.isnan(sample["gpu_percent"])
    assert any("no GPU metrics" in r.getMessage() for r in caplog.records)


def test_monitor_logs_every_interval_and_repeats_between_samples():
    rng = np.random.default_rng(0)
    x, y = rng.random((80, 4)).astype("float32"), rng.random((80, 1)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(logs.get("system/host_0/memory_percent")))
    monitor = SystemMonitor(interval=4, gpus=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[monitor, record])
    # 10 steps: sampled before steps 5 and 9 (after 4 and 8 completed), so
    # steps 1-4 have no value yet, 5-8 the first sample, 9-10 the second.
    assert seen[:4] == [None] * 4
    assert len(set(seen[4:8])) == 1 and seen[4] is not None
    assert len(set(seen[8:])) == 1 and seen[8] is not None
    assert sorted(monitor.hosts) == [0]
    assert set(monitor.hosts[0]) == {"cpu_percent", "memory_percent", "net_in_mb_s", "net_out_mb_s"}


@pytest.mark.parametrize("kwargs, error, match", [
    ({"interval": 0}, ValueError, "interval=0"),
    ({"interval": 2.5}, ValueError, "interval=2.5"),
    ({"interval": True}, ValueError, "interval=True"),
    ({"gpus": "yes"}, TypeError, "gpus must be True or False"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        SystemMonitor(**kwargs)
