"""Resize policies across real processes: horovodrun -np 2 (Gloo, and MPI if built).

Every rank decides from the same allgathered or allreduced inputs, so the
ranks record the same requests at the same updates; only rank 0 writes the
target file and the event log.
"""

import os

import numpy as np
import pytest

from conftest import controllers, horovodrun, load_rank_results
from keras_adapt import discover
from keras_adapt.record import events


@pytest.fixture(scope="module", params=controllers())
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"resize_{request.param}")
    horovodrun("resize_checks.py", ["--out", out], np=2, controller=request.param, timeout=300)
    return str(out), load_rank_results(out, 2)


@pytest.mark.parametrize("phase", ["throughput", "gns"])
def test_same_requests_at_same_updates_on_both_ranks(run, phase):
    out, (r0, r1) = run
    assert r0["size"] == r1["size"] == 2
    assert r0[phase]["events"] == r1[phase]["events"]
    assert r0[phase]["events"], f"{phase}: no request was made"
    for a, b in zip(r0[phase]["weights"], r1[phase]["weights"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Rank 0 alone wrote the target file and the events.
    last = r0[phase]["events"][-1]["after"]["target_workers"]
    assert discover.read_target(os.path.join(out, f"{phase}_target_rank0")) == last
    assert not os.path.exists(os.path.join(out, f"{phase}_target_rank1"))
    on_disk = events.read_events(os.path.join(out, f"{phase}_logs"))
    assert [e["rank"] for e in on_disk] == [0] * len(r0[phase]["events"])
    assert [{k: v for k, v in e.items() if k not in ("wall_time", "rank")} for e in on_disk] == \
        r0[phase]["events"]


def test_throughput_policy_asks_for_a_third_worker_once_measured(run):
    """Two workers, warm-up 1, patience 2: the 2nd and 3rd measurements
    (updates 10 and 15) propose 3 workers, unmeasured; one request at 15."""
    _, (r0, r1) = run
    (event,) = r0["throughput"]["events"]
    assert (event["kind"], event["step"]) == ("resize", 15)
    assert event["before"]["workers"] == 2 and event["after"]["target_workers"] == 3
    # The logs after batches 10-14 and 15-19 carry measurements 2 and 3.
    logged = r0["throughput"]["logged"]
    assert logged == r1["throughput"]["logged"]   # allgathered: the same on both ranks
    assert event["after"]["throughput"] == pytest.approx(np.median([logged[10], logged[15]]),
                                                         rel=1e-12)
    assert event["after"]["throughput_by_workers"] == {"2": event["after"]["throughput"]}


def test_gns_policy_requests_grow_with_the_noise_scale(run):
    _, (r0, _) = run
    requests = r0["gns"]["events"]
    targets = [e["after"]["target_workers"] for e in requests]
    assert targets == sorted(targets) and targets[0] >= 3
    for e in requests:
        # 2 workers x 8 samples x 2 micro-steps: 16 per worker and update.
        assert e["after"]["per_worker_batch"] == 16.0
        raw = e["after"]["gns"] / 16.0
        assert raw >= 2 * 1.25
        assert e["after"]["target_workers"] == min(int(np.ceil(raw)), 6)
