"""Adaptive batch with a user's own tf.data pipeline across real processes:
horovodrun -np 2 (Gloo, and MPI if built), TFRecord files per worker read with
map, seeded shuffle and prefetch.

Both ranks must use the same micro-batch at every step, switch at the same
step (the one right after the policy decided) and end with identical weights.
"""

import numpy as np
import pytest

from conftest import controllers, horovodrun, load_rank_results


@pytest.fixture(scope="module", params=controllers())
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"pipeline_{request.param}")
    horovodrun("pipeline_checks.py", ["--out", out], np=2, controller=request.param)
    return load_rank_results(out, 2)


@pytest.mark.parametrize("phase", ["rebatch", "accumulate"])
def test_both_ranks_step_alike_and_end_with_identical_weights(run, phase):
    r0, r1 = run
    assert r0[phase]["events"] == r1[phase]["events"]
    assert any(e["kind"] == "batch_size" for e in r0[phase]["events"])
    assert r0[phase]["step_sizes"] == r1[phase]["step_sizes"]
    assert r0[phase]["step_updates"] == r1[phase]["step_updates"]
    assert r0[phase]["updates"] == r1[phase]["updates"]
    for a, b in zip(r0[phase]["weights"], r1[phase]["weights"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_micro_batch_switches_at_the_step_after_each_decision(run):
    r0, r1 = run
    phase = r0["rebatch"]
    assert phase["changes"] == r1["rebatch"]["changes"]
    sizes, updates = phase["step_sizes"], phase["step_updates"]
    rebatched = [e for e in phase["events"] if e["kind"] == "batch_size"
                 and e["after"]["micro_batch_size"] != e["before"]["micro_batch_size"]]
    assert rebatched, "the policy never changed the micro-batch"
    assert len(rebatched) == len(phase["changes"])
    for event, (start, size) in zip(rebatched, phase["changes"]):
        # The decision ran before the first micro-step that began at its update.
        t = updates.index(event["step"])
        assert sizes[t] == size == event["after"]["micro_batch_size"]
        assert sizes[t - 1] == event["before"]["micro_batch_size"]
        assert phase["step_formed"][t] == start  # that step consumed batch number `start`
        assert event["after"]["batch_size"] == 2 * size * event["after"]["accumulation"]


def test_every_step_used_the_size_its_batch_number_was_given(run):
    # An independent reading of the schedule: batch s has the size of the
    # last change at or before s; step t consumed batch step_formed[t].
    phase = run[0]["rebatch"]

    def size_of(batch):
        size = phase["initial"]
        for start, value in phase["changes"]:
            if start <= batch:
                size = value
        return size

    assert phase["step_sizes"] == [size_of(b) for b in phase["step_formed"]]
    assert len(set(phase["step_sizes"])) >= 2


def test_plain_batched_pipeline_changes_only_k(run):
    phase = run[0]["accumulate"]
    assert set(phase["step_sizes"]) == {8}
    assert phase["k"] == 4  # global 16 -> 32 -> 64 with b = 8 on 2 workers
    assert phase["updates"] == 40 + 40 // 2 + 40 // 4
    assert [e["after"]["accumulation"] for e in phase["events"] if e["kind"] == "batch_size"] == [2, 4]


def test_batches_formed_ahead_on_one_rank_fail_loudly_on_both(run):
    r0, r1 = run
    assert r0["guard"]["formed"] == 1 and r1["guard"]["formed"] >= 2
    for r in (r0, r1):
        assert r["guard"]["error"] is not None
        assert "different batches" in r["guard"]["error"]
        assert f"[1, {r1['guard']['formed']}]" in r["guard"]["error"]
        assert "prefetch" in r["guard"]["error"]
        # The refused change left the schedule as it was.
        assert r["guard"]["changes"] == [] and r["guard"]["micro_batch_size"] == 4
