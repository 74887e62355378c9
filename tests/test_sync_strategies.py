"""Synchronisation strategies (keras_adapt.sync): argument checks in one
process, and the strategies' math, switches, statistics and the
collective-delay hook with two real workers (horovodrun -np 2)."""

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt import _hvd
from keras_adapt.sync import (AllReduceSGD, BlockMomentum, ElasticAveraging, LocalSGD,
                              ModelAveraging, SyncState)

from conftest import controllers, horovodrun, load_rank_results


# -- one process: arguments -------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: LocalSGD(period=0), "LocalSGD(period=0)"),
    (lambda: LocalSGD(period=4, start_after=-1), "start_after=-1"),
    (lambda: ModelAveraging(alpha=0.0), "alpha=0.0"),
    (lambda: ModelAveraging(alpha=1.5), "alpha=1.5"),
    (lambda: BlockMomentum(period=4, block_momentum=1.0), "block_momentum=1.0"),
    (lambda: BlockMomentum(period=4, nesterov="yes"), "nesterov='yes'"),
    (lambda: ElasticAveraging(period=2, rho=0), "rho=0"),
])
def test_bad_strategy_arguments_name_the_value(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_bad_sync_strategy_argument_is_refused_before_any_work():
    with pytest.raises(ValueError, match="'gossip' is not a known strategy"):
        keras_adapt.DistributedOptimizer("sgd", sync_strategy="gossip")
    with pytest.raises(TypeError, match="keras_adapt.sync strategy"):
        keras_adapt.DistributedOptimizer("sgd", sync_strategy=[object()])
    with pytest.raises(ValueError, match="lists LocalSGD twice"):
        keras_adapt.DistributedOptimizer("sgd", sync_strategy=[LocalSGD(2), LocalSGD(4)])


def test_set_switches_by_object_or_name_and_refuses_undeclared_strategies():
    opt = keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.1), sync_strategy=[LocalSGD(period=4), AllReduceSGD()])
    sync = opt.adapt_state.sync
    assert sync.strategy == LocalSGD(period=4) and sync.has_local
    assert int(sync.index.numpy()) == LocalSGD.index
    sync.set("local_sgd", period=16)  # same strategy: parameters only
    assert sync.strategy == LocalSGD(period=16)
    assert int(sync.variables["period"].numpy()) == 16
    sync.set(AllReduceSGD())
    assert int(sync.index.numpy()) == AllReduceSGD.index and int(sync.count.numpy()) == 0
    with pytest.raises(ValueError, match="BlockMomentum was not declared.*sync_strategy="):
        sync.set(BlockMomentum(period=2))
    with pytest.raises(ValueError, match="LocalSGD has no parameter alpha"):
        sync.set("local_sgd", alpha=0.5)
    with pytest.raises(TypeError, match="set\\(\\) takes"):
        sync.set(3)


def test_default_optimizer_declares_only_allreduce_sgd():
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert opt.adapt_state.sync.strategy == AllReduceSGD()
    assert not opt.adapt_state.sync.has_local  # the plain step: no dispatch is built
    copy = type(opt).from_config(opt.get_config())
    assert copy.adapt_state.sync.strategy == AllReduceSGD()
    opt2 = keras_adapt.DistributedOptimizer("sgd", sync_strategy=ModelAveraging(0.2))
    copy2 = type(opt2).from_config(opt2.get_config())
    assert copy2.adapt_state.sync.strategy == ModelAveraging(0.2)


def test_sync_state_parameters_live_in_variables():
    sync = SyncState([ElasticAveraging(period=3, rho=0.5), BlockMomentum(period=2)])
    assert float(sync.variables["rho"].numpy()) == 0.5
    sync.set("block_momentum", block_momentum=0.25, nesterov=False)
    values = {k: v.numpy().item() for k, v in sync.variables.items()}
    assert values["period"] == 2 and values["block_momentum"] == 0.25
    assert values["nesterov"] is False and values["block_lr"] == 1.0


def test_collective_delay_variable_is_validated(monkeypatch):
    monkeypatch.setenv(_hvd.DELAY_ENV, "fast")
    with pytest.raises(ValueError, match="KERAS_ADAPT_COLLECTIVE_DELAY_MS='fast'"):
        _hvd.collective_delay_ms()
    monkeypatch.setenv(_hvd.DELAY_ENV, "-5")
    with pytest.raises(ValueError, match="use a number of milliseconds >= 0"):
        _hvd.collective_delay_ms()
    monkeypatch.setenv(_hvd.DELAY_ENV, "12.5")
    assert _hvd.collective_delay_ms() == 12.5


def _one_worker_fit(sync_strategy, accumulation):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9), stats_interval=3, batch_size=8,
        backward_passes_per_step=accumulation, average_aggregated_gradients=True,
        sync_strategy=sync_strategy)
    model.compile(opt, "mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 3)).astype(np.float32)
    y = (x @ [[1.0], [-2.0], [0.5]] + 0.1 * rng.standard_normal((96, 1))).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), opt.gradient_statistics.result()


@pytest.mark.parametrize("accumulation", [1, 2])
def test_one_worker_local_strategies_equal_plain_training(accumulation):
    """With one worker, averaging a single model changes nothing: LocalSGD and
    ModelAveraging must give AllReduceSGD's weights and statistics exactly,
    with and without accumulation (the local path applies the same gradient
    and measures the same statistics)."""
    plain_w, plain_stats = _one_worker_fit(None, accumulation)
    assert plain_stats["updates"] > 0
    for strategy in (LocalSGD(period=3), ModelAveraging(alpha=0.5)):
        w, stats = _one_worker_fit([strategy, AllReduceSGD()], accumulation)
        for a, b in zip(w, plain_w):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        for key in ("updates", "grad_sqr", "grad_var", "gns"):
            assert stats[key] == pytest.approx(plain_stats[key], rel=1e-5), (strategy, key)


