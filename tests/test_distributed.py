"""Real multi-process checks: horovodrun -np 2 on localhost (Gloo on both stacks, MPI
if built on the legacy stack), and on two emulated hosts started over ssh (on the
primary stack: Gloo, and MPI if built). So each stack runs the checks under MPI once."""

import numpy as np
import pytest

from conftest import controllers, horovodrun, load_rank_results


EMULATED = "-emulated-hosts"


# Starting workers over ssh on emulated hosts does not depend on the stack:
# the legacy suite runs the localhost jobs only. The primary stack's MPI job
# is the emulated hosts' (mpirun starting the workers over ssh); a second
# one on localhost would run the same code of ours under the same controller.
@pytest.fixture(scope="module",
                params=controllers(mpi="legacy")
                + [pytest.param(c + EMULATED, marks=pytest.mark.primary_only)
                   for c in controllers(mpi="primary")])
def results(request, tmp_path_factory):
    """Two workers on localhost with each controller, and one worker on each
    of two emulated hosts (network namespaces, started over ssh)."""
    out = tmp_path_factory.mktemp(f"dist_{request.param}")
    controller, emulated, _ = request.param.partition(EMULATED)
    hosts = request.getfixturevalue("emulated_hosts") if emulated else None
    horovodrun("distributed_checks.py", ["--out", out], np=2, controller=controller, hosts=hosts)
    return load_rank_results(out, 2)


def test_two_workers_ran(results, request):
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    if request.node.callspec.params["results"].endswith(EMULATED):
        # each worker ran on its own emulated host (its sshd's hostname)
        assert sorted(r["host"] for r in results) == ["h2", "h3"]
    else:
        assert results[0]["host"] == results[1]["host"]


def test_noise_scale_matches_analytic_value_with_two_workers(results):
    for r in results:
        truth, measured = r["gns"]["truth"], r["gns"]["measured"]
        assert r["gns"]["weights_unchanged"], "lr=0 must keep the weights fixed"
        assert measured["updates"] == r["gns"]["expected_updates"]  # default stats_interval
        assert measured["batch_size"] == 64.0  # 2 workers x 32
        for key in ("grad_sqr", "grad_var", "gns"):
            assert measured[key] == pytest.approx(truth[key], rel=0.10), key
    # identical on both ranks: the statistics derive from allreduced values
    assert results[0]["gns"]["measured"] == results[1]["gns"]["measured"]


def test_weights_identical_across_ranks_after_training(results):
    a, b = results[0]["train"], results[1]["train"]
    assert a["weights_on"] == b["weights_on"]  # exact, not approximate
    assert a["weights_off"] == b["weights_off"]
    assert a["optimizer_vars"] == b["optimizer_vars"]
    assert np.isfinite(np.concatenate([np.ravel(w) for w in a["weights_on"]])).all()


def test_monitoring_does_not_change_the_training_trajectory(results):
    for r in results:
        t = r["train"]
        assert len(t["losses_on"]) == 3 * 512 // 16  # 3 epochs of 32 batches
        np.testing.assert_allclose(t["losses_on"], t["losses_off"], rtol=1e-6, atol=0)
        for w_on, w_off in zip(t["weights_on"], t["weights_off"]):
            np.testing.assert_allclose(w_on, w_off, rtol=1e-6, atol=1e-7)
        # the loss went down: it did train
        assert t["history"]["loss"][-1] < 0.8 * t["history"]["loss"][0]


def test_history_has_statistics_and_averaged_metrics(results):
    h0, h1 = results[0]["train"]["history"], results[1]["train"]["history"]
    for key in ("gns", "grad_sqr", "grad_var", "grad_snr"):
        assert len(h0[key]) == 3 and all(np.isfinite(h0[key]))
        assert h0[key] == h1[key]
    # MetricAverageCallback: every rank reports the same (averaged) loss
    assert h0["loss"] == h1["loss"]
    # epoch-end values are the statistics at the end of the epoch
    s = results[0]["train"]["stats"]
    assert h0["gns"][-1] == pytest.approx(s["gns"], rel=1e-12)
    assert h0["grad_snr"][-1] == pytest.approx(s["batch_size"] / s["gns"], rel=1e-12)


def test_nan_gradient_on_one_rank_is_skipped_on_all_ranks(results):
    for r in results:
        snaps = r["nan"]["snapshots"]
        before, bad, after = snaps[2], snaps[3], snaps[4]
        assert bad["nonfinite"] == before["nonfinite"] + 1 == 1
        assert bad["skipped"] == 1
        assert bad["iterations"] == before["iterations"]  # no optimizer update
        assert bad["ema_grad_sqr"] == before["ema_grad_sqr"]  # EMAs unchanged
        assert bad["ema_grad_var"] == before["ema_grad_var"]
        assert bad["updates"] == before["updates"]
        assert after["updates"] == bad["updates"] + 1  # training continues
        assert snaps[-1]["iterations"] == 9  # 10 batches, one skipped
        assert r["nan"]["finite"]
    assert results[0]["nan"]["weights"] == results[1]["nan"]["weights"]
    assert results[0]["nan"]["snapshots"] == results[1]["nan"]["snapshots"]


def _ema(values, decay):
    ema = 0.0
    for v in values:
        ema = decay * ema + (1 - decay) * v
    return ema / (1 - decay ** len(values))


def test_remainder_batches_of_unequal_size_on_two_workers(results):
    # shuffle=True, 20 batches of 32 per rank, then 5 samples on rank 0 and 9
    # on rank 1: the last update averages gradients of unequal size.
    for r in results:
        rem = r["remainder"]
        measured, truth = rem["measured"], rem["truth"]
        steps = rem["steps_per_epoch"] * rem["epochs"]
        assert measured["updates"] == steps
        for key in ("grad_sqr", "grad_var", "gns"):
            assert measured[key] == pytest.approx(truth[key], rel=0.10), key
        # grad_snr compares with the batch the statistics describe: the moving
        # average of the updates' global batches (64, ..., 64, 14), not 14.
        assert measured["batch_size"] == rem["last_batch"]
        batches = ([64] * (rem["steps_per_epoch"] - 1) + [rem["last_batch"]]) * rem["epochs"]
        assert measured["snr_batch_size"] == pytest.approx(_ema(batches, 0.998), rel=1e-6)
        assert rem["history_grad_snr"][-1] == pytest.approx(
            measured["snr_batch_size"] / measured["gns"], rel=1e-9)
    assert results[0]["remainder"]["measured"] == results[1]["remainder"]["measured"]


def test_stats_interval_measures_one_update_in_n(results):
    for r in results:
        iv = r["interval"]
        first, truth = iv["measured"], iv["truth"]
        assert first["updates"] == 600 // 4  # updates 0, 4, 8, ... of 600
        for key in ("grad_sqr", "grad_var", "gns"):
            assert first[key] == pytest.approx(truth[key], rel=0.10), key
        # set_interval(1) takes effect in the same train function: 40 more
        # updates, every one measured
        assert iv["same_train_function"]
        assert iv["after_set_interval_1"]["updates"] == first["updates"] + 40
    assert results[0]["interval"] == results[1]["interval"]
