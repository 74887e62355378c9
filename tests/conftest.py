"""Shared test helpers: running real multi-process Horovod jobs."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
BIN = os.path.dirname(sys.executable)


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # OpenMPI refuses to start as root unless told that is intended.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if os.environ.get("KERAS_ADAPT_TEST_INSTALLED") != "1":
        # Workers import this checkout (tools/check_install.sh tests the
        # installed wheel instead and sets KERAS_ADAPT_TEST_INSTALLED=1).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                          env.get("PYTHONPATH")]))
    return env


def controllers():
    """Horovod controllers to test with: Gloo always, MPI when Horovod has it."""
    out = ["gloo"]
    try:
        import horovod.tensorflow as hvd

        if hvd.mpi_built() and shutil.which("mpirun"):
            out.append("mpi")
    except ImportError:
        pass
    return out


def horovodrun(script, script_args=(), np=2, controller="gloo", timeout=600, hosts=None):
    """Runs ``horovodrun -np N -H localhost:N --<controller> python script ...``.

    With ``hosts`` (the ``emulated_hosts`` fixture) the job runs one worker
    on each emulated host instead, started over ssh. Returns the completed
    process; fails the test with the job's output if the job exits non-zero
    or times out (then the whole job is killed, workers included).
    """
    horovodrun_bin = os.path.join(BIN, "horovodrun")
    if not os.path.exists(horovodrun_bin):
        pytest.skip("horovodrun is not installed in this environment")
    if hosts is None:
        cmd = [horovodrun_bin, "-np", str(np), "-H", f"localhost:{np}", f"--{controller}"]
    else:
        assert np == len(hosts.names), (np, hosts.names)
        cmd = [horovodrun_bin, *hosts.horovodrun_args(), f"--{controller}"]
    if controller == "mpi":
        cmd += ["--mpi-args=--oversubscribe"]
    cmd += [sys.executable, os.path.join(WORKERS, script), *map(str, script_args)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{stdout}\n{stderr}")
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{stdout[-8000:]}"
            f"\n--- stderr\n{stderr[-8000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.fixture(scope="session")
def emulated_hosts():
    """Two emulated hosts (network namespaces with their own sshd, see
    tools/emulated_hosts.py) for the session; skips, saying why, where they
    cannot be made (not root, no sshd, no network namespaces)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
    try:
        import emulated_hosts as tool
    finally:
        sys.path.pop(0)
    why = tool.unavailable()
    if why:
        pytest.skip(f"emulated hosts unavailable: {why}")
    with tool.emulated_hosts(2) as hosts:
        yield hosts


def load_rank_results(out_dir, np):
    results = []
    for r in range(np):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    return results
