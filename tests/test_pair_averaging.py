"""PairAveraging (asynchronous pair averaging) and its transport: the
exchange's math, versions, staleness bound and faults in one process (two
exchanges on loopback), and two real workers (horovodrun -np 2) that never
wait for each other and survive a peer that vanishes."""

import os

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.sync import AllReduceSGD, PairAveraging, PeerExchange

import tensorboard_loaders
from conftest import horovodrun, load_rank_results
from keras_adapt.record import reader


def _pair(max_staleness=16.0):
    a, b = PeerExchange(max_staleness), PeerExchange(max_staleness)
    ends = [a.endpoint(), b.endpoint()]
    a.connect(ends, rank=0)
    b.connect(ends, rank=1)
    return a, b


def _deliver(sender, receiver, updates, arrays):
    """``sender`` exchanges (sends) ``arrays``; ``receiver`` takes it."""
    out = sender.exchange(updates, arrays)
    assert receiver.receive(10.0) == 1
    return out


def test_exchange_averages_with_the_newest_peer_model_and_averages_versions():
    a, b = _pair()
    try:
        assert a.endpoint().startswith("tcp://127.0.0.1:")
        _deliver(a, b, 1, [np.array([1.0, 2.0], np.float32)])  # a: version 1
        _deliver(a, b, 3, [np.array([5.0, 6.0], np.float32)])  # a: version 3 (newest)
        got = b.exchange(2, [np.array([3.0, 0.0], np.float32)])  # b: version 2
        np.testing.assert_array_equal(got[0], [4.0, 3.0])  # with a's newest only
        assert got[0].dtype == np.float32
        assert b.record.received == 2 and b.record.averaged == 1
        assert b.record.staleness == [2.0 - 3.0] and b.record.peers == [(0, 3.0, 3.0)]
        assert b.record.peer_updates == {0: 3.0}  # a had made 3 updates
        assert b.version == 2.5  # (2 + 3) / 2
        # the model used once is not used again; nothing new: own model kept
        assert b.exchange(3, [np.array([0.0, 0.0], np.float32)]) is None
        assert b.record.empty == 1 and b.version == 3.5
    finally:
        a.close()
        b.close()


def test_a_model_older_than_max_staleness_is_refused():
    a, b = _pair(max_staleness=4.0)
    try:
        _deliver(a, b, 1, [np.zeros(3)])      # a's model: version 1
        assert b.exchange(6, [np.ones(3)]) is None  # b at version 6: 5 > 4 updates older
        assert b.record.refused == 1 and b.record.averaged == 0
        _deliver(a, b, 4, [np.zeros(3)])      # a: version 4, 3 behind b's 7 (accepted)
        np.testing.assert_array_equal(b.exchange(7, [np.ones(3)])[0], np.full(3, 0.5))
        assert b.record.staleness == [3.0]
    finally:
        a.close()
        b.close()


def test_models_of_an_earlier_entry_are_discarded():
    a, b = _pair()
    c = PeerExchange()
    try:
        # a re-form without a: b and a new worker c connect to each other
        ends = [b.endpoint(), c.endpoint()]
        b.connect(ends, rank=0)
        c.connect(ends, rank=1)
        a.exchange(1, [np.zeros(2)])  # a still reaches b's endpoint, marked with the old entry
        c.exchange(1, [np.full(2, 3.0)])
        taken = 0
        while taken < 2:
            got = b.receive(10.0)
            assert got > 0, "a model did not arrive"
            taken += got
        assert b.record.discarded == 1 and b.record.received == 1
        np.testing.assert_array_equal(b.exchange(1, [np.ones(2)])[0], [2.0, 2.0])  # c's only
    finally:
        for e in (a, b, c):
            e.close()


def test_a_model_of_another_shape_is_refused_with_the_fix():
    a, b = _pair()
    try:
        _deliver(a, b, 1, [np.ones(3)])
        with pytest.raises(ValueError, match="rank 0 sent a model of shapes.*same model"):
            b.exchange(1, [np.ones(2)])
    finally:
        a.close()
        b.close()


def test_a_vanished_peer_never_blocks_the_sender():
    a, b = _pair()
    b.close()  # gone
    try:
        for i in range(1, 50):
            assert a.exchange(i, [np.ones(1000)]) is None
        assert a.record.sent + a.record.dropped == 49
        assert a.version == 49.0
    finally:
        a.close()


