"""``keras-adapt discover`` driving Horovod Elastic for real: a worker asks for
another count through ``WorkerTarget``, or ``StragglerPolicy`` excludes a slow
worker's host through the exclusion file, and ``horovodrun`` changes the
membership."""

import json
import os
import sys

import pytest

from conftest import horovodrun_elastic
from keras_adapt import discover

# The discovery command and Horovod's driver do not depend on the stack; on
# tf.keras 2, tests/test_elastic.py runs the worker side (KerasState).
pytestmark = pytest.mark.primary_only


def _elastic_run(tmp_path, start, worker_args, hosts="localhost:2\n", extra_env=None):
    """One elastic job of tests/workers/elastic_target_checks.py whose
    discovery script is ``keras-adapt discover`` reading the hosts file, the
    target file (``start`` workers) and the exclusion file from the
    environment; returns the job's output and the target file's and the
    exclusion file's paths."""
    hosts_file, target = tmp_path / "hosts", str(tmp_path / "target")
    exclude = str(tmp_path / "excluded")
    hosts_file.write_text(hosts)
    discover.write_target(target, start)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m keras_adapt discover\n")
    script.chmod(0o755)
    env = {"KERAS_ADAPT_HOSTS_FILE": str(hosts_file), "KERAS_ADAPT_TARGET_FILE": target,
           "KERAS_ADAPT_EXCLUDE_FILE": exclude, **(extra_env or {})}
    done = horovodrun_elastic("elastic_target_checks.py", ["--out", tmp_path, *worker_args],
                              str(script), np=start, timeout=240, extra_env=env)
    assert done.leftover == 0
    return done, target, exclude


@pytest.mark.parametrize("start, wanted", [(2, 1), (1, 2)])
def test_a_requested_count_changes_the_membership(tmp_path, start, wanted):
    _, target, _ = _elastic_run(tmp_path, start, ["--request", wanted])
    with open(tmp_path / "sizes.json") as f:
        result = json.load(f)
    sizes = result["sizes"]
    assert discover.read_target(target) == wanted
    assert len(sizes) == 40   # every step ran once, across the reset
    first_new = sizes.index(wanted)
    # The old count up to the request (step 5), the new one from the commit
    # after it on (rank 0 held its steps until the change was announced).
    assert first_new == 6 and sizes[:first_new] == [start] * first_new
    assert sizes[first_new:] == [wanted] * (40 - first_new)
    print(f"{start}->{wanted}: request at step 5, first step at {wanted} workers: "
          f"{first_new}; {result['seconds']:.2f} s from request to the new count")


EPOCHS, STEPS = 2, 40


def test_a_straggler_host_is_excluded_and_the_job_goes_on_without_it(tmp_path):
    """Two hosts (localhost and 127.0.0.1, one worker each), rank 1 slowed 3x:
    StragglerPolicy(action="exclude") writes rank 1's host to the exclusion
    file, keras-adapt discover leaves it out, Horovod stops that worker and
    the other one finishes every step, once. A second policy on the same
    measurements, with min_workers=2, refuses and warns."""
    from keras_adapt.record.events import read_events

    log = tmp_path / "log"
    done, _, exclude = _elastic_run(
        tmp_path, 2, ["--straggler", "--log-dir", log, "--epochs", EPOCHS, "--steps", STEPS],
        hosts="localhost:1\n127.0.0.1:1\n", extra_env={"KERAS_ADAPT_SLOW_RANK": "1:3"})
    finals = [json.load(open(tmp_path / n)) for n in os.listdir(tmp_path)
              if n.startswith("final_")]
    # Only the healthy worker finished: the excluded one was stopped.
    assert len(finals) == 1, [(f["rank"], f["events"], f["excluded"]) for f in finals]
    final = finals[0]
    first = final["steps"][0]
    assert (first["workers"], first["rank"]) == (2, 0)   # it started as rank 0 of 2
    slow_host = next(h for h in ("localhost", "127.0.0.1") if h != final["host"])
    assert discover.read_excluded(exclude) == [slow_host]
    # What discover answers now: the healthy host only.
    assert discover.discover(hosts_file=str(tmp_path / "hosts"),
                             exclude_file=exclude, cache=False) == f"{final['host']}:1"
    # Every step ran once, none twice, and the position is the end.
    total = EPOCHS * STEPS
    assert [s["id"] for s in final["steps"]] == list(range(total))
    assert (final["epoch"], final["batch"], final["iterations"]) == (EPOCHS, 0, total)
    assert final["workers"] == 1 and final["excluded"] == [slow_host]
    # Two workers up to the exclusion, one after (per-worker batch 16 -> 32).
    change = next(i for i, s in enumerate(final["steps"]) if s["workers"] == 1)
    assert {(s["workers"], s["batch_size"]) for s in final["steps"][:change]} == {(2, 16)}
    assert {(s["workers"], s["batch_size"]) for s in final["steps"][change:]} == {(1, 32)}
    # On disk, in order: at one update, the straggler events (rank 1 flagged;
    # min_workers=2 keeps its host, min_workers=1 excludes it), then the
    # elastic state's resize 2 -> 1.
    kept, straggler, resize = read_events(str(log))
    assert kept["kind"] == straggler["kind"] == "straggler"
    assert kept["policy"] == straggler["policy"] == "StragglerPolicy"
    after = straggler["after"]
    assert (after["straggler_rank"], after["action"], after["host"]) == (1, "exclude", slow_host)
    assert after["workers_left"] == 1 and after["ratio"] > 1.067
    assert after["compute_time"] == pytest.approx(after["ratio"] * after["median_compute_time"])
    assert f"host {slow_host} excluded (1 of 2 workers left)" in straggler["reason"]
    refusal = (f"host {slow_host} not excluded: that would leave 1 of 2 workers, fewer than "
               "min_workers=2")
    same = {k: v for k, v in after.items() if k != "workers_left"}
    assert kept["after"] == {**same, "action": "record"} and refusal in kept["reason"]
    assert kept["step"] == straggler["step"]
    assert done.stderr.count(f"StragglerPolicy: {refusal}") == 1   # warned, on rank 0
    assert resize["kind"] == "resize" and resize["policy"] == "KerasState"
    assert (resize["before"]["workers"], resize["after"]["workers"]) == (2, 1)
    assert straggler["step"] < resize["step"] == final["steps"][change]["iterations"]
    # the survivor's own record of the decisions; nothing kept by the refusing one
    assert (final["events"], final["kept_events"], final["kept"]) == ([straggler], [kept], [])
    print(f"excluded {slow_host} at update {straggler['step']} (ratio {after['ratio']:.2f}), "
          f"one worker from update {resize['step']}, pause {resize['after']['pause_s']:.3f} s")
