"""How wrong the simulator has been lately: pure numpy, no ``optuna.Study``.

Two views of one error, both on the most recent trials that have an estimate and a real value:

* calibrated relative error: the median of ``|k * estimate - real| / |real|`` where ``k`` is the
  median ratio ``real / estimate``. A simulator off by a constant factor still ranks configs
  right, so that factor is calibrated away; noise and structure-dependent bias remain;
* rank discordance: the fraction of pairs the estimate orders wrongly, counting only pairs
  whose real values differ by more than ``rank_tolerance`` (relative). Once the search has
  converged, most real values are within noise of each other; misordering those is harmless,
  and counting them would make every simulator look random exactly when it is most useful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscout_optuna import _validate


@dataclass(frozen=True)
class SimulatorError:
    """The simulator's accuracy on the most recent trials that have both fidelities.

    Attributes:
        n_pairs: How many (estimate, real) pairs the numbers below are measured on.
        relative_error: Calibrated relative error (see module doc); None with no pairs.
        raw_relative_error: Median ``|estimate - real| / |real|``, before calibration.
        discordance: Fraction of wrongly ordered pairs among pairs whose real values differ by
            more than the tolerance (estimate ties count half); None without such pairs.
        kendall_tau: Plain Kendall's tau-b over all pairs (for reports); None when undefined.
        spearman_rho: Spearman rank correlation (for reports); None when undefined.
        scale: Median ``real / estimate``: the constant factor calibrated away; None with no
            usable pairs.
        relative_error_bound: Upper confidence bound on the calibrated relative error (see
            ``relative_error_bound``); None unless a confidence was asked for, or with no pairs.
    """

    n_pairs: int
    relative_error: float | None
    raw_relative_error: float | None
    discordance: float | None
    kendall_tau: float | None
    spearman_rho: float | None
    scale: float | None = None
    relative_error_bound: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "n_pairs": self.n_pairs,
            "relative_error": self.relative_error,
            "raw_relative_error": self.raw_relative_error,
            "discordance": self.discordance,
            "kendall_tau": self.kendall_tau,
            "spearman_rho": self.spearman_rho,
            "scale": self.scale,
            "relative_error_bound": self.relative_error_bound,
        }


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float | None:
    """Kendall's tau-b (tie-corrected); None when either side is constant or n < 2."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2:
        return None
    # O(n^2) on a small window is cheaper and clearer than the O(n log n) merge-sort version.
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    upper = np.triu_indices(x.size, k=1)
    dx, dy = dx[upper], dy[upper]
    concordant_minus_discordant = float(np.sum(dx * dy))
    untied_x = float(np.count_nonzero(dx))
    untied_y = float(np.count_nonzero(dy))
    if untied_x == 0 or untied_y == 0:
        return None
    return concordant_minus_discordant / float(np.sqrt(untied_x * untied_y))