def test_pair_averaging_arguments_and_declaration():
    with pytest.raises(ValueError, match="period=0"):
        PairAveraging(period=0)
    with pytest.raises(ValueError, match="max_staleness=0"):
        PairAveraging(max_staleness=0)
    opt = keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.1), sync_strategy=[AllReduceSGD(), PairAveraging(period=2)])
    sync = opt.adapt_state.sync
    assert isinstance(sync.exchange, PeerExchange)
    sync.set("pair_averaging", max_staleness=3.0)
    assert sync.strategy == PairAveraging(period=2, max_staleness=3.0)
    assert sync.exchange.max_staleness == 3.0
    assert float(sync.variables["max_staleness"].numpy()) == 3.0
    assert keras_adapt.DistributedOptimizer("sgd").adapt_state.sync.exchange is None


# -- two workers --------------------------------------------------------------------
@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair_averaging")
    horovodrun("pair_averaging_checks.py", ["--out", out, "--log_dir", out / "logs"], np=2,
               timeout=400)
    return load_rank_results(str(out), 2), out / "logs"


def test_no_worker_waits_for_another(results):
    """Rank 1 stopped before its update 4 until rank 0 had finished all 24:
    the job finished, so nothing after the entry waited for rank 1 (nor
    AdaptTensorBoard, which writes every 5 updates)."""
    results, _ = results
    assert results[1]["waited_for_rank0"] and results[0]["heard_rank1"]
    assert [r["wait"]["updates"] for r in results] == [24, 24]
    assert results[0]["wait"]["record"]["averaged"] >= 1


def test_each_exchange_is_the_mean_of_two_models_and_is_applied(results):
    results, _ = results
    # the model a rank sent at each of its update counts (versions may repeat)
    sent = {r["rank"]: {c["updates"]: c["own"] for c in r.get("vanish", r["wait"])["calls"]}
            for r in results}  # rank 0's both fits: rank 1 may average with its second
    checked = 0
    for r in results:
        wait = r["wait"]
        averaged = [c for c in wait["calls"] if c["mixed"] is not None]
        assert len(averaged) == len(wait["peers"]) == len(wait["staleness"])
        for call, (peer, peer_version, peer_updates), staleness in zip(
                averaged, wait["peers"], wait["staleness"]):
            assert peer == 1 - r["rank"]
            assert staleness == pytest.approx(call["sent_version"] - peer_version)
            assert call["version"] == pytest.approx((call["sent_version"] + peer_version) / 2)
            theirs = sent[peer][peer_updates]
            for own, other, mixed in zip(call["own"], theirs, call["mixed"]):
                np.testing.assert_allclose(mixed, (np.asarray(own) + np.asarray(other)) / 2,
                                           rtol=1e-6, atol=1e-7)
            checked += 1
        for call in wait["calls"]:  # the variables hold what the exchange returned
            expected = call["mixed"] if call["mixed"] is not None else call["own"]
            for w, e in zip(call["after"], expected):
                np.testing.assert_array_equal(np.asarray(w, np.float32),
                                              np.asarray(e, np.float32))
    assert checked >= 2


def test_training_goes_on_when_the_peer_vanishes(results):
    results, _ = results
    vanish = results[0]["vanish"]
    assert vanish["updates"] == 64 and vanish["saved_equal"]
    assert vanish["record"]["sent"] + vanish["record"]["dropped"] == 64
    assert "vanish" not in results[1]  # rank 1 left during the second fit


def test_the_staleness_series_is_rank_0s_averagings_between_writes(results):
    results, log_dir = results
    parent, name = os.path.split(os.path.normpath(str(log_dir)))
    provider, stop = tensorboard_loaders.provider("python", parent, expect_runs=[name])
    try:
        series = reader.read_series(provider, None, "", name)
    finally:
        stop()
    wait = results[0]["wait"]
    at = [c["updates"] for c in wait["calls"] if c["mixed"] is not None]
    expected, previous = {}, 0
    for step in (5, 10, 15, 20, 24):  # the writes: every 5 updates and the epoch end
        window = [s for u, s in zip(at, wait["staleness"]) if previous < u <= step]
        if window:
            expected[step] = np.mean(window)
        previous = step
    got = {s: v for s, _, v in series["adapt/staleness"]}
    assert expected and got.keys() == expected.keys()
    for step, value in expected.items():
        assert got[step] == pytest.approx(value, rel=1e-6)
    assert [v for _, _, v in series["adapt/sync_strategy"]] == [
        float(PairAveraging.index)] * len(series["adapt/sync_strategy"])
    # only rank 0's own step time: gathering the others' would be a barrier
    assert "adapt/step_time/rank_0" in series and "adapt/step_time/rank_1" not in series
