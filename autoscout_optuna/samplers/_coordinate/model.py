"""Model moves: a local quadratic fitted to the points around the center, and its best point.

When every line through the center is resolved (coordinates and the pattern line), the
points measured around the center already describe the landscape there: a quadratic fitted by
least squares to the nearest of them has the cross terms that single-coordinate moves cannot
see (a curved valley's direction, a coupling between knobs) and averages the noise out. Its
best point within the region those points cover (a trust region, halved after every model point
that did not become the center) is the next trial. This is the derivative-free trust-region
idea (Powell's UOBYQA) reduced to one regression per trial. Pure numpy, no Optuna.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    _SAME,
    MODEL,
    REAL,
    Evidence,
    Snap,
    _is_taken,
    snap_point,
)

MODEL_RADII = 3  # trust radius halves per model point around one center, then starts again
_CANDIDATES = 256  # random points in the trust region the model ranks (besides its optimum)


def model_proposal(
    evidence: Evidence, center: int, snap: Snap, rng: np.random.Generator, margin: float
) -> tuple[float, np.ndarray] | None:
    """``(radius, point)``: the fitted quadratic's best point near the center, or None.

    None when there are too few points to fit, when the model promises less than ``margin``
    (the noise of one measurement, scaled down by the fit's averaging) over the center, or
    when the last model point around this center was not followed by a restart yet (model and
    restart points alternate).
    """
    points, kinds = evidence.points, evidence.kinds
    d = points.shape[1]
    tried = int(np.sum((evidence.moved == MODEL) & (evidence.centers == center)))
    restarts = int(np.sum(evidence.restarts & (evidence.centers == center)))
    if tried > restarts:
        return None  # alternate with restarts: they bring the fit new points around the center
    real = np.flatnonzero(kinds == REAL)
    n_terms = 1 + d + d * (d + 1) // 2
    if real.size < n_terms + 2:
        return None
    c = points[center]
    distance = np.max(np.abs(points[real] - c), axis=1)
    near = np.argsort(distance, kind="stable")[: 2 * n_terms]
    nearest, near_distance = real[near], distance[near]
    radius = float(np.max(near_distance)) * 0.5 ** (tried % MODEL_RADII)
    if radius <= 4 * _SAME:
        return None
    scale = max(radius, 1e-9)
    coefficients = _fit(
        (points[nearest] - c) / scale, evidence.scores[nearest], n_terms,
        weights=1.0 / (1.0 + near_distance / scale),
    )
    if coefficients is None:
        return None
    low, high = np.maximum(c - radius, 0.0), np.minimum(c + radius, 1.0)
    candidates = low + rng.random((_CANDIDATES, d)) * (high - low)
    newton = _stationary_point(coefficients, d)
    if newton is not None:
        candidates = np.vstack([candidates, np.clip(c + newton * scale, low, high)])
    predicted = _features((candidates - c) / scale) @ coefficients
    at_center = coefficients[0]
    # The fit averages its points' noise: a promise a fraction of one measurement's noise is
    # worth a trial (whether it becomes the center is still decided on measurements).
    needed = margin / np.sqrt(len(nearest))
    for index in np.argsort(-predicted)[:8]:
        if predicted[index] - at_center <= needed:
            return None
        point = snap_point(snap, candidates[index])
        if np.max(np.abs(point - c)) > _SAME and not _is_taken(point, points):
            return radius, point
    return None


def _features(delta: np.ndarray) -> np.ndarray:
    """[1, delta_i, delta_i * delta_j (i <= j)] per row."""
    n, d = delta.shape
    rows, cols = np.triu_indices(d)
    return np.hstack([np.ones((n, 1)), delta, delta[:, rows] * delta[:, cols]])


def _fit(delta: np.ndarray, scores: np.ndarray, n_terms: int, weights: np.ndarray):
    features = _features(delta)
    sqrt_w = np.sqrt(weights)[:, None]
    # A little ridge on the curvature terms: a fit on clustered points stays finite.
    ridge = np.zeros(n_terms)
    ridge[1 + delta.shape[1]:] = 1e-6
    a = np.vstack([features * sqrt_w, np.diag(np.sqrt(ridge))])
    b = np.concatenate([scores * sqrt_w[:, 0], np.zeros(n_terms)])
    coefficients, *_ = np.linalg.lstsq(a, b, rcond=None)
    return coefficients if np.all(np.isfinite(coefficients)) else None


def _stationary_point(coefficients: np.ndarray, d: int) -> np.ndarray | None:
    """Maximum of the fitted quadratic when it is concave, else None."""
    gradient = coefficients[1 : 1 + d]
    hessian = np.zeros((d, d))
    rows, cols = np.triu_indices(d)
    hessian[rows, cols] = coefficients[1 + d:]
    hessian = hessian + hessian.T  # diagonal terms are x_i^2: second derivative 2 * coef
    if np.any(np.linalg.eigvalsh(hessian) >= 0.0):
        return None
    return -np.linalg.solve(hessian, gradient)
