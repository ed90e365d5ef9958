"""Learned memory use: how likely a structure is to run out of memory (pure: numbers in, out).

A trial that ran reports its peak device memory as a fraction of the device's capacity (user
attr ``memory_use``, see :mod:`autoscout_optuna._memory`); one that ran out of memory says only
that the fraction was above 1. The logistic of ``feasibility.py`` learns from the second kind
alone, one bit per trial, and near the memory wall (where the best training layouts sit) bits
are few and noisy. A measured peak is a number: every trial that ran says how far from the
wall it was. Memory is roughly a product of per-choice factors (a micro-batch twice as large,
twice the activations; twice the tensor parallelism, half the weights), so the log of the
fraction is fitted as a sum of per-choice terms: a ridge regression on the same features as
the logistic (one-hot choices plus log-scaled numeric trends). Where a structure's predicted
log-fraction sits, in units of the fit's leave-one-out error, gives P(out of memory).

Only trials that ran are fitted. Those that ran out of memory are censored observations (above
0, by how much unknown); an EM loop that filled them in with their expected value above 0
cut failures further (seeds 0-159 of the ``autoscout`` studies, 100 trials, FAIL per seed after
trial 20: 8B 10.4 -> 9.5, 70B 16.1 -> 14.8) but pulled the fit up at the wall where 8B's best
layouts sit: seeds reaching 99 % of the optimum fell from 35 to 25 of 160 (70B 39 -> 32).
The logistic of ``feasibility.py`` already learns from those failures.

The samplers use this model only with ``memory_model=True``: at 100 trials it cut failed runs
by a sixth at the same best/optimum, but past 200 trials on 70B it found less (-0.018 at 300
trials, seeds 0-39): new layouts a few percent under the wall, where 70B's best sit, are
predicted a few percent over it (``benchmarks/results/README.md``, "Session 28").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Ridge penalty on the weights (the mean is not penalized), as the logistic's.
L2 = 1.0
# Rows with a measured peak the fit needs before it says anything.
MIN_ROWS = 8
# The smallest error the fit may claim (log units, ~5 %): a peak depends on knobs the structure
# does not fix (how many layers are recomputed, fragmentation), and a fit on a few rows that
# happens to match them exactly would otherwise call every unseen structure certain.
MIN_SIGMA = 0.05


@dataclass(frozen=True)
class MemoryModel:
    """A fitted ridge of log(memory fraction) on structure features."""

    mean: float
    weights: np.ndarray
    sigma: float

    def log_fraction(self, features: np.ndarray) -> np.ndarray:
        """Predicted log of peak memory over capacity, per row of ``features``."""
        return self.mean + np.atleast_2d(features) @ self.weights

    def p_out_of_memory(self, features: np.ndarray) -> np.ndarray:
        """P(peak > capacity) per row: the prediction's distance above 0 in units of error."""
        from scipy.special import ndtr  # scipy stays out of ``import autoscout_optuna``

        return ndtr(self.log_fraction(features) / self.sigma)


def measured_peaks(fraction: np.ndarray) -> np.ndarray:
    """Which entries of ``fraction`` are measured peaks: positive and finite (NaN: none was
    reported; infinite: the trial ran out of memory, by an amount nobody knows)."""
    fraction = np.asarray(fraction, dtype=float)
    return np.isfinite(fraction) & (fraction > 0)


def fit_memory(
    features: np.ndarray, structure: np.ndarray, fraction: np.ndarray
) -> MemoryModel | None:
    """Fit the model on the trials with a measured ``fraction``.

    Args:
        features: Design matrix, one row per distinct structure (see
            ``feasibility.memory_features``): a long study measures the same structures over
            and over, and the fit's sums need each structure once, with its counts.
        structure: Per trial, its row of ``features``.
        fraction: Per trial, peak memory over capacity; NaN (or not positive) where unknown.

    Returns:
        The model, or None with fewer than ``MIN_ROWS`` measured trials.
    """
    fraction = np.asarray(fraction, dtype=float)
    measured = measured_peaks(fraction)
    if measured.sum() < MIN_ROWS:
        return None
    x, size, width = features, len(features), features.shape[1]
    y = np.log(fraction[measured])
    rows = structure[measured]
    count = np.bincount(rows, minlength=size).astype(float)
    total = np.bincount(rows, weights=y, minlength=size)
    mean = float(y.mean())
    # einsum, not BLAS products: see ``feasibility._logistic`` on BLAS threads on busy cores
    gram = np.einsum("u,uj,uk->jk", count, x, x)
    inverse = np.linalg.inv(gram + L2 * np.eye(width))
    weights = np.einsum("jk,uk,u->j", inverse, x, total - count * mean)
    # Leave-one-out residuals of a ridge: the residual over (1 - leverage), no refits.
    leverage = np.einsum("uj,jk,uk->u", x, inverse, x)
    predicted = mean + np.einsum("uj,j->u", x, weights)
    loo = (y - predicted[rows]) / np.maximum(1.0 - leverage[rows], 0.05)
    return MemoryModel(mean, weights, max(float(np.sqrt(np.mean(loo**2))), MIN_SIGMA))
