"""A memory estimate, calibrated on measured peaks: P(out of memory) where learning alone cannot.

The learned feasibility models (``feasibility.py``, ``memory.py``) see only the trials so far,
and the best training layouts sit right at the memory wall, where those models cannot tell
which side a structure falls on. On every structure of ``llm_training`` 8B (13,680 of them,
each labelled by the reference), the best *additive* logistic over the structure's choices
still gives the optimum P(FAIL) 0.78, and 70B's best layouts 0.4-0.6: the boundary is not
additive (a micro-batch's memory depends on the tensor-parallel degree it is split over, ZeRO's
savings on the data-parallel degree the layout leaves), so no amount of history fixes it.
With the true memory of each structure in place of the learned models (a benchmark-only
oracle, seeds 120-239, 100 trials), the same sampler reaches 0.993 / 0.991 of the optimum in
the median (8B / 70B, against 0.977 / 0.905) with 3.8 / 2.5 failed trials per seed.

Users often have that knowledge in the form of a formula: Megatron-LM's theoretical memory
report, ``llm-analysis``, a profiler's extrapolation. Such an estimate has the right shape and
a systematic error (fragmentation, the CUDA context, communication buffers, terms a formula
leaves out). The error is calibrated from the peaks that trials which ran report (user attr
``memory_use``):

    log m = log(a * e + c) + r(x) + eps,    eps ~ N(0, sigma^2)

``e`` the estimate, ``a`` its multiplicative bias, ``c >= 0`` a constant it leaves out, ``r``
a ridge regression of what is left on the structure's features (``memory.py``'s fit on the
residual, once it has enough rows) and ``sigma`` its error (at least 5 %). P(out of memory) is
``Phi(log m_hat / sigma)``. Before any peak is measured the estimate is taken as it is, with
``PRIOR_SIGMA``. An estimate whose logs do not follow the measured peaks' (correlation below
``MIN_CORRELATION``) still adds its P(out of memory), but the failures go back to the learned
models (``EstimateCalibration.informative``); so do the failures a tracking estimate did not
see coming (``feasibility.EXPLAINED_P_OOM``). Everything is refitted from the history on
every plan (no state to keep); the user's function is called once per structure
(:class:`MemoryEstimator` caches it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscout_optuna.samplers._mcts.encoding import value_key
from autoscout_optuna.samplers._mcts.memory import (
    MIN_SIGMA,
    MemoryModel,
    fit_memory,
    measured_peaks,
)
from autoscout_optuna.samplers._mcts.monotone import correlation

# The error assumed of an estimate before any measured peak checks it (log units, ~35 %).
PRIOR_SIGMA = 0.3
# Measured peaks the scale and constant need before they replace the estimate as it is.
MIN_CALIBRATION_ROWS = 3
# Correlation between the log estimates and the log measured peaks below which the estimate is
# not trusted with the out-of-memory failures (they train the learned models again). A formula
# that says nothing (a constant, seeds 120-239, 100 trials) otherwise cost 70B 0.010 of the
# optimum and 13 of 29 seeds at 99 %, with 8 more failed trials per seed.
MIN_CORRELATION = 0.5
GAUSS_NEWTON_STEPS = 50


@dataclass(frozen=True)
class EstimateCalibration:
    """``log(scale * estimate + overhead) + residual(features)``, with error ``sigma``."""

    scale: float = 1.0
    overhead: float = 0.0
    sigma: float = PRIOR_SIGMA
    residual: MemoryModel | None = None
    informative: bool = True  # the estimate tracks the measured peaks (``MIN_CORRELATION``)

    def log_fraction(self, estimates: np.ndarray, features: np.ndarray) -> np.ndarray:
        """Calibrated log of peak memory over capacity per row (NaN where no estimate)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            log_m = np.log(self.scale * np.asarray(estimates, dtype=float) + self.overhead)
        if self.residual is not None:
            log_m = log_m + self.residual.log_fraction(features)
        return log_m

    def as_dict(self) -> dict[str, Any]:
        """What the calibration found, for a trial's record: how far off the user's formula
        is (``scale`` > 1: it reads low), the memory it leaves out (``overhead``, in fractions
        of capacity), the error that remains (``sigma``, log units), whether the peaks' own
        ridge corrects it further, and whether it follows the measured peaks at all."""
        return {"scale": round(self.scale, 4), "overhead": round(self.overhead, 4),
                "sigma": round(self.sigma, 4), "residual": self.residual is not None,
                "informative": self.informative}

    def p_out_of_memory(self, estimates: np.ndarray, features: np.ndarray) -> np.ndarray:
        """P(peak > capacity) per row; 1 where the estimate is infinite (the structure cannot
        run at all), 0 where it has nothing to say (NaN)."""
        from scipy.special import ndtr  # scipy stays out of ``import autoscout_optuna``

        log_m = self.log_fraction(estimates, features)
        known = ~np.isnan(log_m)
        return np.where(known, ndtr(np.where(known, log_m, 0.0) / self.sigma), 0.0)


