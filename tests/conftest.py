"""Shared test helpers: running real multi-process Horovod jobs."""

import json
import os
import shutil
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


def horovodrun(script, script_args=(), np=2, controller="gloo", timeout=600):
    """Runs ``horovodrun -np N -H localhost:N --<controller> python script ...``.

    Returns the completed process; fails the test with the job's output if
    the job exits non-zero or times out.
    """
    horovodrun_bin = os.path.join(BIN, "horovodrun")
    if not os.path.exists(horovodrun_bin):
        pytest.skip("horovodrun is not installed in this environment")
    cmd = [horovodrun_bin, "-np", str(np), "-H", f"localhost:{np}", f"--{controller}"]
    if controller == "mpi":
        cmd += ["--mpi-args=--oversubscribe"]
    cmd += [sys.executable, os.path.join(WORKERS, script), *map(str, script_args)]
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{exc.stdout}\n{exc.stderr}")
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-8000:]}"
            f"\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


def load_rank_results(out_dir, np):
    results = []
    for r in range(np):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    return results
