"""ThroughputModel: parameters, held-out MAPE, refusal, prediction, input checks.

Pure numpy: runs on both stacks and needs neither Horovod nor TensorFlow.
"""

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

from keras_adapt.formulas.throughput import TERMS, ThroughputModel, design_row

TRUE = dict(per_sample=40e-6, per_micro_step=2e-3, per_update=3e-3, sync_bandwidth=8e-3,
            sync_latency=0.5e-3, interference_per_micro_step=1e-3, interference_per_sample=8e-6)
THETA = np.array([TRUE[t] for t in TERMS])
BATCHES = (16, 32, 64, 128, 256)


def true_time(b, n=1, k=1):
    """The step time TRUE gives, computed term by term (not through design_row)."""
    others = (n - 1) / n
    return (k * (TRUE["per_micro_step"] + TRUE["per_sample"] * b) + TRUE["per_update"]
            + TRUE["sync_bandwidth"] * others + TRUE["sync_latency"] * (n - 1)
            + k * others * (TRUE["interference_per_micro_step"] + TRUE["interference_per_sample"] * b))


def feed(model, configs, time_of, noise, count, rng):
    for b, n, k in configs:
        for _ in range(count):
            jitter = noise * rng.standard_normal() if noise else 0.0
            model.observe(b, time_of(b, n, k) * (1.0 + jitter), workers=n, accumulation=k)


GRID = list(itertools.product(BATCHES, (1, 2, 4, 8), (1, 2, 4)))


