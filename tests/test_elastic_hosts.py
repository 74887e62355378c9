"""Elastic training on two emulated hosts: a real ``horovodrun`` elastic job
whose workers are started over ssh in two network namespaces (``h2``, ``h3``,
tools/emulated_hosts.py), listed by a discovery script, exactly as on a
cluster. Skips, saying why, where emulated hosts cannot be made (not root).

The job is tests/workers/elastic_train.py with the settings of
tests/test_elastic.py (3 epochs of 30 steps, global batch 32 kept by
``ResizeRule("keep")``), so its weights must equal the same one-process
reference.
"""

import json
import os

import numpy as np
import pytest

from conftest import discovery_script, horovodrun_elastic

# Starting workers over ssh does not depend on the stack; on tf.keras 2,
# tests/test_elastic.py runs the same job on localhost.
pytestmark = pytest.mark.primary_only

EPOCHS, STEPS, LR = 3, 30, 0.02
TOTAL = EPOCHS * STEPS


def test_scale_down_by_discovery_on_emulated_hosts(tmp_path, emulated_hosts, elastic_reference):
    """Two workers, one per emulated host; after step 10 rank 0 rewrites the
    file the discovery script prints to list only its own host (and holds its
    steps until the driver announces the removal, however slow the machine):
    the other host's worker leaves, rank 0 goes on alone with the whole
    global batch from the next commit."""
    from keras_adapt.record.events import read_events

    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    first, second = emulated_hosts.names
    script, hosts = discovery_script(tmp_path, f"{first}:1\n{second}:1\n")
    actions = [{"step": 10, "do": "hosts", "hosts": f"{first}:1\n", "await_removal": True}]
    args = ["--out", out, "--log-dir", log, "--hosts", hosts, "--rule", "keep",
            "--epochs", EPOCHS, "--steps", STEPS, "--commit", 4, "--lr", LR,
            "--actions", json.dumps(actions)]
    done = horovodrun_elastic("elastic_train.py", args, script, np=2, min_np=1, max_np=2,
                              timeout=300, hosts=emulated_hosts)
    assert done.leftover == 0
    finals = [json.load(open(out / name)) for name in os.listdir(out) if name.startswith("final_")]
    (final,) = finals  # the removed host's worker left without finishing
    # Rank 0 ran on the host that stayed, in its namespace (its sshd's hostname).
    assert (final["host"], final["rank"], final["workers"]) == (first, 0, 1)
    assert final["syncs"][0]["workers"] == 2
    assert (final["epoch"], final["batch"]) == (EPOCHS, 0)
    assert final["iterations"] == TOTAL  # every step applied once, none twice
    assert [s["id"] for s in final["steps"]] == list(range(TOTAL))
    reference = elastic_reference(EPOCHS, STEPS, LR)
    for got, want in zip(final["weights"], reference["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    # The per-worker batch doubled; the global batch and the rate stayed.
    assert {(s["workers"], s["batch_size"]) for s in final["steps"]} == {(2, 16), (1, 32)}
    assert {s["lr"] for s in final["steps"]} == pytest.approx([LR])
    assert final["stats"]["batch_size"] == 32.0
    (event,) = read_events(str(log))
    assert event["kind"] == "resize" and event["policy"] == "KerasState"
    assert (event["before"]["workers"], event["after"]["workers"]) == (2, 1)
    assert (event["before"]["batch_size"], event["after"]["batch_size"]) == (16, 32)
    assert event["before"]["global_batch"] == event["after"]["global_batch"] == 32
    assert 0.0 < event["after"]["pause_s"] < 60.0
    first_alone = next(s for s in final["steps"] if s["workers"] == 1)
    assert event["step"] == first_alone["iterations"] and 10 < first_alone["id"] <= 10 + 4
    print(f"emulated hosts {first}+{second} -> {first}: pause {event['after']['pause_s']:.3f} s")