def spearman_rho(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rho (Pearson on average ranks); None when either side is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2:
        return None
    rx, ry = _average_ranks(x), _average_ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return None
    return float(np.mean((rx - rx.mean()) * (ry - ry.mean())) / (sx * sy))


def relative_error(estimates: np.ndarray, reals: np.ndarray, *, calibrate: bool) -> float | None:
    """Median relative error, optionally after scaling estimates by the median ratio.

    Pairs whose real value is 0 are skipped (no scale to compare against).
    """
    return _median_or_none(_relative_errors(estimates, reals, calibrate=calibrate))


def relative_error_bound(
    estimates: np.ndarray, reals: np.ndarray, *, confidence: float
) -> float | None:
    """Upper confidence bound on the median calibrated relative error, distribution-free.

    The bound is the smallest order statistic ``x_(j)`` of the pairs' errors with
    ``P(Binomial(n, 1/2) < j) >= confidence``: the true median exceeds ``x_(j)`` only if fewer
    than ``j`` of ``n`` errors fall below it, each with probability 1/2. Few pairs give a wide
    bound (five pairs at 0.9 give their largest error), so a handful of lucky pairs cannot
    pass for an accurate simulator; many pairs give a bound close to the median. Infinite
    when no order statistic is high enough; None with no pairs. (The calibration factor is
    estimated from the same pairs, which the bound ignores.)
    """
    return _median_upper_bound(_relative_errors(estimates, reals, calibrate=True), confidence)


def _median_or_none(errors: np.ndarray) -> float | None:
    return None if errors.size == 0 else float(np.median(errors))


def _median_upper_bound(errors: np.ndarray, confidence: float) -> float | None:
    """The order-statistic bound of :func:`relative_error_bound` on given errors."""
    errors = np.sort(errors)
    n = errors.size
    if n == 0:
        return None
    below = np.cumsum([math.comb(n, k) for k in range(n)]) / 2.0**n  # P(Bin(n, 1/2) <= j - 1)
    reached = np.flatnonzero(below >= confidence)
    return float(errors[reached[0]]) if reached.size else math.inf


def _relative_errors(estimates: np.ndarray, reals: np.ndarray, *, calibrate: bool) -> np.ndarray:
    estimates, reals = np.asarray(estimates, dtype=float), np.asarray(reals, dtype=float)
    keep = reals != 0
    if calibrate:
        keep &= estimates != 0
    estimates, reals = estimates[keep], reals[keep]
    if calibrate and estimates.size:
        scale = _median_ratio(estimates, reals)
        estimates = estimates * (1.0 if scale is None else scale)
    return np.abs(estimates - reals) / np.abs(reals)


def tolerant_discordance(
    estimates: np.ndarray, reals: np.ndarray, tolerance: float
) -> float | None:
    """Fraction of discordant pairs among pairs whose reals differ by > ``tolerance``."""
    estimates, reals = np.asarray(estimates, dtype=float), np.asarray(reals, dtype=float)
    upper = np.triu_indices(reals.size, k=1)
    real_gap = (reals[:, None] - reals[None, :])[upper]
    scale = np.maximum(np.abs(reals)[:, None], np.abs(reals)[None, :])[upper]
    meaningful = np.abs(real_gap) > tolerance * scale
    if not np.any(meaningful):
        return None
    estimate_gap = (estimates[:, None] - estimates[None, :])[upper][meaningful]
    agreement = np.sign(estimate_gap) * np.sign(real_gap[meaningful])
    # agreement: +1 concordant, -1 discordant, 0 an estimate tie (half wrong).
    return float(np.mean((1.0 - agreement) / 2.0))


def measure_error(
    estimates: Sequence[float],
    reals: Sequence[float],
    *,
    window: int,
    rank_tolerance: float = 0.05,
    confidence: float | None = None,
) -> SimulatorError:
    """Error of the last ``window`` pairs (oldest first in the inputs).

    Args:
        estimates: Simulator estimates, in the order the trials ran.
        reals: The real values of the same trials.
        window: How many of the most recent pairs count: old pairs describe a simulator (or an
            ensemble) that has since been recalibrated, and a recovered simulator should be
            trusted again once the bad stretch has slid out of the window.
        rank_tolerance: Pairs whose real values differ by at most this fraction are ties.
        confidence: Also bound the relative error from above at this confidence (in (0, 1));
            None: no bound.
    """
    # named errors, not numpy's "slice indices must be integers" at window=2.5 or 5.0, nor a
    # NaN tolerance that silently counts no pair as ordered
    _validate.integers(window=window)
    _validate.reals(rank_tolerance=rank_tolerance)
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    window = int(window)
    if rank_tolerance < 0:
        raise ValueError(f"rank_tolerance must be >= 0, got {rank_tolerance}")
    if confidence is not None and not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1) or None, got {confidence}")
    est = np.asarray(estimates, dtype=float)
    real = np.asarray(reals, dtype=float)
    if est.shape != real.shape:
        raise ValueError("estimates and reals must have the same length")
    finite = np.isfinite(est) & np.isfinite(real)
    est, real = est[finite][-window:], real[finite][-window:]
    # Calibrated once: the median and its bound are read from the same errors.
    calibrated = _relative_errors(est, real, calibrate=True)
    return SimulatorError(
        n_pairs=int(est.size),
        relative_error=_median_or_none(calibrated),
        raw_relative_error=relative_error(est, real, calibrate=False),
        discordance=tolerant_discordance(est, real, rank_tolerance),
        kendall_tau=kendall_tau(est, real),
        spearman_rho=spearman_rho(est, real),
        scale=_median_ratio(est, real),
        relative_error_bound=(
            None if confidence is None else _median_upper_bound(calibrated, confidence)
        ),
    )


def _median_ratio(estimates: np.ndarray, reals: np.ndarray) -> float | None:
    keep = estimates != 0
    if not np.any(keep):
        return None
    ratio = float(np.median(reals[keep] / estimates[keep]))
    # A negative ratio means estimate and reality disagree in sign: no scale to calibrate.
    return ratio if ratio > 0 else None


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size, dtype=float)
    ranks[order] = np.arange(values.size, dtype=float)
    # Ties share the mean of their ranks.
    unique, inverse = np.unique(values, return_inverse=True)
    if unique.size < values.size:
        sums = np.bincount(inverse, weights=ranks)
        counts = np.bincount(inverse)
        ranks = (sums / counts)[inverse]
    return ranks
