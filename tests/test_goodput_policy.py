"""GoodputBatchSizePolicy in one process: its decisions from scripted step
times and noise scales (numbers worked out by hand), the path where the
throughput fit is refused, stability under timing noise, and its timing in
a real fit."""

import json
import time

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.data import AdaptiveBatchDataset
from keras_adapt.perf_model import ThroughputModel
from keras_adapt.policies import GoodputBatchSizePolicy, statistical_efficiency
from test_policies import _drive, _model


def _attached(throughput_model=None, **kwargs):
    """A policy attached to a model whose batch grows through an adaptive
    dataset (micro-batch = global batch on one worker, k = 1)."""
    x = np.ones((2048, 4), "float32")
    ds = AdaptiveBatchDataset(x, x[:, :1], micro_batch_size=32)
    policy = GoodputBatchSizePolicy(min_batch=32, max_batch=1024, dataset=ds,
                                    max_micro_batch_size=1024,
                                    throughput_model=throughput_model, **kwargs)
    policy.set_model(_model())
    return policy


def _exact_model(step_time, batches=(32, 64, 128, 256)):
    model = ThroughputModel(warmup=0, min_observations=1)
    for b in batches:
        model.observe(b, step_time(b))
    return model


def test_statistical_efficiency_and_candidates():
    assert statistical_efficiency(32, 32, 50.0) == 1.0
    assert statistical_efficiency(64, 32, 50.0) == pytest.approx(82.0 / 114.0)
    policy = GoodputBatchSizePolicy(min_batch=32, max_batch=1000, micro_batch_size=32)
    assert policy.candidates() == [32, 64, 128, 256, 512, 1000]  # min x 2^i, then max


def test_the_default_adascale_gain_is_the_scale_times_the_efficiency():
    # The policy's default learning-rate rule reads the same noise scale:
    # with |G|^2 = 1 and tr(Sigma) = phi = 96 at base batch 32, sigma^2 = 3
    # and AdaScale's gain at 128 (scale 4) is (3 + 1) / (3/4 + 1) = 16/7,
    # which is 4 x E(128) = 4 x 128/224: at the efficiency floor the rate
    # is min_efficiency x the linearly scaled one.
    policy = GoodputBatchSizePolicy(min_batch=32, max_batch=512, micro_batch_size=32)
    assert type(policy.scaling_rule).__name__ == "AdaScale"
    gain = policy.scaling_rule.factor(4.0, {"grad_sqr": 1.0, "grad_var": 96.0}, base_batch=32)
    assert gain == pytest.approx(16.0 / 7.0)
    assert gain == pytest.approx(4.0 * statistical_efficiency(128, 32, 96.0))
    assert statistical_efficiency(128, 32, 96.0) == pytest.approx(4.0 / 7.0)


def test_flat_step_times_grow_one_doubling_while_efficiency_holds():
    # No usable fit (nothing observed): step times flat, so the goodput
    # gain of a doubling is 2 x E(2M) / E(M) and the floor decides.
    policy = GoodputBatchSizePolicy(min_batch=32, max_batch=1024, micro_batch_size=32)
    assert (policy.min_efficiency, policy.hysteresis) == (0.75, 0.25)
    c = policy.choose(32, gns=200.0)
    # E(64) = 232/264 = 0.8788; gain 2 x 0.8788 = 1.758 > 1.25: one doubling, not more
    assert (c.batch, c.step_times) == (64, "flat")
    assert "x1.758" in c.reason and "efficiency 0.879" in c.reason
    assert c.fit_reason.startswith("no configuration has 3 observations")
    # E(128) = 232/328 = 0.707 < 0.75: stay at 64
    c = policy.choose(64, gns=200.0)
    assert c.batch == 64 and "efficiency 0.707 at 128 < 0.75" in c.reason
    # at gns 400, E(128) = 432/528 = 0.818: grow; E(256) = 432/656 = 0.659: not beyond
    assert policy.choose(64, gns=400.0).batch == 128
    assert policy.choose(128, gns=400.0).batch == 128
    # down only below min_efficiency / (1 + hysteresis) = 0.6:
    # E(128) at gns 150 = 182/278 = 0.655 (stay), at gns 100 = 132/228 = 0.579 (down)
    assert policy.choose(128, gns=150.0).batch == 128
    c = policy.choose(128, gns=100.0)
    assert c.batch == 64 and "efficiency 0.579 at 128 < 0.75" in c.reason
    assert policy.choose(1024, gns=1e6).reason == "1024 is max_batch"


