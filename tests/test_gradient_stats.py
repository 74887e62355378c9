"""GradientStatistics: the estimator math against hand-computed values."""

import math

import numpy as np
import pytest
import tensorflow as tf

from keras_adapt.monitors import GradientStatistics


def _feed(stats, pairs, m):
    for local, total in pairs:
        stats.update(tf.constant(local, tf.float32), tf.constant(total, tf.float32), m)


def test_single_update_matches_the_formulas():
    stats = GradientStatistics(ema_decay=0.9, batch_size=16)
    _feed(stats, [(10.0, 7.0)], m=4)
    r = stats.result()
    # |G|^2 = (M total - local)/(M-1) = (28-10)/3 = 6 ; tr S = b M (local-total)/(M-1) = 16*4*3/3 = 64
    assert r["grad_sqr"] == pytest.approx(6.0)
    assert r["grad_var"] == pytest.approx(64.0)
    assert r["gns"] == pytest.approx(64.0 / 6.0)
    assert r["batch_size"] == 64.0
    assert r["grad_snr"] == pytest.approx(64.0 / (64.0 / 6.0))
    assert r["updates"] == 1 and r["nonfinite"] == 0


def test_design_formulas_in_terms_of_global_and_local_batch():
    # docs/design.md#gradient-statistics:
    # |G|^2 = (B total - b local)/(B - b), S = (local - total)/(1/b - 1/B)
    b, m, local, total = 8, 3, 5.0, 2.0
    big = b * m
    stats = GradientStatistics(ema_decay=0.5, batch_size=b)
    _feed(stats, [(local, total)], m=m)
    r = stats.result()
    assert r["grad_sqr"] == pytest.approx((big * total - b * local) / (big - b))
    assert r["grad_var"] == pytest.approx((local - total) / (1 / b - 1 / big))


def test_bias_corrected_emas_and_ratio_of_averages():
    beta, b, m = 0.8, 4, 2
    stats = GradientStatistics(ema_decay=beta, batch_size=b)
    pairs = [(5.0, 4.0), (9.0, 5.0), (6.0, 5.5)]
    _feed(stats, pairs, m)
    ema_g = ema_s = 0.0
    for local, total in pairs:
        g = (m * total - local) / (m - 1)
        s = b * m * (local - total) / (m - 1)
        ema_g = beta * ema_g + (1 - beta) * g
        ema_s = beta * ema_s + (1 - beta) * s
    corr = 1 - beta ** len(pairs)
    r = stats.result()
    assert r["grad_sqr"] == pytest.approx(ema_g / corr, rel=1e-6)
    assert r["grad_var"] == pytest.approx(ema_s / corr, rel=1e-6)
    # the noise scale is the ratio of the averages, not an average of ratios
    assert r["gns"] == pytest.approx(ema_s / ema_g, rel=1e-6)


def test_non_finite_measurements_are_skipped_and_counted():
    stats = GradientStatistics(ema_decay=0.9, batch_size=4)
    _feed(stats, [(5.0, 4.0)], m=2)
    before = stats.result()
    for bad in [(math.nan, 1.0), (1.0, math.inf), (-math.inf, 0.0)]:
        used = stats.update(tf.constant(bad[0]), tf.constant(bad[1]), 2)
        assert not bool(used)
    after = stats.result()
    assert after["nonfinite"] == 3 and after["updates"] == 1
    assert after["gns"] == before["gns"] and after["grad_sqr"] == before["grad_sqr"]


def test_no_estimate_before_the_first_update_and_never_a_division_by_zero():
    stats = GradientStatistics(batch_size=4)
    r = stats.result()
    assert math.isnan(r["gns"]) and r["updates"] == 0
    # a single gradient (M = 1) carries no variance information: skipped, not divided
    assert not bool(stats.update(tf.constant(2.0), tf.constant(2.0), 1))
    assert stats.result()["updates"] == 0 and stats.result()["nonfinite"] == 0


def test_unknown_batch_size_skips_without_counting_as_nonfinite():
    stats = GradientStatistics()
    assert not bool(stats.update(tf.constant(2.0), tf.constant(1.0), 2))
    stats.record_batch_size(tf.constant(8))
    assert bool(stats.update(tf.constant(2.0), tf.constant(1.0), 2))
    r = stats.result()
    assert r["updates"] == 1 and r["nonfinite"] == 0 and r["batch_size"] == 16.0


