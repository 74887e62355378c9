"""SyncStrategyPolicy's rule on scripted inputs (one process; the two-worker
run is in test_policies_distributed.py)."""

import keras
import numpy as np
import pytest

import keras_adapt
from keras_adapt.optimizer import set_base_learning_rate
from keras_adapt.policies import SyncStrategyPolicy
from keras_adapt.sync import AllReduceSGD, BlockMomentum, LocalSGD, ModelAveraging


class ScriptedTiming:
    """A timing source whose comm fraction the test sets."""

    def __init__(self):
        self.comm_fraction = 0.0

    def result(self):
        return {"comm_fraction": self.comm_fraction}


def attach(policy, declared=(AllReduceSGD(), LocalSGD(period=4)), lr=0.1):
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr), gradient_stats=True,
                                           sync_strategy=list(declared))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(opt, "mse")
    policy.set_model(model)
    return opt


def decide(policy, step, gns=100.0, batch=64, covered=1000):
    """One decision on scripted values; the strategy name afterwards."""
    policy.adapt(step, {"gns": gns, "batch_size": batch, "covered_updates": covered})
    return policy.sync.strategy.name


def test_noise_rules_switch_after_patience_with_a_hysteresis_band():
    policy = SyncStrategyPolicy(local=LocalSGD(period=4), noise_low=0.5, noise_high=2.0,
                                comm_fraction=None, decay_ratio=None, warmup_updates=0,
                                patience=2, min_switch_interval=0)
    attach(policy)
    # B = 64: the band is gns in [32, 128].
    assert decide(policy, 10, gns=100) == "allreduce_sgd"  # inside the band
    assert decide(policy, 20, gns=31) == "allreduce_sgd"  # first proposal
    assert decide(policy, 30, gns=100) == "allreduce_sgd"  # streak broken
    assert decide(policy, 40, gns=20) == "allreduce_sgd"
    assert decide(policy, 50, gns=20) == "local_sgd"  # second in a row
    assert decide(policy, 60, gns=127) == "local_sgd"  # inside the band: stays
    assert decide(policy, 70, gns=129) == "local_sgd"
    assert decide(policy, 80, gns=129) == "allreduce_sgd"
    e1, e2 = policy.events
    assert (e1["kind"], e1["before"], e1["after"]) == (
        "sync_strategy", {"sync_strategy": "allreduce_sgd"},
        {"sync_strategy": "local_sgd", "period": 4, "start_after": 0})
    assert e1["reason"] == "gns 20 < 0.5 x global batch 64"
    assert e2["reason"] == "gns 129 > 2 x global batch 64"
    assert e2["after"] == {"sync_strategy": "allreduce_sgd"}


def test_warmup_and_min_switch_interval_hold_decisions_back():
    policy = SyncStrategyPolicy(noise_low=0.5, noise_high=2.0, comm_fraction=None,
                                decay_ratio=None, warmup_updates=100, patience=1,
                                min_switch_interval=50)
    attach(policy, declared=(AllReduceSGD(), LocalSGD(period=8)))
    assert decide(policy, 10, gns=10, covered=99) == "allreduce_sgd"  # warm-up
    assert decide(policy, 20, gns=10, covered=100) == "local_sgd"
    assert decide(policy, 60, gns=500) == "local_sgd"  # 40 < 50 updates since
    assert decide(policy, 70, gns=500) == "allreduce_sgd"
    assert [e["step"] for e in policy.events] == [0, 0]  # the model never trained
    assert len(policy.events) == 2


def test_communication_rule_uses_the_fraction_measured_under_allreduce():
    timing = ScriptedTiming()
    policy = SyncStrategyPolicy(local=ModelAveraging(alpha=0.2), noise_low=0.5, noise_high=2.0,
                                comm_fraction=0.3, timing=timing, decay_ratio=None,
                                warmup_updates=0, patience=1, min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), ModelAveraging(alpha=0.2)))
    timing.comm_fraction = 0.29
    assert decide(policy, 10) == "allreduce_sgd"
    timing.comm_fraction = 0.45
    assert decide(policy, 20) == "model_averaging"
    assert policy.events[-1]["reason"] == "communication 45% of the AllReduceSGD step >= 30%"
    # Local steps communicate less; that fraction does not switch back.
    timing.comm_fraction = 0.05
    assert decide(policy, 30) == "model_averaging"
    # The noise scale above the band outranks communication.
    assert decide(policy, 40, gns=300) == "allreduce_sgd"
    assert len(policy.events) == 2