def test_a_usable_fit_prices_the_step_times():
    # Compute-bound: T(b) = 1 ms + 0.4 ms x b, fitted exactly (std 0).
    model = _exact_model(lambda b: 0.001 + 4e-4 * b)
    fit = model.fit()
    assert fit.usable and fit.params["per_sample"] == pytest.approx(4e-4)
    policy = _attached(model)
    # gns 1000: flat step times would grow (E(64) = 1032/1064 = 0.970), but
    # goodput(64) / goodput(32) = (64/0.0266 x 0.96992) / (32/0.0138) = 1.0064
    c = policy.choose(32, gns=1000.0)
    assert (c.batch, c.step_times) == (32, "model")
    assert "x1.006 at 64 <= 1.25" in c.reason
    # Down by goodput: at gns 300, goodput(64) / goodput(128)
    # = (2406.0 x 332/364) / (2452.1 x 332/428) = 1.1537 > 1.1
    policy = _attached(model, hysteresis=0.1)
    c = policy.choose(128, gns=300.0)
    assert c.batch == 64 and "goodput x1.154 at 64" in c.reason
    # Fixed-cost dominated: T(b) = 20 ms + 1 us x b; gns 1000, from 128:
    # goodput(256)/goodput(128) = 2 x (20.128/20.256) x (1128/1256) = 1.7848
    policy = _attached(_exact_model(lambda b: 0.020 + 1e-6 * b))
    c = policy.choose(128, gns=1000.0)
    assert (c.batch, c.step_times) == (256, "model") and "x1.785" in c.reason


def test_the_uncertainty_of_the_fit_holds_a_move_back():
    # Noisy step times: a nominal gain above the threshold that the
    # predictions' standard errors do not support keeps the batch.
    rng = np.random.default_rng(5)
    model = ThroughputModel(warmup=0, min_observations=1)
    for b in (32, 64, 96, 128, 192, 256):
        model.observe(b, (0.004 + 2e-4 * b) * (1 + 0.08 * rng.standard_normal()))
    fit = model.fit()
    assert fit.usable
    t32, t64 = fit.predict_step_time(32), fit.predict_step_time(64)
    e32, e64 = 1.0, statistical_efficiency(64, 32, 1e6)
    nominal = (64 * e64 / t64.value) / (32 * e32 / t32.value)
    pessimistic = nominal / (1 + 2.0 * (t64.relative_std + t32.relative_std))
    threshold = (nominal * pessimistic) ** 0.5  # between the two
    assert 1.0 < pessimistic < threshold < nominal  # the case this test is about
    policy = _attached(model, hysteresis=threshold - 1)
    assert policy.choose(32, gns=1e6).batch == 32
    # with confidence 0 the nominal gain decides
    assert _attached(model, hysteresis=threshold - 1, confidence=0.0).choose(32, gns=1e6).batch == 64


def test_a_refused_fit_only_caps_the_flat_guess():
    # Step times that do not depend on the batch (+-1%): the fit does not
    # beat the constant model, so it is not usable; its estimate (the
    # least-squares line through the six batches) may only lower the gain.
    model = ThroughputModel(warmup=0, min_observations=1)
    times = {b: 0.008 * (1 + 0.01 * (-1) ** i) for i, b in enumerate((32, 64, 128, 256, 512, 1024))}
    for b, t in times.items():
        model.observe(b, t)
    fit = model.fit()
    assert not fit.usable and fit.fitted and "does not beat the constant model" in fit.reason
    # the estimate is the relative least-squares line: minimise sum((1 - (a + b x) / t)^2)
    rows = np.array([[1.0 / t, b / t] for b, t in times.items()])
    a, slope = np.linalg.lstsq(rows, np.ones(6), rcond=None)[0]
    assert fit.predict_step_time(64, tentative=True).value == pytest.approx(a + 64 * slope)
    with pytest.raises(RuntimeError, match="not usable"):
        fit.predict_step_time(64)  # only on request
    c = _attached(model).choose(32, gns=300.0)
    # E(64) = 332/364 = 0.912: flat gain 2 x 0.912 = 1.824; the estimate's
    # (slightly rising) times lower it
    flat = 2 * statistical_efficiency(64, 32, 300.0)
    gain = min(flat, flat * (a + 32 * slope) / (a + 64 * slope))
    assert (c.batch, c.step_times) == (64, "tentative") and f"x{gain:.3f}" in c.reason
    assert c.fit_reason == fit.reason