# -- two workers --------------------------------------------------------------------
@pytest.fixture(scope="module", params=controllers())
def results(request, tmp_path_factory):
    out = str(tmp_path_factory.mktemp(f"sync_{request.param}"))
    horovodrun("sync_checks.py", ["--out", out], np=2, controller=request.param, timeout=600)
    return load_rank_results(out, 2)


def _arrays(snapshot):
    weights, slots = snapshot
    return [np.asarray(a, np.float64) for a in weights + slots]


def _assert_matches(got, ref, what):
    # relative to each array's magnitude (weights, then slots)
    for i, (g, r) in enumerate(zip(_arrays(got), _arrays(ref))):
        scale = max(np.max(np.abs(r)), 1e-12)
        assert np.max(np.abs(g - r)) / scale < 1e-5, f"{what}: array {i}"
    assert len(_arrays(got)) == len(_arrays(ref)), what


STRATEGY_CASES = ["model_averaging_sgd", "local_sgd_sgd", "post_local_sgd_adam",
                  "block_momentum_sgd", "block_momentum_adam", "elastic_averaging_sgd"]


@pytest.mark.parametrize("case", STRATEGY_CASES)
def test_each_strategy_matches_numpy_reference_including_slots(results, case):
    for r in results:
        c = r["strategies"][case]
        _assert_matches(c["got_mid"], c["ref_mid"], f"{case} rank {r['rank']} after 7 updates")
        _assert_matches(c["got"], c["ref"], f"{case} rank {r['rank']} after 12 updates")
        # slots are present: momentum (SGD) or m and v (Adam) for kernel and bias
        assert len(c["got"][1]) == (4 if "adam" in case else 2)
    # local strategies leave different models on the ranks between syncs
    if case == "local_sgd_sgd":
        mid = [np.asarray(r["strategies"][case]["got_mid"][0][0]) for r in results]
        assert not np.array_equal(mid[0], mid[1])  # update 7 is not a sync (H=3)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_switches_match_reference_and_leave_identical_ranks(results, kind):
    a, b = (r[f"switches_{kind}"] for r in results)
    for r, s in zip(results, (a, b)):
        for step in s["got"]:
            _assert_matches(s["got"][step], s["ref"][step], f"{kind} rank {r['rank']} update {step}")
        assert s["final_strategy"] == "allreduce_sgd"
    # before the switch at update 7 LocalSGD(period=5) left different models
    assert a["got"]["6"][0] != b["got"]["6"][0]
    # every update after a switch into AllReduceSGD: identical weights AND slots
    for step in ("7", "8", "9", "21", "22", "23"):
        assert a["got"][step] == b["got"][step], step


def test_switching_never_retraces(results):
    for r in results:
        baseline = r["baseline_traces"]
        assert baseline >= 1
        assert r["switches_sgd"]["traces"] == baseline  # five switches, no new trace
        assert r["switches_adam"]["traces"] == baseline
        for case in STRATEGY_CASES:
            assert r["strategies"][case]["traces"] == baseline


def test_statistics_under_local_sgd_equal_allreduce_sgd_and_truth(results):
    for r in results:
        measured, truth = r["stats"]["measured"], r["stats"]["truth"]
        local, allreduce = measured["local_sgd"], measured["allreduce_sgd"]
        # stats_interval=4 and LocalSGD(period=4): the due updates 0, 4, 8, ...
        # are the first after each averaging, so nothing waits
        assert local["updates"] == allreduce["updates"] == 600 // 4
        assert local["batch_size"] == 64.0  # 2 workers x 32
        for key in ("grad_sqr", "grad_var", "gns"):
            # lr=0: same models, same data -> the same numbers as under AllReduceSGD
            assert local[key] == pytest.approx(allreduce[key], rel=1e-9), key
            assert local[key] == pytest.approx(truth[key], rel=0.10), key
    assert results[0]["stats"] == results[1]["stats"]


def test_local_statistics_are_measured_where_the_models_agree(results):
    for r in results:
        m = r["measured_updates"]
        # LocalSGD(4): averagings after updates 3, 7, 11; the measurements due
        # at 2, 6, 10 and 14 wait for the next update after one (4, 8, 12);
        # update 0 starts from the averaged model.
        assert m["local_sgd"] == [0, 4, 8, 12]
        # start_after=3: AllReduceSGD updates 0-2 (0 and 2 measured), local
        # from 3, averagings after 6, 10, 14: the due 4, 8, 12 wait.
        assert m["post_local_sgd"] == [0, 2, 7, 11, 15]
        # SMA never makes the models agree: due updates measure (approximate).
        assert m["model_averaging"] == [0, 2, 4, 6, 8, 10, 12, 14]
    assert results[0]["measured_updates"] == results[1]["measured_updates"]


def test_collective_delay_hook_delays_every_collective(results):
    for r in results:
        d = r["delay"]
        # AllReduceSGD: one grouped allreduce per update (16 updates)
        assert d["allreduce_sgd"]["collectives"] == 16
        # LocalSGD(period=4), stats_interval=4, 16 updates: the first update's
        # averaging, 4 model averagings and 4 statistics allreduces
        assert d["local_sgd"]["collectives"] == 1 + 4 + 4
        for v in d.values():
            assert v["seconds"] >= v["collectives"] * 0.040  # each waited 40 ms
