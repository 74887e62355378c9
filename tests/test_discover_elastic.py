"""``keras-adapt discover`` driving Horovod Elastic for real: a worker asks for
another count through ``WorkerTarget`` and ``horovodrun`` changes the membership."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import BIN, WORKERS, _env
from keras_adapt import discover

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _elastic_run(tmp_path, start, request):
    horovodrun = os.path.join(BIN, "horovodrun")
    if not os.path.exists(horovodrun):
        pytest.skip("horovodrun is not installed in this environment")
    hosts, target = tmp_path / "hosts", str(tmp_path / "target")
    hosts.write_text("localhost:2\n")
    discover.write_target(target, start)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m keras_adapt discover\n")
    script.chmod(0o755)
    env = _env()
    env.update(KERAS_ADAPT_HOSTS_FILE=str(hosts), KERAS_ADAPT_TARGET_FILE=target)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    cmd = [horovodrun, "-np", str(start), "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(script), "--network-interface", "lo", "--gloo",
           sys.executable, os.path.join(WORKERS, "elastic_target_checks.py"),
           "--out", str(tmp_path), "--request", str(request)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)   # the whole job, workers included
        stdout, stderr = proc.communicate()
        pytest.fail(f"elastic run timed out after 240 s\n{stdout[-6000:]}\n{stderr[-6000:]}")
    assert proc.returncode == 0, stdout[-6000:] + stderr[-6000:]
    with open(tmp_path / "sizes.json") as f:
        return json.load(f), discover.read_target(target)


@pytest.mark.parametrize("start, wanted", [(2, 1), (1, 2)])
def test_a_requested_count_changes_the_membership(tmp_path, start, wanted):
    result, target = _elastic_run(tmp_path, start, wanted)
    sizes = result["sizes"]
    assert target == wanted
    assert len(sizes) == 40   # every step ran once, across the reset
    first_new = sizes.index(wanted)
    # The old count up to the request (step 5), the new one from the change on.
    assert first_new > 5 and sizes[:first_new] == [start] * first_new
    assert sizes[first_new:] == [wanted] * (40 - first_new)
    print(f"{start}->{wanted}: request at step 5, first step at {wanted} workers: "
          f"{first_new}; {result['seconds']:.2f} s from request to the new count")