def calibrate(
    estimates: np.ndarray, features: np.ndarray, structure: np.ndarray, fraction: np.ndarray
) -> EstimateCalibration:
    """Fit the calibration on the trials that ran and reported their peak.

    Args:
        estimates: Estimated peak over capacity per distinct structure (NaN: none).
        features: Design matrix per distinct structure (``feasibility.memory_features``).
        structure: Per trial, its row of ``estimates`` / ``features``.
        fraction: Per trial, the measured peak over capacity (NaN or infinite: none).

    Returns:
        The calibration; the estimate as it is (``PRIOR_SIGMA``) with too few measured rows.
    """
    estimates = np.asarray(estimates, dtype=float)
    fraction = np.asarray(fraction, dtype=float)
    estimate = estimates[structure]
    usable = measured_peaks(fraction) & measured_peaks(estimate)
    if usable.sum() < MIN_CALIBRATION_ROWS:
        return EstimateCalibration()
    scale, overhead, sigma = _fit_scale_and_overhead(estimate[usable], fraction[usable])
    informative = correlation(np.log(estimate[usable]), np.log(fraction[usable])) >= (
        MIN_CORRELATION)
    calibration = EstimateCalibration(scale, overhead, sigma, None, informative)
    # what the scale and the constant leave: a ridge on the structure (memory.py), once it has
    # the rows it needs; its leave-one-out error is then the calibration's
    leftover = np.full(len(fraction), np.nan)
    leftover[usable] = fraction[usable] / (scale * estimate[usable] + overhead)
    residual = fit_memory(features, structure, leftover)
    if residual is None:
        return calibration
    return EstimateCalibration(scale, overhead, residual.sigma, residual, informative)


def _fit_scale_and_overhead(
    estimate: np.ndarray, measured: np.ndarray
) -> tuple[float, float, float]:
    """Least squares of ``log(a * e + c)`` on ``log m`` (Gauss-Newton on log a and log c)."""
    target = np.log(measured)
    log_a, log_c = float(np.median(target - np.log(estimate))), math.log(0.02)
    for _ in range(GAUSS_NEWTON_STEPS):
        a, c = math.exp(log_a), math.exp(log_c)
        predicted = a * estimate + c
        residual = np.log(predicted) - target
        jacobian = np.stack([a * estimate / predicted, c / predicted], axis=1)
        # a little damping: with every estimate alike, a and c trade off along a ridge
        step = np.linalg.solve(jacobian.T @ jacobian + 1e-3 * np.eye(2), jacobian.T @ residual)
        # c above the whole capacity would explain nothing a real run reports
        log_a, log_c = log_a - step[0], min(log_c - step[1], 0.0)
        if np.max(np.abs(step)) < 1e-8:
            break
    a, c = math.exp(log_a), math.exp(log_c)
    residual = np.log(a * estimate + c) - target
    dof = max(len(target) - 2, 1)
    return a, c, max(float(np.sqrt(np.sum(residual**2) / dof)), MIN_SIGMA)