def test_unresolved_signal_reports_infinite_noise_scale():
    stats = GradientStatistics(batch_size=4)
    _feed(stats, [(10.0, 1.0)], m=2)  # |G|^2 = (2 - 10) / 1 < 0
    r = stats.result()
    assert r["grad_sqr"] < 0 and r["gns"] == math.inf and r["grad_snr"] == 0.0


def test_updates_inside_a_tf_function():
    stats = GradientStatistics(ema_decay=0.5, batch_size=2)

    @tf.function
    def step(local, total):
        return stats.update(local, total, 2)

    for _ in range(3):
        step(tf.constant(5.0), tf.constant(4.0))
    r = stats.result()
    assert r["updates"] == 3
    assert r["grad_sqr"] == pytest.approx(3.0) and r["grad_var"] == pytest.approx(4.0)


def test_the_raw_averages_hold_each_entry_and_assign_by_name():
    beta, b = 0.5, 4
    stats = GradientStatistics(ema_decay=beta, batch_size=b, interval=3)
    _feed(stats, [(5.0, 4.0), (9.0, 5.0)], 2)
    stats.update(tf.constant(math.nan), tf.constant(1.0), 2)
    g = [(2 * 4.0 - 5.0), (2 * 5.0 - 9.0)]            # |G|^2 of each update
    s = [b * 2 * (5.0 - 4.0), b * 2 * (9.0 - 5.0)]    # tr(Sigma) of each
    w = beta ** 3                                     # one measurement stands for 3 updates
    raw = stats.read_averages()
    assert raw["ema_grad_sqr"] == pytest.approx((w * (1 - w) * g[0] + (1 - w) * g[1]))
    assert raw["ema_grad_var"] == pytest.approx((w * (1 - w) * s[0] + (1 - w) * s[1]))
    assert raw["ema_weight"] == pytest.approx(1 - w ** 2)
    assert raw["ema_global_batch"] == pytest.approx((1 - w ** 2) * 2 * b)
    assert (raw["global_batch"], raw["updates"], raw["covered_updates"], raw["nonfinite"]) == (
        8.0, 2.0, 6.0, 1.0)

    stats.assign_averages(ema_grad_var=raw["ema_grad_var"] * 2)
    again = stats.read_averages()
    assert again == {**raw, "ema_grad_var": raw["ema_grad_var"] * 2}
    with pytest.raises(ValueError, match=r"unknown entries \['ema_grad_sq'\]; the entries are"):
        stats.assign_averages(ema_grad_sq=1.0)


def test_reset_forgets_everything():
    stats = GradientStatistics(batch_size=2)
    _feed(stats, [(5.0, 4.0)], 2)
    stats.reset()
    assert stats.result()["updates"] == 0 and math.isnan(stats.result()["gns"])


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.9", True, None])
def test_bad_ema_decay(bad):
    with pytest.raises(ValueError, match="ema_decay"):
        GradientStatistics(ema_decay=bad)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "32", True])
def test_bad_batch_size(bad):
    with pytest.raises(ValueError, match="batch_size"):
        GradientStatistics(batch_size=bad)


def test_unequal_sizes_use_the_mean_inverse_batch():
    # One worker pairing g1 (b1 = 64) with g2 (b2 = 5): |G|^2 = g1.g2 and
    # tr S = |g1 - g2|^2 / (1/b1 + 1/b2), from hand-made vectors.
    g1, g2, b1, b2 = np.array([3.0, 1.0, -2.0]), np.array([1.0, 2.0, 0.5]), 64, 5
    local = 0.5 * (g1 @ g1 + g2 @ g2)
    total = ((g1 + g2) / 2) @ ((g1 + g2) / 2)
    stats = GradientStatistics(ema_decay=0.5)
    stats.update(tf.constant(local, tf.float32), tf.constant(total, tf.float32), 2,
                 inv_batch=0.5 * (1 / b1 + 1 / b2), global_batch=b2)
    r = stats.result()
    assert r["grad_sqr"] == pytest.approx(g1 @ g2, rel=1e-6)
    assert r["grad_var"] == pytest.approx((g1 - g2) @ (g1 - g2) / (1 / b1 + 1 / b2), rel=1e-6)
    assert r["batch_size"] == b2


