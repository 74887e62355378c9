"""Policies across real processes: horovodrun -np 2 (Gloo, and MPI if built).

Every rank must make the same decision at the same step, so the ranks stay
in lockstep (same micro-batch and k at every step) and end with identical
weights; rank 0 writes the events to disk.
"""

import json
import os

import numpy as np
import pytest

from conftest import controllers, horovodrun, load_rank_results
from keras_adapt import events

PHASES = ("rebatch", "accumulate", "goodput")


@pytest.fixture(scope="module", params=controllers())
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"policies_{request.param}")
    horovodrun("policy_checks.py", ["--out", out], np=2, controller=request.param)
    return out, load_rank_results(out, 2)


@pytest.mark.parametrize("phase", PHASES)
def test_identical_decisions_at_identical_steps_on_both_ranks(run, phase):
    _, (r0, r1) = run
    assert r0[phase]["events"] == r1[phase]["events"]
    kinds = {e["kind"] for e in r0[phase]["events"]}
    assert "batch_size" in kinds, f"{phase}: the policy never changed the batch"


@pytest.mark.parametrize("phase", PHASES)
def test_ranks_stay_in_lockstep_and_end_with_identical_weights(run, phase):
    _, (r0, r1) = run
    assert r0[phase]["step_sizes"] == r1[phase]["step_sizes"]
    assert r0[phase]["updates"] == r1[phase]["updates"]
    for a, b in zip(r0[phase]["weights"], r1[phase]["weights"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rebatching_changes_the_micro_batch_at_the_decided_step(run):
    _, (r0, _) = run
    phase = r0["rebatch"]
    first = next(e for e in phase["events"] if e["kind"] == "batch_size")
    assert first["after"]["micro_batch_size"] > first["before"]["micro_batch_size"]
    # The dataset switched at a batch index, and every step from then on
    # used the new micro-batch (until the next change).
    (at, size), *_ = phase["changes"]
    assert size == first["after"]["micro_batch_size"]
    assert phase["step_sizes"][at - 1] == first["after"]["micro_batch_size"] or \
        phase["step_sizes"][at] == first["after"]["micro_batch_size"]
    # global batch = workers x micro-batch x k
    after = first["after"]
    assert after["batch_size"] == 2 * after["micro_batch_size"] * after["accumulation"]


def test_accumulation_and_lr_policy_follow_each_other(run):
    _, (r0, _) = run
    phase = r0["accumulate"]
    batch_events = [e for e in phase["events"] if e["kind"] == "batch_size"]
    lr_events = [e for e in phase["events"] if e["kind"] == "lr"]
    assert phase["k"] > 1
    for b in batch_events:
        follow = [e for e in lr_events if e["step"] == b["step"]]
        assert follow, f"no lr event at step {b['step']}"
        assert follow[-1]["after"]["lr_factor"] == pytest.approx(b["after"]["batch_size"] / 16)


def test_rank0_wrote_the_events_file_with_the_schema(run):
    out, (r0, _) = run
    path = os.path.join(out, "rebatch_logs", events.EVENTS_FILENAME)
    with open(path) as f:
        on_disk = [json.loads(line) for line in f]
    assert len(on_disk) == len(r0["rebatch"]["events"])  # rank 1 wrote nothing
    for record, expected in zip(on_disk, r0["rebatch"]["events"]):
        assert list(record) == list(events.EVENT_FIELDS)
        assert record["rank"] == 0
        assert {k: v for k, v in record.items() if k not in ("wall_time", "rank")} == expected


def test_sync_strategy_policy_switches_where_its_inputs_say_on_both_ranks(run):
    out, (r0, r1) = run
    s0, s1 = r0["sync"], r1["sync"]
    assert s0["events"] == s1["events"]
    # patience=2: the second proposal in a row switches (proposals every 10 updates)
    got = [(e["step"], e["before"]["sync_strategy"], e["after"]["sync_strategy"])
           for e in s0["events"]]
    assert got == [(30, "allreduce_sgd", "local_sgd"), (60, "local_sgd", "allreduce_sgd"),
                   (100, "allreduce_sgd", "local_sgd")]
    # The schedule decays after update 80; the decision reads it at 90 and 100.
    assert s0["events"][2]["reason"] == (
        "post-local SGD: the learning rate decayed to 0.02 from its peak 0.05")
    assert s0["events"][2]["after"] == {"sync_strategy": "local_sgd", "period": 4,
                                        "start_after": 0}
    at0, at1 = s0["at"], s1["at"]
    assert [at0[s]["strategy"] for s in ("29", "30", "59", "60", "99", "100")] == [
        "allreduce_sgd", "local_sgd", "local_sgd", "allreduce_sgd", "allreduce_sgd", "local_sgd"]
    # Under AllReduceSGD the ranks agree. Under LocalSGD(4) from update 30
    # the models are averaged after updates 33, 37, ..., 57, so at 59 they
    # differ; the switch back at 60 averages them: identical again.
    for step in ("29", "60", "61", "99"):
        for a, b in zip(at0[step]["weights"], at1[step]["weights"]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(at0["59"]["weights"], at1["59"]["weights"]))
    # Three switches, no new trace: the count after the first step never moves.
    assert at0["31"]["traces"] == at0["100"]["traces"] == s0["traces"]
    # Rank 0 wrote the events; the file holds exactly them.
    on_disk = [(e["step"], e["kind"]) for e in events.read_events(os.path.join(out, "sync_logs"))]
    assert on_disk == [(30, "sync_strategy"), (60, "sync_strategy"), (100, "sync_strategy")]