def test_an_estimate_not_yet_significant_vetoes_a_move_it_contradicts():
    # The compute-bound case: 32 and 64 about equal, 128 clearly slower,
    # but three noisy repeats each, so the times differ from a constant by
    # fewer than 4 standard errors and the fit is refused. Flat step times
    # would double (gns 1e6: E ~ 1, gain 2.0); the estimate says 256 costs
    # far more than twice 128's time per sample, and the batch stays.
    model = ThroughputModel(warmup=0, statistic="mean", repeats=True)
    reps = {32: (0.007, 0.010, 0.013), 64: (0.008, 0.011, 0.014), 128: (0.020, 0.024, 0.028)}
    for b, ts in reps.items():
        for t in ts:
            model.observe(b, t)
    fit = model.fit()
    assert not fit.usable and fit.fitted and fit.evidence == "repeats", fit.reason
    # the estimate: weighted least squares, weights 1 / se^2 of each batch's mean
    x = np.array(sorted(reps))
    mean = np.array([np.mean(reps[b]) for b in x])
    se = np.array([np.std(reps[b], ddof=1) / np.sqrt(3) for b in x])
    slope, a = np.polyfit(x, mean, 1, w=1.0 / se)
    t128, t256 = a + 128 * slope, a + 256 * slope
    assert fit.predict_step_time(256, tentative=True).value == pytest.approx(t256, rel=1e-9)
    e128, e256 = (statistical_efficiency(m, 32, 1e6) for m in (128, 256))
    flat = 2 * e256 / e128
    assert flat > 1.25 >= flat * t128 / t256  # flat says up, the estimate says no
    c = _attached(model).choose(128, gns=1e6)
    assert (c.batch, c.step_times) == (128, "tentative")
    assert f"goodput x{flat * t128 / t256:.3f} at 256 <= 1.25" in c.reason
    # nor does the estimate move the batch down on its own: at 256 the
    # halving's gain is the smaller of the flat one (< 1) and the estimate's
    assert _attached(model).choose(256, gns=1e6).batch == 256


def test_two_batches_and_their_repeats_price_the_next_doubling():
    # Visited 32 and 64 only: the fit rests on the repeats (a held-out error
    # needs 4 batches). T(32) = 13.2 ms (se 0.2/sqrt 3), T(64) = 16.3 ms
    # (se 0.3/sqrt 3); T(128) = 3 T(64) - 2 T(32) = 22.5 ms with variance
    # 4 var32 + 9 var64.
    model = ThroughputModel(warmup=0, repeats=True)
    for b, times in ((32, (0.0130, 0.0134, 0.0132)), (64, (0.0160, 0.0166, 0.0163))):
        for t in times:
            model.observe(b, t)
    assert model.fit().usable and model.fit().evidence == "repeats"
    var32, var64 = 0.0002 ** 2 / 3, 0.0003 ** 2 / 3
    rel = np.sqrt(4 * var32 + 9 * var64) / 0.0225 + np.sqrt(var64) / 0.0163  # 0.03590
    e64, e128 = statistical_efficiency(64, 32, 1e6), statistical_efficiency(128, 32, 1e6)
    nominal = (128 * e128 / 0.0225) / (64 * e64 / 0.0163)  # 1.4488
    for confidence, batch in ((2.0, 128), (6.0, 64)):
        gain = nominal / (1 + confidence * rel)  # 1.3517 at 2; 1.1920 at 6
        c = _attached(model, confidence=confidence).choose(64, gns=1e6)
        assert (c.batch, c.step_times) == (batch, "model"), c.reason
        assert f"x{gain:.3f}" in c.reason
    # flat step times would have said 2 x E(128)/E(64) = 2.0: up, whatever the confidence
    assert _attached(ThroughputModel(), confidence=6.0).choose(64, gns=1e6).batch == 128


@pytest.mark.primary_only  # numpy only, 100 fits
def test_two_batches_of_noise_are_not_taken_for_a_model():
    # 10% noise around a flat 8 ms at 32 and 64 (10 intervals each, their
    # medians as the policy's model takes them): the repeats find no slope
    # and the decision is the flat one (E(128) at gns 300 = 0.776 >= 0.75:
    # up) in every draw.
    decisions, usable = set(), 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        model = ThroughputModel(warmup=0, statistic="median", repeats=True)
        for b in (32, 64):
            for _ in range(10):
                model.observe(b, 0.008 * (1 + 0.1 * rng.standard_normal()))
        usable += model.fit().usable
        decisions.add(_attached(model).choose(64, gns=300.0).batch)
    assert decisions == {128}
    assert usable <= 1


@pytest.mark.primary_only  # numpy only, 100 fits
def test_decisions_do_not_flip_on_timing_noise():
    # 100 machines' worth of noisy timings (10% per observation) around a
    # flat step time: every one decides alike, whether its fit came out
    # usable (on noise) or refused.
    decisions, usable = set(), 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        model = ThroughputModel(warmup=0)
        for b in (32, 64, 128, 256):
            for _ in range(10):
                model.observe(b, 0.008 * (1 + 0.1 * rng.standard_normal()))
        usable += model.fit().usable
        policy = _attached(model)
        decisions.add(tuple(policy.choose(m, gns=g).batch
                            for m, g in ((32, 300.0), (64, 300.0), (128, 300.0), (128, 150.0),
                                         (256, 300.0))))
    # E(64) 0.912, E(128) 0.776: grow; E(256) 0.597: stay at 128; at
    # gns 150 E(128) 0.655 >= 0.6: stay; at 256 with gns 300 E = 0.597 < 0.6: down
    assert decisions == {(64, 128, 128, 128, 128)}
    assert usable < 100  # most such fits are refused


