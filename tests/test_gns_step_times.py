"""GNSBatchSizePolicy's step-time term: the batch grows only as far as the one
that trains fastest, priced by the throughput model the policy feeds; and the
UpdateTimer both batch-size policies time their updates with."""

import json
import math

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.formulas.throughput import ThroughputModel
from keras_adapt.policies import GNSBatchSizePolicy, UpdateTimer, goodput_gain

# Step time of one update at global batch m on one worker through
# accumulation of 16-sample micro-batches: a fixed cost and a cost per
# micro-step, T(m) = FIXED + PER_MICRO x m / 16.
FIXED, PER_MICRO = 0.010, 0.002


def _seconds(m):
    return FIXED + PER_MICRO * m / 16


def _goodput(m, gns):
    """Statistical progress per second at batch m, up to a constant."""
    return m / ((gns + m) * _seconds(m))


def _fastest(gns):
    """The analytic maximum of _goodput: m* = sqrt(gns x FIXED x 16 / PER_MICRO)."""
    return math.sqrt(gns * FIXED * 16 / PER_MICRO)


def _policy(times=None, **kwargs):
    """A GNS policy on one worker (micro-batch 16), its model fed ``times``:
    ``{k: seconds}``, five observations per accumulation k (the first is the
    model's warm-up), scattered by +-0.5% so that the fit has standard errors."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    kwargs.setdefault("warmup_updates", 0)
    kwargs.setdefault("min_change_interval", 0)
    kwargs.setdefault("price_step_times", True)
    kwargs.setdefault("max_growth", None)  # the pricing alone, from the start batch to the target
    policy = GNSBatchSizePolicy(16, 4096, micro_batch_size=16, **kwargs)
    policy.set_model(model)
    for k, t in (times or {}).items():
        for i in range(5):
            policy.throughput_model.observe(16, t * (1 + 0.005 * (-1) ** i), accumulation=k)
    return policy


def _linear_times(*ks):
    return {k: _seconds(16 * k) for k in ks}


@pytest.mark.parametrize("gns", [150.0, 500.0, 2000.0])
def test_fastest_batch_is_the_analytic_optimum_of_goodput(gns):
    # Two accumulations measured (1 and 8): the fit is T = FIXED + PER_MICRO k
    # exactly (the scatter is symmetric), and without the confidence margin
    # the policy's choice is the grid point nearest the maximum of
    # m / ((gns + m) T(m)).
    policy = _policy(_linear_times(1, 8), confidence=0.0)
    fit = policy.throughput_model.fit()
    assert fit.usable and fit.evidence == "repeats"
    predicted = fit.predict_step_time(16, accumulation=20).value
    assert predicted == pytest.approx(_seconds(320), rel=1e-6)
    best = _fastest(gns)  # sqrt(80 gns): 110, 200, 400
    fastest = policy.fastest_batch(16, 4096, gns)
    step = (4096 / 16) ** (1 / 48)  # the grid's ratio
    assert best / step <= fastest <= best * step
    assert _goodput(fastest, gns) >= 0.99 * _goodput(best, gns)
    # it is the best of its grid (the batches that 16-sample micro-batches
    # make) by the same arithmetic, done independently
    grid = [16 * max(1, math.floor(round(16 * (4096 / 16) ** (i / 48)) / 16 + 0.5))
            for i in range(1, 49)]
    assert fastest == max(grid, key=lambda m: _goodput(m, gns))


def test_growth_stops_at_the_fastest_batch_and_the_event_says_why(tmp_path):
    gns = 500.0  # target 2 x 500 = 1000; the fastest batch is near sqrt(80 x 500) = 200
    policy = _policy(_linear_times(1, 8), confidence=0.0, log_dir=str(tmp_path), interval=10,
                     base_batch=16)
    fastest = policy.fastest_batch(16, 1000, gns)
    assert 176 <= fastest <= 224
    assert policy.should_change(10, gns, 100, 16) == fastest
    policy.decide(10, {"gns": gns, "covered_updates": 100})
    (event,) = [e for e in policy.events if e["kind"] == "batch_size"]
    # a batch that 16-sample micro-batches make
    assert event["after"]["batch_size"] == fastest and fastest % 16 == 0
    assert f"step times (model): {fastest} is the fastest batch up to 1000" in event["reason"]
    with open(tmp_path / "adapt_events.jsonl") as f:
        assert [json.loads(line)["reason"] for line in f][:1] == [event["reason"]]
    # from there, a larger noise scale moves the optimum only by its square
    # root: at 1.44 gns it is 1.2 x 200 = 240, less than a band-sized step
    # (1.25 x the batch), at 3 gns sqrt(3) x 200 = 346, beyond it
    current = policy.batch.value
    assert policy.should_change(20, 1.44 * gns, 100, current) is None
    grown = policy.should_change(20, 3.0 * gns, 100, current)
    assert grown >= 1.25 * current
    assert grown == policy.fastest_batch(current, 3000, 3.0 * gns)


def test_flat_or_unmeasured_step_times_leave_the_target():
    gns = 500.0
    # nothing measured: flat, the noise scale's target
    assert _policy().should_change(10, gns, 100, 16) == 1000
    # one accumulation only: no fit, flat
    assert _policy({1: 0.010}).should_change(10, gns, 100, 16) == 1000
    # the same time at k = 1 and k = 8, within the scatter: no difference counts
    flat = _policy({1: 0.010, 8: 0.010})
    assert flat.update_timer.time_ratio(16, 128, flat.configuration) == 1.0
    assert flat.should_change(10, gns, 100, 16) == 1000
    # off (the default), there is nothing to consult or feed
    assert GNSBatchSizePolicy(16, 64).price_step_times is False
    off = _policy(price_step_times=False)
    assert off.throughput_model is None and off.update_timer is None
    assert off.should_change(10, gns, 100, 16) == 1000


def test_an_uncertain_slope_counts_only_beyond_its_errors():
    # 1.1x the step time at 8x the batch, with +-5% scatter: within 2
    # standard errors the ratio is flat, and the target stands
    policy = _policy(confidence=2.0)
    for k, t in ((1, 0.010), (8, 0.011)):
        for i in range(5):
            policy.throughput_model.observe(16, t * (1 + 0.05 * (-1) ** i), accumulation=k)
    assert policy.update_timer.time_ratio(16, 128, policy.configuration) == 1.0
    assert policy.should_change(10, 500.0, 100, 16) == 1000
    # and with the clear slope of _linear_times the default margin still
    # finds a batch well below the target
    clear = _policy(_linear_times(1, 8))
    assert 130 <= clear.should_change(10, 500.0, 100, 16) <= 260


def test_goodput_gain_is_progress_per_second():
    # E(M) x M / T(M) against the current batch, by its definition
    gns, current, m, ratio = 300.0, 64, 256, 0.7
    eff = lambda b: (gns + 32) / (gns + b)  # base 32; it cancels
    assert goodput_gain(m, current, gns, ratio) == pytest.approx(
        m * eff(m) / (current * eff(current)) * ratio, rel=1e-12)
    assert goodput_gain(current, current, gns) == 1.0


def test_update_timer_feeds_the_model_at_the_configuration_that_ran():
    # a real fit: the timer's observations land at (micro-batch, workers, k)
    # of the batch that ran, one per adapt() after each visit's warm-up
    x = np.ones((512, 4), "float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    policy = GNSBatchSizePolicy(8, 64, micro_batch_size=8, warmup_updates=10**6, interval=10,
                                price_step_times=True)
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    ((config, times),) = policy.throughput_model.configurations().items()
    assert config == (8, keras_adapt.size(), 1)
    # 64 updates: observations at 10, ..., 60, the first dropped
    assert len(times) == 5 and all(0 < t < 1 for t in times)


def test_bad_arguments_and_config_round_trip():
    with pytest.raises(TypeError, match="price_step_times must be True or False, got 'yes'"):
        GNSBatchSizePolicy(16, 64, price_step_times="yes")
    with pytest.raises(ValueError, match="throughput_model=.* is only used with price_step_t"):
        GNSBatchSizePolicy(16, 64, price_step_times=False, throughput_model=ThroughputModel())
    with pytest.raises(ValueError, match="confidence=-1"):
        GNSBatchSizePolicy(16, 64, confidence=-1)
    with pytest.raises(TypeError, match="throughput_model='fast' is not valid"):
        UpdateTimer("fast")
    policy = GNSBatchSizePolicy(16, 64, price_step_times=True, confidence=1.0)
    config = json.loads(json.dumps(policy.get_config()))
    assert (config["price_step_times"], config["confidence"]) == (True, 1.0)
    assert GNSBatchSizePolicy.from_config(config).get_config() == config