def test_post_local_sgd_after_the_configured_learning_rate_decays():
    policy = SyncStrategyPolicy(noise_low=0.5, noise_high=2.0, comm_fraction=None,
                                decay_ratio=2.0, warmup_updates=0, patience=1,
                                min_switch_interval=0)
    opt = attach(policy, lr=0.1)
    set_base_learning_rate(opt, 0.2)  # a warm-up raised it: the peak is 0.2
    assert decide(policy, 10) == "allreduce_sgd"
    set_base_learning_rate(opt, 0.11)
    assert decide(policy, 20) == "allreduce_sgd"  # 0.11 > 0.2 / 2
    set_base_learning_rate(opt, 0.1)
    # Rule 1 outranks a noise scale above the band.
    assert decide(policy, 30, gns=1000) == "local_sgd"
    assert policy.events[0]["reason"] == (
        "post-local SGD: the learning rate decayed to 0.1 from its peak 0.2")
    assert decide(policy, 40, gns=1000) == "local_sgd"


def test_a_rule_of_your_own_in_a_few_lines():
    class Every20(SyncStrategyPolicy):
        def choose(self, step, values):
            return (self.local if step % 40 == 20 else AllReduceSGD()), f"step {step}"

    policy = Every20(local=BlockMomentum(period=2), warmup_updates=0, patience=1,
                     min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), BlockMomentum(period=2)))
    assert [decide(policy, s) for s in (20, 40, 60)] == [
        "block_momentum", "allreduce_sgd", "block_momentum"]


def test_state_round_trip_restores_the_strategy_and_the_peak():
    policy = SyncStrategyPolicy(decay_ratio=2.0, comm_fraction=None, warmup_updates=0,
                                patience=1, min_switch_interval=0)
    opt = attach(policy, declared=(AllReduceSGD(), LocalSGD(period=8)))
    decide(policy, 10)
    set_base_learning_rate(opt, 0.04)
    assert decide(policy, 20) == "local_sgd"
    state = policy.get_state()
    assert state["strategy"] == "local_sgd" and state["peak_lr"] == pytest.approx(0.1)
    fresh = SyncStrategyPolicy(**policy.get_config())
    opt2 = attach(fresh, declared=(AllReduceSGD(), LocalSGD(period=8)))
    fresh.restore(state)
    assert opt2.adapt_state.sync.strategy == LocalSGD(period=8)
    assert fresh.get_config() == policy.get_config()


def test_bad_arguments_name_the_value_and_the_fix():
    with pytest.raises(TypeError, match="local=AllReduceSGD.*not a local strategy"):
        SyncStrategyPolicy(local=AllReduceSGD())
    with pytest.raises(TypeError, match="local=42"):
        SyncStrategyPolicy(local=42)
    with pytest.raises(ValueError, match="noise_low=2.0 must be below noise_high=1.0"):
        SyncStrategyPolicy(noise_low=2.0, noise_high=1.0)
    with pytest.raises(ValueError, match="give both"):
        SyncStrategyPolicy(noise_low=None)
    with pytest.raises(ValueError, match="comm_fraction=1.5"):
        SyncStrategyPolicy(comm_fraction=1.5)
    with pytest.raises(ValueError, match="decay_ratio=1"):
        SyncStrategyPolicy(decay_ratio=1)
    with pytest.raises(TypeError, match="timing=.*no result"):
        SyncStrategyPolicy(timing=object())
    with pytest.raises(ValueError, match="patience=0"):
        SyncStrategyPolicy(patience=0)
    policy = SyncStrategyPolicy(local=LocalSGD(period=4))
    with pytest.raises(ValueError, match=r"does not declare LocalSGD.*sync_strategy=\[AllReduceSGD\(\), "
                                         r"LocalSGD\(period=4, start_after=0\)\]"):
        attach(policy, declared=(AllReduceSGD(), ModelAveraging(0.1)))


def test_policy_in_fit_writes_the_strategy_index_to_the_logs():
    class LocalFrom20(SyncStrategyPolicy):
        def choose(self, step, values):
            return (self.local, "scripted") if step >= 20 else None

    policy = LocalFrom20(warmup_updates=0, patience=1, min_switch_interval=0, interval=10)
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05), gradient_stats=True,
                                           sync_strategy=[AllReduceSGD(), LocalSGD(period=8)])
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(opt, "mse")
    x = np.random.default_rng(0).normal(size=(400, 3)).astype("float32")
    history = model.fit(x, x.sum(1), batch_size=8, epochs=2, verbose=0, callbacks=[policy])
    assert [e["step"] for e in policy.events] == [20]
    assert history.history["sync_strategy"] == [LocalSGD.index, LocalSGD.index]
