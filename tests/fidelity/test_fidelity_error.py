import math

import numpy as np
import pytest
from scipy import stats

from autoscout_optuna.fidelity import measure_error
from autoscout_optuna.fidelity._error import kendall_tau, spearman_rho


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
