"""``keras-adapt discover`` driving Horovod Elastic for real: a worker asks for
another count through ``WorkerTarget`` and ``horovodrun`` changes the membership."""

import json
import sys

import pytest

from conftest import horovodrun_elastic
from keras_adapt import discover


def _elastic_run(tmp_path, start, request):
    hosts, target = tmp_path / "hosts", str(tmp_path / "target")
    hosts.write_text("localhost:2\n")
    discover.write_target(target, start)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m keras_adapt discover\n")
    script.chmod(0o755)
    done = horovodrun_elastic(
        "elastic_target_checks.py", ["--out", tmp_path, "--request", request], str(script),
        np=start, timeout=240,
        extra_env={"KERAS_ADAPT_HOSTS_FILE": str(hosts), "KERAS_ADAPT_TARGET_FILE": target})
    assert done.leftover == 0
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
