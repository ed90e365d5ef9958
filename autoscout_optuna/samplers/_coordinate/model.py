"""Model moves: a local quadratic fitted to the points around the center, and its best point.

The points measured around the center describe the landscape there: a quadratic fitted by
least squares to the nearest of them has the cross terms that single-coordinate moves cannot
see (a curved valley's direction, a coupling between knobs) and averages the noise out. Its
best point within the region those points cover (a trust region, halved after every model point
that did not become the center) is the next trial: the Levenberg-Marquardt step, which is the
Newton step when the fit is concave and its maximum lies inside, and bends towards the gradient
otherwise (a fit that is not concave in some direction still says which way is up). This is
the derivative-free trust-region idea (Powell's UOBYQA) reduced to one regression per trial.
Pure numpy, no Optuna."""

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


def model_proposal(
    evidence: Evidence, center: int, snap: Snap, margin: float
) -> tuple[float, np.ndarray] | None:
    """``(radius, point)``: the fitted quadratic's best point near the center, or None.

    None when there are too few points to fit, when the model promises less than ``margin``
    (the noise of one measurement, scaled down by the fit's averaging) over the center, or
    when nothing was measured around this center since its last model point (the fit would
    be the same one).
    """
    points, kinds = evidence.points, evidence.kinds
    d = points.shape[1]
    around = np.flatnonzero(evidence.centers == center)
    models = around[evidence.moved[around] == MODEL]
    tried = models.size
    if tried and around[-1] == models[-1]:
        return None  # nothing new around the center since its last model point: same fit
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
    gradient, curvature = _derivatives(coefficients, d)
    step = _trust_region_step(gradient, curvature, 1.0)
    point = snap_point(snap, np.clip(c + step * scale, 0.0, 1.0))
    delta = (point - c) / scale
    promise = float(gradient @ delta + 0.5 * delta @ curvature @ delta)
    # The fit averages its points' noise: a promise a fraction of one measurement's noise is
    # worth a trial (whether it becomes the center is still decided on measurements).
    if promise <= margin / np.sqrt(len(nearest)):
        return None
    if np.max(np.abs(point - c)) <= _SAME or _is_taken(point, points):
        return None
    return radius, point


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


def _derivatives(coefficients: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian at the center of the fitted quadratic."""
    hessian = np.zeros((d, d))
    rows, cols = np.triu_indices(d)
    hessian[rows, cols] = coefficients[1 + d:]
    hessian = hessian + hessian.T  # diagonal terms are x_i^2: second derivative 2 * coef
    return coefficients[1 : 1 + d], hessian


def _trust_region_step(gradient: np.ndarray, hessian: np.ndarray, radius: float) -> np.ndarray:
    """Maximizer of ``g.s + s.H.s / 2`` over ``|s| <= radius`` (Levenberg-Marquardt form).

    The step is ``(lam I - H)^-1 g`` with the smallest ``lam >= 0`` that makes the system
    positive definite and the step fit in the ball: the Newton step when the fit is concave and
    its maximum is near, a curvature-aware gradient step otherwise.
    """
    values, vectors = np.linalg.eigh(-hessian)
    along = vectors.T @ gradient

    def step_norm(lam: float) -> float:
        return float(np.linalg.norm(along / (values + lam)))

    low = max(0.0, -float(values.min()))
    # Just past the most negative eigenvalue, relative to the spectrum: an absolute 1e-12 is
    # lost in rounding next to a curvature of 1e3 and the division meets a zero.
    low += 1e-9 * max(low, float(np.max(np.abs(values))), 1.0)
    if step_norm(low) > radius:
        high = low + float(np.linalg.norm(gradient)) / radius + 1e-12  # norm(high) <= radius
        for _ in range(60):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if step_norm(middle) > radius else (low, middle)
        low = high
    return vectors @ (along / (values + low))
