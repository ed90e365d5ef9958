"""SimulatorEnsemble: an analytic simulator corrected by surrogates learned from real results.

Pure numpy: takes configs, simulator outputs and real values; returns predictions. Works in log
space when every value is positive (throughputs, latencies: errors there are multiplicative),
otherwise in linear space. Three layers:

1. bias calibration: the analytic simulator's systematic offset (a constant factor in log
   space), the median of ``log(real) - log(simulated)``, robust to a few outliers;
2. surrogates: ridge regressions of the remaining residual, each on a subset of the features
   (every single feature with a quadratic term, and all features linearly), so a bias that
   depends on one structural choice is learned from few real runs;
3. weights: each member (including "no correction") is weighted by its leave-one-out squared
   error on the most recent real results, so a surrogate that stopped predicting well fades.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autoscout_optuna import _validate
from autoscout_optuna.fidelity._features import FeatureEncoder

Config = Mapping[str, Any]
ANALYTIC = "analytic"
ALL_FEATURES = "all_features"


class SimulatorEnsemble:
    """Analytic simulator + feature-subset surrogates, weighted by recent accuracy.

    Example:

        .. testcode::

            import numpy as np
            from autoscout_optuna.fidelity import SimulatorEnsemble

            def simulate(cfg):  # right shape, but 30% optimistic whenever pp > 1
                return 100.0 / cfg["tp"] * (1.3 if cfg["pp"] > 1 else 1.0)

            configs = [{"tp": tp, "pp": pp} for tp in (1, 2, 4, 8) for pp in (1, 2)]
            real = [100.0 / c["tp"] for c in configs]
            ensemble = SimulatorEnsemble(simulate=simulate).fit(configs, real)
            predicted = ensemble.predict(configs)
            assert np.max(np.abs(predicted / np.array(real) - 1)) < 0.05

    Args:
        simulate: The analytic simulator, config -> value; None for surrogates alone (then
            ``simulated`` arguments are ignored and the baseline is a constant).
        window: How many of the most recent real results the member weights are measured on.
        max_train: At most this many of the most recent real results are fitted.
        ridge: L2 penalty of the surrogates (on standardized features), > 0.
        min_real: Below this many real results, predictions are the calibrated simulator.
        sharpness: Exponent of the inverse-error weights: higher trusts the best member more.
    """

    def __init__(
        self,
        *,
        simulate: Callable[[Config], float] | None = None,
        window: int = 30,
        max_train: int = 300,
        ridge: float = 1.0,
        min_real: int = 5,
        sharpness: float = 2.0,
    ) -> None:
        if simulate is not None and not callable(simulate):
            raise TypeError("simulate must be callable or None")
        _validate.integers(window=window, max_train=max_train, min_real=min_real)
        _validate.reals(ridge=ridge, sharpness=sharpness)
        if int(window) != window or window < 2:
            raise ValueError(f"window must be an int >= 2, got {window}")
        if int(max_train) != max_train or max_train < window:
            raise ValueError(f"max_train must be an int >= window, got {max_train}")
        if not 0 < ridge < math.inf:
            # inf: a fit that fails ("SVD did not converge")
            raise ValueError(f"ridge must be > 0 and finite, got {ridge}")
        if int(min_real) != min_real or min_real < 1:
            raise ValueError(f"min_real must be an int >= 1, got {min_real}")
        if not 0 <= sharpness < math.inf:
            # inf: every member weight NaN, and every prediction with it
            raise ValueError(f"sharpness must be >= 0 and finite, got {sharpness}")
        self.simulate = simulate
        self.window = int(window)
        self.max_train = int(max_train)
        self.ridge = float(ridge)
        self.min_real = int(min_real)
        self.sharpness = float(sharpness)
        self._fitted = False
        self._log_space = True
        self._offset = 0.0
        self._bounds = (0.0, 0.0)
        self._encoder: FeatureEncoder | None = None
        self._members: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.weights: dict[str, float] = {ANALYTIC: 1.0}

    def fit(
        self,
        configs: Sequence[Config],
        real: Sequence[float],
        simulated: Sequence[float] | None = None,
        selected: Sequence[bool] | None = None,
    ) -> SimulatorEnsemble:
        """Fit on real results, oldest first (non-finite pairs are skipped).

        ``selected`` marks the results whose real run was chosen because the estimate looked
        good. Their residuals are biased low (the winner's curse: they were picked for an
        upward draw of the simulator's noise), so the level (offset) is the median over the
        other results, and the selected ones enter the surrogates centred on their own median,
        i.e. with a fixed effect for being selected that predictions leave out (with fewer
        than ``min_real`` other results, the plain fit). None: no result is selected.
        """
        configs = list(configs)
        base = self._baseline(configs, simulated)
        real_arr = np.asarray(real, dtype=float)
        if real_arr.shape != base.shape:
            raise ValueError("configs, real and simulated must have the same length")
        chosen = (
            np.zeros(base.shape, dtype=bool) if selected is None
            else np.asarray(selected, dtype=bool).reshape(base.shape)
        )
        keep = np.isfinite(real_arr) & np.isfinite(base)
        configs = [c for c, k in zip(configs, keep, strict=True) if k][-self.max_train :]
        base, real_arr = base[keep][-self.max_train :], real_arr[keep][-self.max_train :]
        chosen = chosen[keep][-self.max_train :]
        self._fitted = True
        self._members = {}
        self.weights = {ANALYTIC: 1.0}
        self._log_space = bool(np.all(base > 0) and np.all(real_arr > 0))
        if real_arr.size == 0:
            self._offset = 0.0
            return self
        target = self._to_space(real_arr) - self._to_space(base)
        free = ~chosen
        if np.count_nonzero(free) >= self.min_real:
            self._offset = float(np.median(target[free]))
            residual = target - self._offset
            if np.any(chosen):
                residual[chosen] = target[chosen] - float(np.median(target[chosen]))
        else:
            self._offset = float(np.median(target))
            residual = target - self._offset
        if real_arr.size < self.min_real:
            return self
        # Corrections stay within the residuals actually seen: with few real results a
        # surrogate must not invent a bias larger than any it was shown.
        self._bounds = (float(residual.min()), float(residual.max()))
        self._encoder = FeatureEncoder.fit(configs)
        features = self._encoder.transform(configs)
        recent = slice(-self.window, None)
        errors = {ANALYTIC: float(np.mean(residual[recent] ** 2))}
        for name, columns in self._subsets().items():
            coef, loo = _ridge_with_loo(features[:, columns], residual, self.ridge)
            self._members[name] = (columns, coef)
            errors[name] = float(np.mean(loo[recent] ** 2))
        self.weights = _inverse_error_weights(errors, self.sharpness)
        return self

    def predict(
        self, configs: Sequence[Config], simulated: Sequence[float] | None = None
    ) -> np.ndarray:
        """Predictions for many configs at once (vectorized: thousands per second)."""
        configs = list(configs)
        base = self._baseline(configs, simulated)
        if self._log_space and np.any(base <= 0):
            # No log of a non-positive estimate: such configs keep the raw simulator value.
            safe = np.where(base > 0, base, 1.0)
            return np.where(base > 0, self.predict(configs, safe), base)
        correction = np.full(base.shape, self._offset)
        if self._members and self._encoder is not None and configs:
            features = self._encoder.transform(configs)
            for name, (columns, coef) in self._members.items():
                correction += self.weights[name] * np.clip(
                    _design(features[:, columns]) @ coef, *self._bounds
                )
        return self._from_space(self._to_space(base) + correction)

    def predict_one(self, config: Config, simulated: float | None = None) -> float:
        return float(self.predict([config], None if simulated is None else [simulated])[0])

    def _baseline(self, configs: list[Config], simulated: Sequence[float] | None) -> np.ndarray:
        if self.simulate is None:
            # Surrogates alone: a constant baseline, the offset learns the level.
            return np.ones(len(configs))
        if simulated is None:
            simulated = [_call_or_nan(self.simulate, c) for c in configs]
        return np.asarray(simulated, dtype=float).reshape(len(configs))

    def _subsets(self) -> dict[str, np.ndarray]:
        assert self._encoder is not None
        groups = self._encoder.groups
        subsets = {f"feature:{name}": np.asarray(cols) for name, cols in groups.items()}
        if len(groups) > 1:
            subsets[ALL_FEATURES] = np.arange(self._encoder.n_columns)
        return subsets

    def _to_space(self, values: np.ndarray) -> np.ndarray:
        return np.log(values) if self._log_space else values

    def _from_space(self, values: np.ndarray) -> np.ndarray:
        return np.exp(values) if self._log_space else values


def _call_or_nan(simulate: Callable[[Config], float], config: Config) -> float:
    value = float(simulate(config))
    return value if math.isfinite(value) else math.nan


def _design(columns: np.ndarray) -> np.ndarray:
    return np.hstack([np.ones((columns.shape[0], 1)), columns])


def _ridge_with_loo(
    columns: np.ndarray, target: np.ndarray, penalty: float
) -> tuple[np.ndarray, np.ndarray]:
    """Ridge coefficients and closed-form leave-one-out residuals (no refitting n times)."""
    design = _design(columns)
    gram = design.T @ design + penalty * np.eye(design.shape[1])
    gram[0, 0] -= penalty * 0.999  # barely shrink the intercept: the level is not a prior
    inverse = np.linalg.pinv(gram)
    coef = inverse @ design.T @ target
    leverage = np.einsum("ij,jk,ik->i", design, inverse, design)
    loo = (target - design @ coef) / np.clip(1.0 - leverage, 1e-6, None)
    return coef, loo


def _inverse_error_weights(errors: dict[str, float], sharpness: float) -> dict[str, float]:
    floor = 1e-12 + 1e-6 * max(errors.values())
    raw = {name: (err + floor) ** -sharpness for name, err in errors.items()}
    total = sum(raw.values())
    return {name: value / total for name, value in raw.items()}