def test_design_row_matches_the_model_term_by_term():
    for b, n, k in [(16, 1, 1), (64, 2, 4), (256, 8, 2), (1, 3, 3)]:
        assert float(np.dot(design_row(b, n, k), THETA)) == pytest.approx(true_time(b, n, k),
                                                                           rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_known_parameters_within_one_percent(seed):
    # 1% timing noise per update, 256 updates per configuration, 60 configurations
    rng = np.random.default_rng(seed)
    model = ThroughputModel(warmup=0)
    feed(model, GRID, true_time, 0.01, 256, rng)
    fit = model.fit()
    assert fit.usable, fit.reason
    assert fit.identified == TERMS
    assert fit.num_configurations == 60 and fit.num_observations == 60 * 256
    for term in TERMS:
        assert fit.params[term] == pytest.approx(TRUE[term], rel=0.01), term
    # the model's form is right, so only noise is left: held-out error ~ 1%/sqrt(256)
    assert fit.mape < 0.1 and fit.constant_mape > 50


def test_standard_errors_cover_the_true_parameters():
    # 5% noise and few updates: the estimates move, and their standard errors say by how much
    rng = np.random.default_rng(7)
    model = ThroughputModel(warmup=0)
    feed(model, GRID, true_time, 0.05, 20, rng)
    fit = model.fit()
    z = [(fit.params[t] - TRUE[t]) / fit.stderr[t] for t in TERMS]
    assert all(abs(v) < 4 for v in z), z
    assert max(abs(v) for v in z) > 0.1  # they are not exact: the noise is there
    # a prediction's std comes from the same covariance
    p = fit.predict_step_time(100, workers=3, accumulation=3)
    assert abs(p.value - true_time(100, 3, 3)) < 4 * p.std


def _loco_by_hand(configs, times, columns=7):
    """Leave-one-configuration-out MAPE (percent) of the model made of the
    first ``columns`` terms and of the constant model, computed directly:
    every term is identified in these grids."""
    x = np.array([[k * b, k, 1.0, (n - 1) / n, n - 1.0, k * (n - 1) / n, k * b * (n - 1) / n]
                  for b, n, k in configs])[:, :columns]
    model_err, const_err = [], []
    for i in range(len(configs)):
        keep = np.arange(len(configs)) != i
        a = x[keep] / times[keep, None]
        theta = np.linalg.solve(a.T @ a, a.T @ np.ones(keep.sum()))  # normal equations
        model_err.append(abs(x[i] @ theta - times[i]) / times[i])
        const_err.append(abs(times[keep].mean() - times[i]) / times[i])
    return 100 * np.mean(model_err), 100 * np.mean(const_err)


@pytest.mark.parametrize("interference", [True, False])
def test_heldout_mape_matches_an_independent_computation(interference):
    # the truth has a term the model lacks (cache effects at large batches),
    # so the held-out errors are real and different per configuration
    configs = list(itertools.product(BATCHES, (1, 2, 3), (1, 2)))
    rng = np.random.default_rng(3)
    model = ThroughputModel(warmup=0, min_observations=5)

    def truth(b, n, k):
        extra = 0.0 if interference else k * (n - 1) / n * (
            TRUE["interference_per_micro_step"] + TRUE["interference_per_sample"] * b)
        return true_time(b, n, k) - extra + 2e-8 * k * b * b

    feed(model, configs, truth, 0.02, 5, rng)
    fit = model.fit()
    kept = model.configurations()
    times = np.array([np.mean(kept[c]) for c in configs])
    full_mape, const_mape = _loco_by_hand(configs, times)
    base_mape, _ = _loco_by_hand(configs, times, columns=5)
    assert fit.model_mapes == pytest.approx({"base": base_mape, "interference": full_mape},
                                            rel=1e-9)
    # the candidate with the lower held-out error is kept
    assert fit.model == ("interference" if interference else "base")
    assert (full_mape < base_mape) == interference
    assert fit.heldout == len(configs)
    assert fit.mape == pytest.approx(min(full_mape, base_mape), rel=1e-9)
    assert fit.constant_mape == pytest.approx(const_mape, rel=1e-9)
    assert 0.2 < fit.mape < 10  # a real, nonzero error
    assert fit.identified == (TERMS if interference else TERMS[:5])
    # in-sample MAPE: this fit's own relative residuals
    predicted = np.array([fit.predict_step_time(*c).value for c in configs])
    assert fit.train_mape == pytest.approx(100 * np.mean(np.abs(predicted - times) / times), rel=1e-9)
    assert fit.train_mape < fit.mape


def test_median_statistic_ignores_odd_slow_updates():
    rng = np.random.default_rng(4)
    configs = list(itertools.product(BATCHES, (1, 2), (1,)))
    mean_model, median_model = ThroughputModel(warmup=0), ThroughputModel(warmup=0, statistic="median")
    for b, n, k in configs:
        for i in range(21):
            t = true_time(b, n, k) * (1 + 0.002 * rng.standard_normal())
            if i % 7 == 3:
                t *= 5  # an update with an evaluation in it
            mean_model.observe(b, t, workers=n)
            median_model.observe(b, t, workers=n)
    assert median_model.fit().params["per_sample"] == pytest.approx(TRUE["per_sample"], rel=0.01)
    assert mean_model.fit().params["per_sample"] > 1.5 * TRUE["per_sample"]


@pytest.mark.parametrize("seed", range(10))
def test_refuses_a_fit_that_does_not_beat_a_constant(seed):
    # step times that do not depend on the configuration: pure noise around 10 ms
    rng = np.random.default_rng(seed)
    model = ThroughputModel(warmup=0)
    feed(model, list(itertools.product(BATCHES, (1, 2), (1, 2))), lambda *c: 0.010, 0.05, 10, rng)
    fit = model.fit()
    assert not fit.usable
    assert fit.mape > 0.5 * fit.constant_mape
    assert f"held-out MAPE {fit.mape:.2f}% does not beat the constant model's " \
           f"{fit.constant_mape:.2f}% (it must be at most 0.5 of it)" in fit.reason
    with pytest.raises(RuntimeError, match="not usable: held-out MAPE"):
        model.predict_step_time(64, workers=2)
    with pytest.raises(RuntimeError, match="not usable"):
        model.predict_throughput(64)


def test_predicts_an_untried_configuration():
    # observed: micro-batches 16..256 x workers 1, 2, 4 x accumulation 1, 2
    rng = np.random.default_rng(5)
    model = ThroughputModel(warmup=0)
    feed(model, list(itertools.product(BATCHES, (1, 2, 4), (1, 2))), true_time, 0.03, 30, rng)
    for b, n, k in [(96, 3, 3), (48, 2, 4), (512, 1, 1)]:  # never observed
        p = model.predict_step_time(b, workers=n, accumulation=k)
        assert p.determined
        assert p.value == pytest.approx(true_time(b, n, k), rel=0.02)
        thr = model.predict_throughput(b, workers=n, accumulation=k)
        assert thr.value == pytest.approx(n * k * b / p.value, rel=1e-12)
        assert thr.relative_std == pytest.approx(p.relative_std, rel=1e-12)


def test_says_when_the_observations_do_not_determine_a_prediction():
    rng = np.random.default_rng(6)
    model = ThroughputModel(warmup=0)
    feed(model, [(b, n, 1) for b in BATCHES for n in (1, 2)], true_time, 0.01, 20, rng)
    fit = model.fit()
    # k = 1 only: micro-step and update fixed costs are one; bandwidth and latency too
    assert fit.identified == ("per_sample", "per_micro_step", "sync_bandwidth",
                              "interference_per_sample")
    assert fit.stderr["per_update"] is None and fit.params["per_update"] == 0.0
    assert model.predict_step_time(100, workers=2).determined
    guess = model.predict_step_time(100, workers=1, accumulation=2)
    assert not guess.determined
    # the joint fixed cost is charged per micro-step: a conservative guess
    assert guess.value > true_time(100, 1, 2)

    single = ThroughputModel(warmup=0)
    feed(single, [(b, 1, 1) for b in BATCHES], true_time, 0.01, 5, rng)
    assert single.fit().usable
    with pytest.raises(ValueError, match="workers=2: no multi-worker configuration was observed"):
        single.predict_step_time(32, workers=2)


def test_refuses_to_extrapolate_to_a_non_positive_time():
    model = ThroughputModel(warmup=0, min_observations=1)
    for b in (32, 64, 128, 256):  # a negative intercept: fine here, not at b = 8
        model.observe(b, -0.001 + 1e-4 * b)
    assert model.predict_step_time(16).value == pytest.approx(0.0006)
    with pytest.raises(ValueError, match=r"batch_size=8, workers=1, accumulation=1: the fit "
                                         r"predicts a step time of -0.0002 s"):
        model.predict_throughput(8)


def test_needs_p_plus_two_configurations():
    model = ThroughputModel(warmup=0)
    for b in (16, 32, 64):  # p = 2 (per sample, per micro-step): 4 are needed
        feed(model, [(b, 1, 1)], true_time, 0.0, 3, None)
        fit = model.fit()
        assert not fit.usable and fit.params is None
    assert fit.reason == "3 configuration(s) observed; 4 are needed for the 2 term(s) they " \
                         "identify (p to fit, one residual, one to leave out)"
    feed(model, [(128, 1, 1)], true_time, 0.0, 2, None)  # only 2 of the 3 needed observations
    assert model.fit().num_configurations == 3
    feed(model, [(128, 1, 1)], true_time, 0.0, 1, None)
    fit = model.fit()
    assert fit.usable and fit.num_configurations == 4 and fit.heldout == 4
    assert fit.params["per_sample"] == pytest.approx(TRUE["per_sample"], rel=1e-9)


def test_with_repeats_two_or_three_configurations_are_fitted():
    model = ThroughputModel(warmup=0, repeats=True)
    feed(model, [(16, 1, 1)], true_time, 0.0, 3, None)
    fit = model.fit()
    assert not fit.usable and fit.params is None
    assert fit.reason == "1 configuration(s) observed; 3 are needed for the 1 term(s) they " \
                         "identify (p to fit, one residual, one to leave out)"
    for b in (32, 64):  # p = 2 (per sample, per micro-step): 2 and 3 are fitted from repeats
        feed(model, [(b, 1, 1)], true_time, 0.0, 3, None)
        fit = model.fit()
        assert fit.usable and fit.evidence == "repeats" and fit.heldout == 0
        assert math.isnan(fit.mape)
        assert fit.params["per_sample"] == pytest.approx(TRUE["per_sample"], rel=1e-9)
    feed(model, [(128, 1, 1)], true_time, 0.0, 2, None)  # only 2 of the 3 needed observations
    assert model.fit().num_configurations == 3
    feed(model, [(128, 1, 1)], true_time, 0.0, 1, None)
    fit = model.fit()
    assert fit.usable and fit.num_configurations == 4 and fit.heldout == 4
    assert fit.evidence == "held-out"
    assert fit.params["per_sample"] == pytest.approx(TRUE["per_sample"], rel=1e-9)


def test_two_configurations_fit_from_their_repeats_by_hand():
    model = ThroughputModel(warmup=0, repeats=True)
    for t in (0.0130, 0.0134, 0.0132):  # mean 0.0132, sd 0.0002: se 0.0002/sqrt(3)
        model.observe(32, t)
    for t in (0.0160, 0.0166, 0.0163):  # mean 0.0163, sd 0.0003: se 0.0003/sqrt(3)
        model.observe(64, t)
    fit = model.fit()
    assert fit.usable and fit.evidence == "repeats", fit.reason
    # two configurations, two terms: the line through the two means
    assert fit.params["per_sample"] == pytest.approx(0.0031 / 32, rel=1e-9)
    assert fit.params["per_micro_step"] == pytest.approx(0.0132 - 32 * 0.0031 / 32, rel=1e-9)
    var1, var2 = 0.0002 ** 2 / 3, 0.0003 ** 2 / 3
    assert fit.stderr["per_sample"] == pytest.approx(math.sqrt(var1 + var2) / 32, rel=1e-6)
    # T(128) = -2 T(32) + 3 T(64): value 0.0225, variance 4 var1 + 9 var2
    p = fit.predict_step_time(128)
    assert p.value == pytest.approx(0.0225, rel=1e-9) and p.determined
    assert p.std == pytest.approx(math.sqrt(4 * var1 + 9 * var2), rel=1e-6)
    # differ from a constant by |0.0163 - 0.0132| / sqrt(var1 + var2) = 14.89 standard errors
    assert "14.9 standard errors" in fit.reason
    assert fit.train_mape == pytest.approx(0.0, abs=1e-9)

    same = ThroughputModel(warmup=0, repeats=True)
    for b, times in ((32, (0.0130, 0.0134, 0.0132)), (64, (0.0131, 0.0135, 0.0133))):
        for t in times:
            same.observe(b, t)
    fit = same.fit()  # 0.0001 apart, se 0.0002/sqrt(3) each: 0.61 standard errors
    assert not fit.usable and fit.evidence == "repeats"
    assert "differ from a constant by 0.61 standard errors, fewer than 4" in fit.reason
    with pytest.raises(RuntimeError, match="not usable"):
        same.predict_step_time(128)

    median = ThroughputModel(warmup=0, statistic="median", repeats=True)
    for b, times in ((32, (0.0130, 0.0134, 0.0132)), (64, (0.0160, 0.0166, 0.0163))):
        for t in times:
            median.observe(b, t)
    fit = median.fit()  # the median's standard error is sqrt(pi/2) times the mean's
    assert fit.stderr["per_sample"] == pytest.approx(
        math.sqrt(math.pi / 2.0 * (var1 + var2)) / 32, rel=1e-6)


def test_a_floor_on_the_relative_error_replaces_a_smaller_scatter():
    # The hand-worked two-configuration fit of the test above, with each
    # visit good to 10% at best: se 1.32 ms and 1.63 ms (the floor; the
    # repeats' 0.12 and 0.17 ms are smaller), so T(128) = -2 T(32) + 3 T(64)
    # has variance 4 x 1.32^2 + 9 x 1.63^2 (ms^2), and the two means differ
    # by 3.1 / sqrt(1.32^2 + 1.63^2) = 1.48 standard errors: not usable, but
    # fitted, with the same line.
    model = ThroughputModel(warmup=0, repeats=True, min_relative_error=0.1)
    for b, times in ((32, (0.0130, 0.0134, 0.0132)), (64, (0.0160, 0.0166, 0.0163))):
        for t in times:
            model.observe(b, t)
    fit = model.fit()
    assert not fit.usable and fit.fitted and fit.evidence == "repeats"
    assert "differ from a constant by 1.48 standard errors, fewer than 4" in fit.reason
    se32, se64 = 0.1 * 0.0132, 0.1 * 0.0163
    assert fit.params["per_sample"] == pytest.approx(0.0031 / 32, rel=1e-9)
    assert fit.stderr["per_sample"] == pytest.approx(math.hypot(se32, se64) / 32, rel=1e-9)
    p = fit.predict_step_time(128, tentative=True)
    assert p.value == pytest.approx(0.0225, rel=1e-9)
    assert p.std == pytest.approx(math.sqrt(4 * se32 ** 2 + 9 * se64 ** 2), rel=1e-9)
    # a scatter above the floor is kept: 30% noise, floor 10%
    wide = ThroughputModel(warmup=0, repeats=True, min_relative_error=0.1)
    scatter = {32: (0.008, 0.013, 0.018), 64: (0.010, 0.016, 0.022)}  # sd 5 and 6 ms
    for b, times in scatter.items():
        for t in times:
            wide.observe(b, t)
    se = [0.005 / math.sqrt(3), 0.006 / math.sqrt(3)]
    assert wide.fit().stderr["per_sample"] == pytest.approx(math.hypot(*se) / 32, rel=1e-9)
    # a held-out fit (4 configurations on an exact line: zero residuals)
    # takes the residuals' relative variance as 0.1^2: the covariance of the
    # fit on relative rows [b/T, 1/T] is 0.01 (A'A)^-1; MAPE and usability
    # do not change
    batches = np.array([16.0, 32.0, 64.0, 128.0])
    times = 0.002 + 1e-4 * batches
    fits = []
    for floor in (0.0, 0.1):
        model = ThroughputModel(warmup=0, min_observations=1, min_relative_error=floor)
        for b, t in zip(batches, times):
            model.observe(int(b), float(t))
        fits.append(model.fit())
    assert fits[0].stderr["per_sample"] == pytest.approx(0.0, abs=1e-12)
    a = np.stack([batches / times, 1.0 / times], axis=1)
    se = 0.1 * np.sqrt(np.diag(np.linalg.inv(a.T @ a)))
    assert fits[1].stderr["per_sample"] == pytest.approx(se[0], rel=1e-9)
    assert fits[1].stderr["per_micro_step"] == pytest.approx(se[1], rel=1e-9)
    assert fits[1].usable and fits[1].mape == fits[0].mape and fits[1].params == fits[0].params
    x = np.array([256.0, 1.0])
    p = fits[1].predict_step_time(256)
    assert p.std == pytest.approx(np.sqrt(x @ (0.01 * np.linalg.inv(a.T @ a)) @ x), rel=1e-9)


def test_repeats_fit_refuses_what_it_cannot_judge():
    one = ThroughputModel(warmup=0, min_observations=1, repeats=True)
    one.observe(32, 0.013)
    one.observe(64, 0.016)
    fit = one.fit()  # no scatter to judge by
    assert not fit.usable and "a configuration has a single observation" in fit.reason
    bent = ThroughputModel(warmup=0, repeats=True)
    for b, mean in ((32, 0.0132), (64, 0.0163), (128, 0.0132)):  # not a line
        for d in (-0.0002, 0.0, 0.0002):
            bent.observe(b, mean + d)
    fit = bent.fit()
    assert not fit.usable and fit.evidence == "repeats"
    assert "chi-square" in fit.reason and "not at most 0.25 of the constant" in fit.reason


def test_warmup_is_dropped_on_every_visit_and_the_window_is_bounded():
    model = ThroughputModel(warmup=2, window=4, min_observations=1)
    kept = [model.observe(32, t) for t in (9.0, 8.0, 1.0, 1.1)]
    assert kept == [False, False, True, True]
    kept = [model.observe(64, t) for t in (9.0, 8.0, 2.0)]
    assert kept == [False, False, True]
    kept = [model.observe(32, t, workers=1) for t in (7.0, 6.0, 1.2, 1.3, 1.4)]
    assert kept == [False, False, True, True, True]
    assert model.configurations() == {(32, 1, 1): [1.1, 1.2, 1.3, 1.4], (64, 1, 1): [2.0]}
    # the fit is cached until the next observation, and recomputed after it
    fit = model.fit()
    assert model.fit() is fit
    model.observe(32, 1.5)
    assert model.fit() is not fit
    model.reset()
    assert model.configurations() == {} and model.observe(32, 1.0) is False


def test_the_fit_depends_on_the_observations_not_their_interleaving():
    rng = np.random.default_rng(8)
    series = {c: list(true_time(*c) * (1 + 0.03 * rng.standard_normal(12)))
              for c in itertools.product(BATCHES, (1, 2), (1, 2))}
    a, b = ThroughputModel(warmup=1), ThroughputModel(warmup=1)
    for c in sorted(series):
        for t in series[c]:
            a.observe(c[0], t, workers=c[1], accumulation=c[2])
    for c in sorted(series, reverse=True):
        for t in series[c]:
            b.observe(c[0], t, workers=c[1], accumulation=c[2])
    assert a.fit().params == b.fit().params and a.fit().mape == b.fit().mape


@pytest.mark.parametrize("call,message", [
    (lambda m: m.observe(0, 0.1), "batch_size=0 is not valid; pass the per-worker micro-batch"),
    (lambda m: m.observe(32.5, 0.1), "batch_size=32.5 is not valid"),
    (lambda m: m.observe(True, 0.1), "batch_size=True is not valid"),
    (lambda m: m.observe(32, 0.0), "step_time=0.0 is not valid; pass the measured seconds"),
    (lambda m: m.observe(32, -1.0), "step_time=-1.0 is not valid"),
    (lambda m: m.observe(32, math.nan), "step_time=nan is not valid"),
    (lambda m: m.observe(32, math.inf), "step_time=inf is not valid"),
    (lambda m: m.observe(32, "0.1"), "step_time='0.1' is not valid"),
    (lambda m: m.observe(32, 0.1, workers=0), "workers=0 is not valid; pass the worker count"),
    (lambda m: m.observe(32, 0.1, accumulation=-2), "accumulation=-2 is not valid; pass the micro"),
    (lambda m: m.predict_step_time(32, workers=1.5), "workers=1.5 is not valid"),
    (lambda m: ThroughputModel(warmup=-1), "warmup=-1 is not valid; use an int >= 0"),
    (lambda m: ThroughputModel(window=0), "window=0 is not valid; use an int >= 1"),
    (lambda m: ThroughputModel(min_observations=0), "min_observations=0 is not valid"),
    (lambda m: ThroughputModel(window=4, min_observations=5),
     "min_observations=5 exceeds window=4; .* lower min_observations or raise window"),
    (lambda m: ThroughputModel(statistic="mode"), "statistic='mode' is not valid; use 'mean' or"),
    (lambda m: ThroughputModel(repeats=1), "repeats=1 is not valid; use True or False"),
    (lambda m: ThroughputModel(min_relative_error=1.0),
     r"min_relative_error=1.0 is not valid; .* \[0, 1\), e.g. 0.1 for 10%"),
    (lambda m: ThroughputModel(min_relative_error=-0.1), "min_relative_error=-0.1 is not valid"),
    (lambda m: ThroughputModel(min_relative_error=math.nan), "min_relative_error=nan is not valid"),
    (lambda m: ThroughputModel(min_relative_error="10%"), "min_relative_error='10%' is not valid"),
])
def test_bad_input_is_refused_with_the_value_and_the_fix(call, message):
    model = ThroughputModel()
    with pytest.raises(ValueError, match=message):
        call(model)
    assert model.configurations() == {}  # nothing half-recorded


def test_numpy_integers_and_floats_are_accepted():
    model = ThroughputModel(warmup=0, min_observations=1)
    assert model.observe(np.int64(32), np.float32(0.01), workers=np.int32(2))
    assert model.configurations() == {(32, 2, 1): [pytest.approx(0.01)]}


def test_imports_without_tensorflow():
    code = ("import sys; from keras_adapt.formulas.throughput import ThroughputModel; "
            "m = ThroughputModel(); m.observe(8, 0.1); m.fit(); "
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False"]


def test_a_run_at_one_multi_worker_count_predicts_that_count_only():
    # Every observation at N = 2: the synchronisation cost is a fixed cost of the
    # fit, so N = 2 is determined; N = 4 is not (raises), N = 1 is flagged.
    model = ThroughputModel(warmup=0, min_observations=1)
    for b in (16, 32, 64, 128):
        model.observe(b, 0.002 + 1e-4 * b + 0.003, workers=2)
    fit = model.fit()
    assert fit.usable and not any(t.startswith("sync") for t in fit.identified)
    at_two = fit.predict_step_time(96, workers=2)
    assert at_two.determined and at_two.value == pytest.approx(0.002 + 96e-4 + 0.003)
    with pytest.raises(ValueError, match="workers=4: .* all observed ones ran at one worker count"):
        fit.predict_step_time(32, workers=4)
    assert not fit.predict_step_time(32, workers=1).determined


def test_fit_reusing_its_rank_structure_equals_a_fresh_fit():
    """A model keeps the rows' rank structure between fits and renews it
    when a configuration enters (or leaves, after reset): at every point its
    fit must be the fit a fresh model makes of the same observations."""
    rng = np.random.default_rng(7)
    configs = [(16, 1, 1), (32, 1, 1), (64, 2, 1), (16, 2, 2), (128, 2, 1), (32, 1, 4)]
    model = ThroughputModel(warmup=0, statistic="median", repeats=True, min_relative_error=0.1)
    seen, compared, usable, structures = [], 0, 0, set()
    for i in range(90):
        b, n, k = configs[min(i // 12, len(configs) - 1) if i % 5 else rng.integers(len(configs))]
        t = float(true_time(b, n, k) * rng.uniform(0.95, 1.05))
        model.observe(b, t, workers=n, accumulation=k)
        seen.append((b, t, n, k))
        if i % 3:
            continue
        fresh = ThroughputModel(warmup=0, statistic="median", repeats=True, min_relative_error=0.1)
        for b_, t_, n_, k_ in seen:
            fresh.observe(b_, t_, workers=n_, accumulation=k_)
        got, want = model.fit(), fresh.fit()
        structures.add(got.num_configurations)
        assert (got.usable, got.reason, got.params, got.stderr, got.model) == \
            (want.usable, want.reason, want.params, want.stderr, want.model)
        assert got.mape == want.mape or (math.isnan(got.mape) and math.isnan(want.mape))
        compared += 1
        usable += got.usable
    assert compared == 30 and usable >= 10 and len(structures) >= 4
    # After reset() fewer configurations: the structure follows them.
    model.reset()
    small = ThroughputModel(warmup=0, statistic="median", repeats=True, min_relative_error=0.1)
    for b_, t_, n_, k_ in seen[:30]:
        model.observe(b_, t_, workers=n_, accumulation=k_)
        small.observe(b_, t_, workers=n_, accumulation=k_)
    assert model.fit().num_configurations < len(structures) + 2
    assert (model.fit().reason, model.fit().params) == (small.fit().reason, small.fit().params)
