"""Elastic training: real ``horovodrun`` elastic jobs (Gloo, host discovery on
one machine as the two hosts ``localhost`` and ``127.0.0.1``), and the
single-process rules of the elastic callbacks and the resize rule.

Each job trains 3 epochs of 30 steps (tests/workers/elastic_train.py); the
hosts file the discovery script prints is rewritten by rank 0 at a given
step, or a worker SIGKILLs itself.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import WORKERS, _env, discovery_script, horovodrun_elastic

EPOCHS, STEPS, COMMIT = 3, 30, 4
TOTAL = EPOCHS * STEPS
TWO_HOSTS = "localhost:1\n127.0.0.1:1\n"
ONE_HOST = "localhost:1\n"
LR = 0.02


def _job(tmp_path, rule, actions):
    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    script, hosts = discovery_script(tmp_path, TWO_HOSTS)
    args = ["--out", out, "--log-dir", log, "--hosts", hosts, "--rule", rule,
            "--epochs", EPOCHS, "--steps", STEPS, "--commit", COMMIT, "--lr", LR,
            "--actions", json.dumps(actions)]
    done = horovodrun_elastic("elastic_train.py", args, script, np=2, min_np=1, max_np=2,
                              timeout=300)
    finals = [json.load(open(out / name)) for name in sorted(os.listdir(out))
              if name.startswith("final_")]
    finals.sort(key=lambda r: r["rank"])
    from keras_adapt.events import read_events

    return done, finals, read_events(str(log))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same global batches in one process, without elastic machinery."""
    out = tmp_path_factory.mktemp("reference")
    subprocess.run([sys.executable, os.path.join(WORKERS, "elastic_train.py"), "--out", str(out),
                    "--reference", "--epochs", str(EPOCHS), "--steps", str(STEPS),
                    "--lr", str(LR)], env=_env(), check=True, capture_output=True, timeout=300)
    with open(out / "reference.json") as f:
        return json.load(f)


def _ids(final):
    return [s["id"] for s in final["steps"]]


def _assert_finished(final):
    assert (final["epoch"], final["batch"]) == (EPOCHS, 0)
    assert final["iterations"] == TOTAL  # every step applied once, none twice
    assert np.isfinite(final["stats"]["gns"]) and final["stats"]["gns"] > 0