def test_unequal_sizes_are_unbiased_in_expectation():
    # Independent Gaussian micro-gradients of sizes 64, 5, 9: E g_m = G and
    # Cov g_m = Sigma / b_m. Both estimates are linear in (local, total), so
    # the mean estimate over many draws is the estimate of the mean draw:
    # one update with the Monte Carlo means must give |G|^2 and tr(Sigma).
    rng = np.random.default_rng(0)
    dim, sizes, draws = 6, np.array([64, 5, 9]), 200_000
    G = rng.standard_normal(dim)
    sd = np.sqrt(np.linspace(0.5, 3.0, dim))  # diagonal Sigma, tr = sum sd^2
    g = G + rng.standard_normal((draws, len(sizes), dim)) * sd / np.sqrt(sizes)[None, :, None]
    local = np.mean(np.sum(g**2, axis=2))
    total = np.mean(np.sum(np.mean(g, axis=1) ** 2, axis=1))
    stats = GradientStatistics(ema_decay=0.5)
    stats.update(tf.constant(local), tf.constant(total), len(sizes), inv_batch=np.mean(1 / sizes))
    r = stats.result()
    assert r["grad_sqr"] == pytest.approx(G @ G, rel=0.02)
    assert r["grad_var"] == pytest.approx(np.sum(sd**2), rel=0.02)
    # a single batch size (the largest or the smallest) would be far off
    for b in (64, 5):
        wrong = GradientStatistics(ema_decay=0.5, batch_size=b)
        wrong.update(tf.constant(local), tf.constant(total), len(sizes))
        assert abs(wrong.result()["grad_var"] / np.sum(sd**2) - 1) > 0.3


def test_snr_uses_the_average_batch_of_the_measured_updates():
    beta = 0.9
    stats = GradientStatistics(ema_decay=beta, batch_size=32)
    batches = [64, 64, 64, 10]
    for b in batches:
        stats.update(tf.constant(5.0), tf.constant(4.0), 2, global_batch=b)
    r = stats.result()
    ema = 0.0
    for b in batches:
        ema = beta * ema + (1 - beta) * b
    ema /= 1 - beta ** len(batches)
    assert r["batch_size"] == 10.0 and r["snr_batch_size"] == pytest.approx(ema)
    assert r["grad_snr"] == pytest.approx(ema / r["gns"])


def test_interval_decides_which_updates_are_measured():
    stats = GradientStatistics(interval=3)
    assert [bool(stats.due(i)) for i in range(7)] == [True, False, False, True, False, False, True]
    stats.set_interval(2)
    assert [bool(stats.due(i)) for i in range(4)] == [True, False, True, False]
    with pytest.raises(ValueError, match="stats_interval=0 is not valid"):
        stats.set_interval(0)
    with pytest.raises(ValueError, match="stats_interval=1.5"):
        GradientStatistics(interval=1.5)


def test_averages_decay_per_update_so_the_interval_changes_weights_not_horizon():
    # Measuring one update in N, a measurement enters with weight 1 - d^N
    # (it stands for N updates); the bias correction is kept the same way,
    # so changing N in the middle is exact too. Truth in numpy.
    d = 0.9
    stats = GradientStatistics(ema_decay=d, batch_size=8, interval=4)
    # M = 2: |G|^2 = 2 * total - local
    measurements = [((5.0, 4.0), 4), ((10.0, 6.0), 4), ((7.0, 7.0), 2)]
    ema = weight = 0.0
    for (local, total), n in measurements:
        stats.set_interval(n)
        stats.update(tf.constant(local), tf.constant(total), num_gradients=2)
        beta = d ** n
        ema = beta * ema + (1 - beta) * (2 * total - local)
        weight = beta * weight + (1 - beta)
    r = stats.result()
    assert r["updates"] == 3 and r["covered_updates"] == 10
    assert r["grad_sqr"] == pytest.approx(ema / weight, rel=1e-12)
    # the same three measurements at interval 1 weigh the last one less
    every = GradientStatistics(ema_decay=d, batch_size=8)
    for (local, total), _ in measurements:
        every.update(tf.constant(local), tf.constant(total), num_gradients=2)
    assert every.result()["grad_sqr"] == pytest.approx(
        (d * d * 0.1 * 3 + d * 0.1 * 2 + 0.1 * 7) / (1 - d ** 3), rel=1e-12)
    assert every.result()["covered_updates"] == 3
