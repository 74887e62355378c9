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
from keras_adapt.record import events

PHASES = ("rebatch", "accumulate", "goodput", "goodput_fine", "epochs")


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


def test_finer_goodput_candidates_are_batches_two_workers_make(run):
    # 16 x 2^(i/2) below 255, rounded: 16, 23, 32, 45, 64, 91, 128, 181;
    # two workers make half of each, rounded half up: 23 -> 11.5 -> 12, so
    # 24; 45 -> 23, so 46; 91 -> 46, so 92; 181 -> 91, so 182; and
    # max_batch 255 -> 127.5 -> 128 would make 256, above the bound: 254
    _, (r0, r1) = run
    r = r0["goodput_fine"]
    assert r["candidates"] == r1["goodput_fine"]["candidates"] == [
        16, 24, 32, 46, 64, 92, 128, 182, 254]
    moves = [e["after"]["batch_size"] for e in r["events"] if e["kind"] == "batch_size"]
    assert moves and all(m in r["candidates"] for m in moves), moves
    # the grid between the doublings is used (measured: 24, 64, 92, the
    # first at a noise scale of about 57, where e(24) >= 2/3 > e(32))
    assert any(m not in (16, 32, 64, 128, 256) for m in moves), moves
    assert {2 * b for b in r["step_sizes"]} <= set(r["candidates"])
    assert r["batch_size"][-1] == moves[-1]


@pytest.mark.parametrize("phase", PHASES)
def test_every_batch_made_lies_within_the_policy_bounds(run, phase):
    # accumulate: max_batch 120 on 2 workers x 8 (multiples of 16);
    # goodput_fine: max_batch 255 with micro-batches on 2 workers (even)
    _, (r0, _) = run
    r = r0[phase]
    (low, high), = r["bounds"]
    made = [e["after"]["batch_size"] for e in r["events"] if e["kind"] == "batch_size"]
    assert made and all(low <= b <= high for b in made + r["batch_size"]), (low, high, made)
    assert all(low <= 2 * b * k <= high for b, k in r["step_configurations"]), (low, high)


def test_a_bound_that_is_no_multiple_of_the_workers_batch_is_approached_from_within(run):
    _, (r0, _) = run
    r = r0["accumulate"]
    # 120 / 16 = 7.5 would round up to 128
    assert max(r["batch_size"]) == 112, r["batch_size"]   # 7 x 16 <= 120 < 8 x 16


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


def test_both_ranks_end_every_progress_epoch_at_the_same_step_where_it_crosses_a_pass(run):
    _, (r0, r1) = run
    e0, e1 = r0["epochs"], r1["epochs"]
    assert e0["steps"] == e1["steps"] and len(e0["steps"]) == 3
    assert e0["before"] == e1["before"] and e0["at_end"] == e1["at_end"]
    per_pass = e0["samples_per_pass"]
    assert per_pass == 2002
    last = 0
    for epoch, steps in enumerate(e0["steps"]):
        last += steps
        # The epoch's last step starts below its boundary and ends on or past it.
        assert e0["before"][last - 1] < (epoch + 1) * per_pass <= e0["at_end"][epoch]
    # The host's progress is AdaScale's in-graph progress x B0 (the same gains).
    assert e0["tau_x_base"] == pytest.approx(e0["at_end"][-1], rel=1e-9)
    # The batch grew, so the run trained on more samples than three passes.
    assert e0["samples"] > 3 * per_pass


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


def _agree(at0, at1, step):
    return all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(at0[step]["weights"], at1[step]["weights"]))


def test_sync_strategy_policy_switches_where_its_inputs_say_on_both_ranks(run):
    out, (r0, r1) = run
    s0, s1 = r0["sync"], r1["sync"]
    assert s0["events"] == s1["events"]
    # patience=2: the second proposal in a row changes (proposals every 10 updates)
    got = [(e["step"], e["before"]["sync_strategy"], e["before"].get("period"),
            e["after"]["sync_strategy"], e["after"].get("period")) for e in s0["events"]]
    assert got == [(30, "allreduce_sgd", None, "local_sgd", 2),
                   (50, "local_sgd", 2, "local_sgd", 4),
                   (70, "local_sgd", 4, "allreduce_sgd", None),
                   (100, "allreduce_sgd", None, "local_sgd", 4)]
    assert [e["reason"] for e in s0["events"][:3]] == [
        "scripted: H = 2: period 2", "scripted: H = 4: period 4", "scripted: allreduce: period 1"]
    # The schedule decays after update 80; the decision reads it at 90 and 100.
    assert s0["events"][3]["reason"] == (
        "post-local SGD: the learning rate decayed to 0.02 from its peak 0.05: period 4")
    at0, at1 = s0["at"], s1["at"]
    assert [at0[s]["strategy"] for s in ("29", "30", "69", "70", "99", "100")] == [
        "allreduce_sgd", "local_sgd", "local_sgd", "allreduce_sgd", "allreduce_sgd", "local_sgd"]
    # H = 2 from update 30 (counted from 0 there): averaged after the 2nd,
    # 4th, ... local update, so the models agree at 32 and 50, not at 31, 33, 49.
    # H = 4 from 50, the count going on (20 at 50): the next averaging is
    # after count 23, at 54 -- not at 52, where H = 2 would have averaged.
    # The switch into AllReduceSGD at 70 averages: identical from then on.
    agree = {step: _agree(at0, at1, step) for step in at0}
    assert agree == {"29": True, "30": True, "31": False, "32": True, "33": False,
                     "49": False, "50": True, "52": False, "53": False, "54": True,
                     "69": False, "70": True, "71": True, "99": True, "100": True}
    # Four changes, no new trace: the count after the first step never moves.
    assert at0["31"]["traces"] == at0["100"]["traces"] == s0["traces"]
    # Rank 0 wrote the events; the file holds exactly them, periods included.
    on_disk = list(events.read_events(os.path.join(out, "sync_logs")))
    assert [(e["step"], e["kind"], e["after"]) for e in on_disk] == [
        (e["step"], e["kind"], e["after"]) for e in s0["events"]]