def _assert_weights(final, reference):
    # "keep": every worker count computes the same global batches, so the
    # weights equal the one-process run's iff no step was lost or repeated.
    for got, want in zip(final["weights"], reference["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def _first_step_with(final, workers, after=0):
    """The first step run with ``workers`` workers after update ``after``:
    the step whose end records the resize event."""
    return next(s for s in final["steps"] if s["workers"] == workers and s["iterations"] > after)


def _resize(event, before, after):
    assert event["kind"] == "resize" and event["rank"] == 0 and event["policy"] == "KerasState"
    assert (event["before"]["workers"], event["after"]["workers"]) == (before, after)
    assert 0.0 < event["after"]["pause_s"] < 60.0
    return event


def test_scale_down_by_discovery_keeps_the_global_batch(tmp_path, reference):
    done, finals, events = _job(tmp_path, "keep", [
        {"step": 10, "do": "hosts", "hosts": ONE_HOST}])
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [1]  # the removed worker left
    final = finals[0]
    _assert_finished(final)
    assert _ids(final) == list(range(TOTAL))  # exactly once each, in order
    _assert_weights(final, reference)
    # The per-worker batch doubled, the global batch and the rate stayed.
    assert {(s["workers"], s["batch_size"]) for s in final["steps"]} == {(2, 16), (1, 32)}
    assert {s["lr"] for s in final["steps"]} == pytest.approx([LR])
    (event,) = events
    _resize(event, 2, 1)
    assert (event["before"]["batch_size"], event["after"]["batch_size"]) == (16, 32)
    assert event["before"]["global_batch"] == event["after"]["global_batch"] == 32
    assert event["before"]["lr"] == pytest.approx(LR) and event["after"]["lr"] == pytest.approx(LR)
    assert event["step"] == _first_step_with(final, 1)["iterations"]
    # The statistics after the change come from the one-worker estimator
    # over the whole global batch of 32.
    assert final["stats"]["batch_size"] == 32.0
    print(f"scale-down pause {event['after']['pause_s']:.3f} s")


def test_scale_down_then_up_rescales_the_learning_rate(tmp_path):
    done, finals, events = _job(tmp_path, "scale", [
        {"step": 8, "do": "hosts", "hosts": ONE_HOST},
        {"step": 30, "do": "hosts", "hosts": TWO_HOSTS, "when_workers": 1}])
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [2, 2]
    old, new = finals
    for final in finals:
        _assert_finished(final)
    # The two ranks end identical: weights and optimizer state (slots).
    assert old["weights"] == new["weights"]
    assert old["optimizer"] == new["optimizer"]
    assert _ids(old) == list(range(TOTAL))
    # The new worker joined at a commit and ran every step from there on.
    joined = _ids(new)
    assert joined == list(range(joined[0], TOTAL)) and joined[0] > 8
    assert new["syncs"][0]["batch"] + new["syncs"][0]["epoch"] * STEPS == joined[0]
    # "scale", linear, rates given for 2 workers: half the rate on one.
    for s in old["steps"]:
        assert s["batch_size"] == 16
        assert s["lr"] == pytest.approx(LR * s["workers"] / 2, rel=1e-6)
    assert {s["workers"] for s in old["steps"]} == {1, 2}
    down, up = events
    _resize(down, 2, 1)
    _resize(up, 1, 2)
    assert (down["before"]["global_batch"], down["after"]["global_batch"]) == (32, 16)
    assert (up["before"]["global_batch"], up["after"]["global_batch"]) == (16, 32)
    assert (down["before"]["lr"], down["after"]["lr"]) == pytest.approx((LR, LR / 2))
    assert (up["before"]["lr"], up["after"]["lr"]) == pytest.approx((LR / 2, LR))
    assert (down["after"]["lr_factor"], up["after"]["lr_factor"]) == (0.5, 1.0)
    assert down["step"] == _first_step_with(old, 1)["iterations"]
    assert up["step"] == _first_step_with(old, 2, after=down["step"])["iterations"]
    assert old["lr"] == new["lr"] == pytest.approx(LR)
    assert old["stats"] == new["stats"] and old["stats"]["batch_size"] == 32.0
    print(f"pauses: down {down['after']['pause_s']:.3f} s, up {up['after']['pause_s']:.3f} s")


def test_killed_worker_the_other_continues_from_the_last_commit(tmp_path, reference):
    kill_after = 13  # mid-epoch, between commits (after steps 3, 7, 11, 15, ...)
    done, finals, events = _job(tmp_path, "keep", [{"step": kill_after, "do": "kill", "rank": 1}])
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [1]
    final = finals[0]
    _assert_finished(final)
    ids = _ids(final)
    # Rank 0 ran past the kill until its collective failed, then went back
    # to the last commit: only uncommitted steps ran twice, at most COMMIT.
    restart = next(i for i in range(1, len(ids)) if ids[i] <= ids[i - 1])
    assert ids[:restart] == list(range(restart))
    assert ids[restart:] == list(range(ids[restart], TOTAL))
    redone = restart - ids[restart]
    assert 1 <= redone <= COMMIT and ids[restart] % COMMIT == 0
    assert kill_after < restart <= kill_after + 2
    _assert_weights(final, reference)  # the redone steps replaced the lost ones exactly
    (event,) = events
    _resize(event, 2, 1)
    assert (event["before"]["batch_size"], event["after"]["batch_size"]) == (16, 32)
    print(f"failure pause {event['after']['pause_s']:.3f} s, {redone} steps redone")
