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


def test_period_follows_the_noise_scale_by_hand_with_hysteresis_and_bounds():
    policy = SyncStrategyPolicy(local=LocalSGD(period=8), noise_scale=1.0, hysteresis=0.25,
                                comm_fraction=None, decay_ratio=None, warmup_updates=0,
                                patience=1, min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), LocalSGD(period=8)))
    # B = 32: H = the largest power of two <= gns / 32, in [1, 8]; up only
    # when gns / 32 / 1.25 reaches the new H, down only when gns / 32 x 1.25
    # falls below the current H.
    steps = [(10, 70, 1),     # 2.19 / 1.25 = 1.75 < 2: stays S-SGD
             (20, 80, 2),     # 2.5 / 1.25 = 2
             (30, 150, 2),    # 4.69 / 1.25 = 3.75 < 4
             (40, 160, 4),    # 5 / 1.25 = 4
             (50, 56, 2),     # 1.75 x 1.25 = 2.19: the level 2, below 4
             (60, 1000, 8),   # 31.25 / 1.25 = 25: capped at H_max = 8
             (70, 10 ** 6, 8),
             (80, 200, 4),    # 6.25 x 1.25 = 7.8 < 8: down to 4
             (90, 20, 1)]     # 0.625 x 1.25 = 0.78 < 1: AllReduceSGD
    got = []
    for step, gns, _ in steps:
        decide(policy, step, gns=gns, batch=32)
        got.append(policy.period())
    assert got == [h for *_, h in steps]
    assert [e["after"].get("period", 1) for e in policy.events] == [2, 4, 2, 8, 4, 1]
    assert [e["before"] for e in policy.events[:2]] == [
        {"sync_strategy": "allreduce_sgd"},
        {"sync_strategy": "local_sgd", "period": 2, "start_after": 0}]
    assert policy.events[1]["after"] == {"sync_strategy": "local_sgd", "period": 4,
                                         "start_after": 0}
    assert policy.events[0]["reason"] == "noise scale 80 x 1 = 2.5 x global batch 32: period 2"
    assert policy.events[-1]["reason"] == "noise scale 20 x 1 = 0.625 x global batch 32: period 1"
    assert policy.events[-1]["after"] == {"sync_strategy": "allreduce_sgd"}
    assert policy.sync.strategy == AllReduceSGD()


def test_noise_scale_factor_scales_the_ratio():
    policy = SyncStrategyPolicy(local=LocalSGD(period=16), noise_scale=0.5, hysteresis=0.0,
                                comm_fraction=None, decay_ratio=None, warmup_updates=0,
                                patience=1, min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), LocalSGD(period=16)))
    # 0.5 x 512 / 64 = 4 exactly (no hysteresis): H = 4; 0.5 x 500 / 64 = 3.9: H = 2
    assert decide(policy, 10, gns=512, batch=64) == "local_sgd" and policy.period() == 4
    assert decide(policy, 20, gns=500, batch=64) == "local_sgd" and policy.period() == 2


def test_warmup_patience_and_min_switch_interval_hold_changes_back():
    policy = SyncStrategyPolicy(local=LocalSGD(period=8), comm_fraction=None,
                                decay_ratio=None, warmup_updates=100, patience=2,
                                min_switch_interval=50)
    attach(policy, declared=(AllReduceSGD(), LocalSGD(period=8)))
    assert decide(policy, 10, gns=1000, batch=32, covered=99) == "allreduce_sgd"  # warm-up
    assert decide(policy, 20, gns=1000, batch=32) == "allreduce_sgd"  # first proposal
    assert decide(policy, 30, gns=100, batch=32) == "allreduce_sgd"  # another one: streak 1
    assert policy.period() == 1
    assert decide(policy, 40, gns=100, batch=32) == "local_sgd"  # H = 2 twice in a row
    assert policy.period() == 2
    for step in (50, 60, 70, 80):  # H = 8 proposed, but < 50 updates since the change
        decide(policy, step, gns=1000, batch=32)
        assert policy.period() == 2
    decide(policy, 90, gns=1000, batch=32)
    assert policy.period() == 8
    assert [e["after"]["period"] for e in policy.events] == [2, 8]


def test_communication_gate_uses_the_fraction_measured_under_allreduce():
    timing = ScriptedTiming()
    policy = SyncStrategyPolicy(local=LocalSGD(period=8), comm_fraction=0.3, timing=timing,
                                decay_ratio=None, warmup_updates=0, patience=1,
                                min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), LocalSGD(period=8)))
    timing.comm_fraction = 0.29
    assert decide(policy, 10, gns=1000, batch=32) == "allreduce_sgd"  # not worth it
    timing.comm_fraction = 0.45
    assert decide(policy, 20, gns=170, batch=32) == "local_sgd" and policy.period() == 4
    assert policy.events[-1]["reason"] == (
        "noise scale 170 x 1 = 5.31 x global batch 32: period 4")
    # Local steps communicate less; that fraction does not close the gate.
    timing.comm_fraction = 0.05
    assert decide(policy, 30, gns=170, batch=32) == "local_sgd" and policy.period() == 4
    assert len(policy.events) == 1


def test_communication_gate_with_a_strategy_without_a_period():
    timing = ScriptedTiming()
    policy = SyncStrategyPolicy(local=ModelAveraging(alpha=0.2), noise_scale=None,
                                comm_fraction=0.3, timing=timing, decay_ratio=None,
                                warmup_updates=0, patience=1, min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), ModelAveraging(alpha=0.2)))
    assert policy.max_period == 2  # "H >= 2" is the strategy itself
    timing.comm_fraction = 0.1
    assert decide(policy, 10) == "allreduce_sgd"
    timing.comm_fraction = 0.4
    assert decide(policy, 20) == "model_averaging"
    assert policy.events[-1]["reason"] == (
        "communication 40% of the AllReduceSGD step >= 30%")
    assert policy.events[-1]["after"] == {"sync_strategy": "model_averaging", "alpha": 0.2}


