import math

import numpy as np
import pytest
from scipy import stats

from autoscout_optuna.fidelity import measure_error
from autoscout_optuna.fidelity._error import kendall_tau, relative_error_bound, spearman_rho


@pytest.mark.parametrize("seed", range(5))
def test_rank_correlations_match_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, size=25).astype(float)  # many ties
    y = x + rng.normal(0, 2, size=25)
    assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)
    assert spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_perfect_reversed_and_constant_estimates():
    real = np.arange(1.0, 11.0)
    assert measure_error(2 * real + 5, real, window=10).discordance == pytest.approx(0.0)
    assert measure_error(-real, real, window=10).discordance == pytest.approx(1.0)
    constant = measure_error(np.ones(10), real, window=10)
    assert constant.discordance == 0.5 and constant.kendall_tau is None


def test_only_the_recent_window_counts():
    real = np.arange(1.0, 31.0)
    estimates = np.concatenate([-real[:20], real[20:]])  # wrong for 20 trials, then right
    assert measure_error(estimates, real, window=10).discordance == pytest.approx(0.0)
    assert measure_error(estimates, real, window=30).discordance > 0.4


def test_relative_error_and_non_finite_pairs():
    error = measure_error([1.1, 2.2, math.nan, 4.4], [1.0, 2.0, 3.0, 4.0], window=10)
    assert error.n_pairs == 3
    assert error.raw_relative_error == pytest.approx(0.1)
    assert error.relative_error == pytest.approx(0.0)  # a constant factor is calibrated away
    assert error.scale == pytest.approx(1 / 1.1)
    noisy = measure_error([1.0, 2.4, 2.7, 4.0], [1.0, 2.0, 3.0, 4.0], window=10)
    assert noisy.relative_error == pytest.approx(0.05)  # median of 0, 0.2, 0.1, 0
    assert measure_error([], [], window=5).discordance is None


def test_window_must_hold_a_pair():
    with pytest.raises(ValueError, match="window"):
        measure_error([1.0], [1.0], window=1)


def test_near_ties_are_not_rank_errors():
    real = np.array([10.0, 10.1, 10.2, 20.0])
    estimates = np.array([10.2, 10.1, 10.0, 20.0])  # ties misordered, the real gap kept
    assert measure_error(estimates, real, window=10).discordance == pytest.approx(0.0)
    assert measure_error(estimates, real, window=10, rank_tolerance=0.0).discordance > 0.4


def test_relative_error_bound_is_an_order_statistic_that_narrows_with_pairs():
    real = np.ones(5)
    errors = np.array([0.4, 0.0, 0.1, 0.2, 0.3])  # calibration factor 1: the median ratio is 1
    estimates = real * (1 + errors * np.array([1, 1, -1, 1, -1]))
    # Five pairs at 90%: only their largest error bounds the median (P(Bin(5, 1/2) <= 4) =
    # 0.97); at 80% the fourth largest does (P(Bin(5, 1/2) <= 3) = 0.81).
    assert relative_error_bound(estimates, real, confidence=0.9) == pytest.approx(0.4)
    assert relative_error_bound(estimates, real, confidence=0.8) == pytest.approx(0.3)
    assert relative_error_bound(estimates[:3], real[:3], confidence=0.9) == math.inf
    assert relative_error_bound([], [], confidence=0.9) is None
    error = measure_error(estimates, real, window=10, confidence=0.9)
    assert error.relative_error == pytest.approx(0.2)
    assert error.relative_error_bound == pytest.approx(0.4)
    assert measure_error(estimates, real, window=10).relative_error_bound is None


@pytest.mark.parametrize("n", [5, 12, 40])
def test_relative_error_bound_covers_the_true_median_as_often_as_promised(n):
    # Errors |0.5 z|, true median 0.5 * 0.6745; reals all 1, so calibration barely moves them.
    rng = np.random.default_rng(n)
    true_median = 0.5 * stats.norm.ppf(0.75)
    covered = []
    for _ in range(2000):
        estimates = 1.0 + 0.5 * rng.standard_normal(n)
        covered.append(relative_error_bound(estimates, np.ones(n), confidence=0.9) >= true_median)
    # Calibrating on the same pairs shrinks the errors a little: a margin below 0.9.
    assert np.mean(covered) > 0.85
    # And the bound is not vacuous: many pairs give a bound near the median.
    if n == 40:
        assert relative_error_bound(estimates, np.ones(n), confidence=0.9) < 2 * true_median


@pytest.mark.parametrize("kwargs, name", [
    ({"window": 2.5}, "window"), ({"window": math.inf}, "window"),
    ({"window": 5, "rank_tolerance": math.nan}, "rank_tolerance"),
])
def test_bad_window_or_tolerance_is_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        measure_error([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], **kwargs)


def test_a_whole_float_window_is_an_int():
    assert measure_error([1.0, 2.0, 3.0], [1.0, 2.0, 4.0], window=2.0) == measure_error(
        [1.0, 2.0, 3.0], [1.0, 2.0, 4.0], window=2)


def test_confidence_must_be_a_probability():
    with pytest.raises(ValueError, match="confidence"):
        measure_error([1.0, 2.0], [1.0, 2.0], window=5, confidence=1.0)


@pytest.mark.parametrize("seed", range(3))
def test_measure_error_reads_median_and_bound_from_the_window_calibrated_once(seed):
    rng = np.random.default_rng(seed)
    real = rng.uniform(1, 10, size=30)
    real[10] = 0.0  # no scale to compare against: skipped by both numbers
    estimates = 1.7 * real * rng.lognormal(0, 0.2, size=30)
    error = measure_error(estimates, real, window=25, confidence=0.9)
    est_w, real_w = estimates[-25:], real[-25:]
    keep = real_w != 0
    scale = np.median(real_w[keep] / est_w[keep])
    by_hand = np.abs(scale * est_w[keep] - real_w[keep]) / real_w[keep]
    assert error.relative_error == pytest.approx(np.median(by_hand))
    assert error.relative_error_bound == relative_error_bound(est_w, real_w, confidence=0.9)
    assert error.relative_error_bound >= error.relative_error