def test_scripted_run_records_decisions_and_feeds_the_model():
    model = _model()
    n = keras_adapt.size()
    policy = GoodputBatchSizePolicy(min_batch=16 * n, max_batch=256 * n, micro_batch_size=16,
                                    interval=10, verbose=0)
    script = [(10, 200.0 * n), (60, 200.0 * n), (110, 200.0 * n), (150, 200.0 * n),
              (160, 20.0 * n)]
    changes = _drive(policy, model, script)
    # gns 200: E(32) = 216/232 = 0.93 -> 32 at 10; 50 updates later E(64) =
    # 216/264 = 0.82 -> 64; E(128) = 216/328 = 0.66: stay; gns 20: E(64) =
    # 36/84 = 0.43 < 0.6 -> 32 (at n = 1; the same ratios at any n)
    assert changes == [(10, 16 * n, 32 * n), (60, 32 * n, 64 * n), (160, 64 * n, 32 * n)]
    reasons = [e["reason"] for e in policy.events if e["kind"] == "batch_size"]
    # one configuration observed at most before the first two: flat
    assert all("; throughput fit not usable: " in r for r in reasons[:2])
    # the last is the efficiency floor's, whatever the fit of the two
    # accumulations observed by then says (it depends on the real timings)
    assert reasons[2].startswith(f"efficiency 0.429 at {64 * n} < 0.75")
    # one observation per interval, at the configuration it ran (b, N, k);
    # the first interval of each visit is dropped (warm-up): k = 1 ran one
    # interval, k = 2 five (ending at 20..60), k = 4 ten (70..160)
    configs = policy.throughput_model.configurations()
    assert {c: len(t) for c, t in configs.items()} == {(16, n, 2): 4, (16, n, 4): 9}
    assert all(t > 0 for ts in configs.values() for t in ts)


@pytest.mark.timing  # a 0.5 s sleep against intervals within 30 ms of each other
def test_update_times_in_a_real_fit_and_the_median_ignores_slow_intervals():
    x = np.ones((256, 4), "float32")
    model = _model()
    policy = GoodputBatchSizePolicy(min_batch=8, max_batch=64, micro_batch_size=8,
                                    warmup_updates=10**6)  # measure only

    class OneSlowStep(keras.callbacks.Callback):  # e.g. an evaluation, once an epoch
        def on_train_batch_end(self, batch, logs=None):
            if batch == 15:
                time.sleep(0.5)

    model.fit(x, x[:, :1], batch_size=8, epochs=4, verbose=0, callbacks=[policy, OneSlowStep()])
    (times,) = policy.throughput_model.configurations().values()
    # 4 x 32 updates, one observation every 10 (12), the first dropped; the
    # epoch's first step is not timed
    assert len(times) == 11
    # an interval with the 0.5 s step in it: its mean is 50 ms above the others'
    slow = [t for t in times if t > np.median(times) + 0.03]
    assert 3 <= len(slow) <= 4
    # they pull the mean up by about 4 x 50 / 11 = 18 ms; the model fits the
    # median, one of the other intervals
    assert policy.throughput_model.statistic == "median"
    assert np.mean(times) - np.median(times) > 0.01
    assert np.median(times) < min(slow) - 0.03
    assert not policy.throughput_model.fit().usable  # one configuration
    # its own on_update_end still counts every update's samples (at the start batch: progress too)
    assert policy.progress.samples == 4 * 32 * 8 == policy.progress.progress


def test_config_round_trip_and_bad_arguments():
    policy = GoodputBatchSizePolicy(32, 512, min_efficiency=0.6, hysteresis=0.1, confidence=1.0,
                                    micro_batch_size=32)
    config = json.loads(json.dumps(policy.get_config()))
    assert GoodputBatchSizePolicy.from_config(config).get_config() == config
    for kwargs, match in (({"min_efficiency": 0}, "min_efficiency=0 is not valid"),
                          ({"min_efficiency": 1.5}, r"min_efficiency=1.5 is not valid; use a fraction"),
                          ({"hysteresis": -0.1}, "hysteresis=-0.1"),
                          ({"confidence": float("nan")}, "confidence=nan"),
                          ({"min_change_interval": -1}, "min_change_interval=-1")):
        with pytest.raises(ValueError, match=match):
            GoodputBatchSizePolicy(32, 512, **kwargs)
    with pytest.raises(TypeError, match="throughput_model=.* is not valid"):
        GoodputBatchSizePolicy(32, 512, throughput_model="fast")
