"""TensorBoard's two ways of loading a log directory, as data providers for tests.

``python_provider`` builds what ``tensorboard --load_fast=false`` builds
(the Python multiplexer); ``data_server_provider`` starts the Rust data
server that plain ``tensorboard`` uses (``--load_fast=auto``), which keeps
one datum per step. Both use TensorBoard's sampling flags as adjusted by
the Adapt plugin's loader, so the tests see what a user sees.
"""

import argparse
import os
import subprocess
import tempfile
import time

from tensorboard import context as tb_context
from tensorboard.backend.event_processing import (
    data_ingester,
    data_provider,
    plugin_event_multiplexer,
)

from keras_adapt.record import metadata
from tensorboard_plugin_adapt import plugin

LOADERS = ["python", "data_server"]


def samples_per_plugin():
    """TensorBoard's sampling flags after the Adapt loader adjusted them (no user flag)."""
    flags = argparse.Namespace(samples_per_plugin={})
    plugin.AdaptLoader().fix_flags(flags)
    return flags.samples_per_plugin


def python_provider(logdir):
    """(provider, stop) as ``tensorboard --load_fast=false`` loads ``logdir``."""
    guidance = dict(data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE)
    guidance.update(samples_per_plugin())
    mux = plugin_event_multiplexer.EventMultiplexer(
        size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE, tensor_size_guidance=guidance)
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return data_provider.MultiplexerDataProvider(mux, logdir), lambda: None


def _fingerprint(provider):
    ctx = tb_context.RequestContext()
    out = {}
    for name in (metadata.PLUGIN_NAME, metadata.SCALARS_PLUGIN_NAME):
        for method in ("list_scalars", "list_tensors"):
            listed = getattr(provider, method)(ctx, experiment_id="", plugin_name=name)
            for run, tags in listed.items():
                for tag, ts in tags.items():
                    out[(name, run, tag)] = (ts.max_step, ts.max_wall_time)
    return out


def data_server_provider(logdir, expect_runs=(), timeout=60):
    """(provider, stop) as plain ``tensorboard`` loads ``logdir``: its Rust data server."""
    import grpc
    from tensorboard.data import grpc_provider, server_ingester

    binary = server_ingester.get_server_binary()
    hints = ",".join(f"{k}={'all' if v == 0 else v}" for k, v in samples_per_plugin().items())
    port_file = os.path.join(tempfile.mkdtemp(), "port")
    proc = subprocess.Popen([binary.path, f"--logdir={logdir}", "--reload=once",
                             f"--samples-per-plugin={hints}", "--port=0",
                             f"--port-file={port_file}", "--die-after-stdin"],
                            stdin=subprocess.PIPE)

    def stop():
        proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=20)

    try:
        deadline = time.time() + timeout
        port = None
        while time.time() < deadline and port is None:
            assert proc.poll() is None, f"the data server exited with {proc.returncode}"
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read()
                port = int(text) if text.endswith("\n") else None
            time.sleep(0.1)
        assert port, f"the data server did not report its port within {timeout} s"
        addr = f"localhost:{port}"
        provider = grpc_provider.GrpcDataProvider(
            addr, grpc_provider.make_stub(grpc.insecure_channel(addr)))
        # It loads in the background: wait until what it lists stops changing.
        last, stable = None, 0
        while time.time() < deadline and stable < 3:
            now = _fingerprint(provider)
            stable = stable + 1 if now == last and now else 0
            last = now
            time.sleep(0.3)
        assert set(expect_runs) <= {k[1] for k in (last or {})}, last
    except BaseException:
        stop()
        raise
    return provider, stop


def provider(loader, logdir, expect_runs=()):
    """(provider, stop) for ``loader`` in :data:`LOADERS`."""
    if loader == "python":
        return python_provider(logdir)
    return data_server_provider(logdir, expect_runs)