def test_without_noise_and_communication_rules_the_largest_period():
    policy = SyncStrategyPolicy(local=LocalSGD(period=4), noise_scale=None, comm_fraction=None,
                                timing=ScriptedTiming(), decay_ratio=None, warmup_updates=0,
                                patience=1, min_switch_interval=0)
    attach(policy)
    assert decide(policy, 10, gns=1, batch=32) == "local_sgd" and policy.period() == 4
    assert policy.events[0]["reason"] == "the local strategy (no noise rule): period 4"


def test_post_local_floor_after_the_configured_learning_rate_decays():
    timing = ScriptedTiming()  # communication 0%: the gate keeps S-SGD
    policy = SyncStrategyPolicy(local=LocalSGD(period=8), comm_fraction=0.3, timing=timing,
                                decay_ratio=2.0, decay_period=4, warmup_updates=0, patience=1,
                                min_switch_interval=0)
    opt = attach(policy, lr=0.1, declared=(AllReduceSGD(), LocalSGD(period=8)))
    set_base_learning_rate(opt, 0.2)  # a warm-up raised it: the peak is 0.2
    assert decide(policy, 10, gns=1000, batch=32) == "allreduce_sgd"
    set_base_learning_rate(opt, 0.11)
    assert decide(policy, 20, gns=1000, batch=32) == "allreduce_sgd"  # 0.11 > 0.2 / 2
    set_base_learning_rate(opt, 0.1)
    assert decide(policy, 30, gns=1, batch=32) == "local_sgd" and policy.period() == 4
    assert policy.events[0]["reason"] == (
        "post-local SGD: the learning rate decayed to 0.1 from its peak 0.2: period 4")
    # A floor, not a ceiling: with the gate open a large noise scale goes higher.
    timing.comm_fraction = 0.5
    policy.sync.set(AllReduceSGD())  # measured under AllReduceSGD
    decide(policy, 35, gns=1, batch=32)
    assert policy.period() == 4
    assert decide(policy, 40, gns=1000, batch=32) == "local_sgd" and policy.period() == 8


def test_a_rule_of_your_own_in_a_few_lines():
    class Every20(SyncStrategyPolicy):
        def choose(self, step, values):
            return (self.local if step % 40 == 20 else AllReduceSGD()), f"step {step}"

    policy = Every20(local=BlockMomentum(period=2), warmup_updates=0, patience=1,
                     min_switch_interval=0)
    attach(policy, declared=(AllReduceSGD(), BlockMomentum(period=2)))
    assert [decide(policy, s) for s in (20, 40, 60)] == [
        "block_momentum", "allreduce_sgd", "block_momentum"]


def _switched():
    """A policy that switched to LocalSGD(period=2) after the rate decayed."""
    policy = SyncStrategyPolicy(decay_ratio=2.0, decay_period=2, comm_fraction=None,
                                warmup_updates=0, patience=1, min_switch_interval=0)
    opt = attach(policy, declared=(AllReduceSGD(), LocalSGD(period=8)))
    decide(policy, 10, gns=1, batch=32)
    set_base_learning_rate(opt, 0.04)
    assert decide(policy, 20, gns=1, batch=32) == "local_sgd"
    return policy


def test_state_round_trip_restores_the_strategy_the_period_and_the_peak():
    policy = _switched()
    state = policy.get_state()
    assert state["strategy"] == "local_sgd" and state["peak_lr"] == pytest.approx(0.1)
    assert state["strategy_params"] == {"period": 2, "start_after": 0}
    fresh = SyncStrategyPolicy(**policy.get_config())
    opt2 = attach(fresh, declared=(AllReduceSGD(), LocalSGD(period=8)))
    fresh.restore(state)
    assert opt2.adapt_state.sync.strategy == LocalSGD(period=2)
    assert fresh.get_config() == policy.get_config()


def test_a_state_restored_before_the_model_is_attached_applies_when_it_is():
    # A worker joining an elastic job: KerasState takes the policy before
    # fit (its get_state works), the sync restores the committed state, and
    # fit attaches the policy.
    policy = _switched()
    state = policy.get_state()
    joiner = SyncStrategyPolicy(**policy.get_config())
    assert joiner.get_state() == {"last_adapt": None, "last_switch": None, "peak_lr": None,
                                  "sync_comm": None}
    joiner.restore(state)
    assert joiner.get_state() == state     # a commit before fit keeps it
    opt2 = attach(joiner, declared=(AllReduceSGD(), LocalSGD(period=8)))
    assert opt2.adapt_state.sync.strategy == LocalSGD(period=2)
    assert joiner.get_state() == state


def test_bad_arguments_name_the_value_and_the_fix():
    with pytest.raises(TypeError, match="local=AllReduceSGD.*not a local strategy"):
        SyncStrategyPolicy(local=AllReduceSGD())
    with pytest.raises(TypeError, match="local=42"):
        SyncStrategyPolicy(local=42)
    with pytest.raises(ValueError, match="noise_scale=0"):
        SyncStrategyPolicy(noise_scale=0)
    with pytest.raises(ValueError, match="hysteresis=-0.1"):
        SyncStrategyPolicy(hysteresis=-0.1)
    with pytest.raises(ValueError, match="decay_period=16 exceeds the local strategy's period 8"):
        SyncStrategyPolicy(local=LocalSGD(period=8), decay_period=16)
    with pytest.raises(ValueError, match="decay_period=1"):
        SyncStrategyPolicy(decay_period=1)
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