class MemoryEstimator:
    """A user's ``memory_estimate(params) -> float`` called once per structure.

    ``params`` holds the structure's params (name -> value, only those it asks); the function
    returns the estimated peak device memory over the device's capacity, and fills in the
    dense knobs it needs itself (their defaults, say). Infinity says the structure cannot run
    at all (a layout the job would refuse at launch). None or a ``KeyError`` (a param it
    needs is missing: early in a define-by-run study a structure is planned over the params
    seen so far) says it cannot estimate this structure, and so does NaN, a non-positive
    number or another exception (the first of those is reported once as a warning): that
    structure then gets no estimate, and the search goes on.

    The cache is a cache of a deterministic function, not state: a resumed study calls the
    function again and gets the same numbers.
    """

    def __init__(self, function: Callable[[dict[str, Any]], Any]) -> None:
        if not callable(function):
            raise TypeError(
                f"memory_estimate must be callable (params -> fraction of capacity) or None, "
                f"got {function!r}"
            )
        self.function = function
        self._cache: dict[tuple[tuple[str, Any], ...], float] = {}
        self._by_codes: dict[tuple[Any, ...], dict[bytes, float]] = {}
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        return {"function": self.function}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["function"])  # type: ignore[misc]

    def __call__(self, params: Mapping[str, Any]) -> float:
        """The estimate for one structure, NaN where the function gives none."""
        key = tuple(sorted((name, value_key(value)) for name, value in params.items()))
        if key not in self._cache:
            self._cache[key] = self._evaluate(dict(params))
        return self._cache[key]

    def for_columns(
        self, names: Sequence[str], values: Sequence[Sequence[Any]]
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``codes -> estimates`` for rows encoded over these columns (negative: not asked)."""
        # The model arm asks about ~1,500 candidate rows per plan, mostly the same ones: rows
        # are looked up by their codes before any params are decoded (a table's columns keep
        # their values as long as the study's space does).
        signature = (tuple(names), tuple(tuple(value_key(v) for v in vals) for vals in values))
        by_codes = self._by_codes.setdefault(signature, {})

        def estimate(codes: np.ndarray) -> np.ndarray:
            rows = np.atleast_2d(np.asarray(codes, dtype=np.int64))
            out = np.empty(len(rows))
            for i, row in enumerate(rows):
                key = row.tobytes()
                if key not in by_codes:
                    by_codes[key] = self({
                        name: values[j][code]
                        for j, (name, code) in enumerate(zip(names, row, strict=True))
                        if code >= 0
                    })
                out[i] = by_codes[key]
            return out

        return estimate

    def _evaluate(self, params: dict[str, Any]) -> float:
        if not params:
            return math.nan
        try:
            value = self.function(params)
            if value is None:
                return math.nan
            value = float(value)
        except KeyError:
            # a param it needs is not there: early in a define-by-run study, a structure is
            # planned over the params seen so far
            return math.nan
        except Exception as error:  # noqa: BLE001 - a structure it cannot estimate, not a crash
            self._warn(f"memory_estimate raised {type(error).__name__}: {error} for {params}")
            return math.nan
        if math.isnan(value) or value <= 0:
            self._warn(f"memory_estimate returned {value!r} for {params}")
            return math.nan
        return value

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"{message}; such structures get no estimate", stacklevel=3)


def as_estimator(function: Callable[[dict[str, Any]], Any] | None) -> MemoryEstimator | None:
    """A user's ``memory_estimate`` option as a :class:`MemoryEstimator` (None stays None; one
    already wrapped is shared, with its cache, as AutoScout shares it with its MCTS)."""
    if function is None or isinstance(function, MemoryEstimator):
        return function
    return MemoryEstimator(function)
