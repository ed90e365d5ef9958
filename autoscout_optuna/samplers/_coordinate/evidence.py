"""What coordinate descent knows: the evidence rows, the center, the noise and step sizes.

Pure numpy, no Optuna. ``search.plan_move`` turns this into a decision; ``moves`` holds the
line search, wall and restart geometry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

REAL, ESTIMATE, FAILED, PENDING = 0, 1, 2, 3
PATTERN = -2  # ``moved`` of a pattern move (along the center's travel, not one coordinate)
MODEL = -3  # ``moved`` of a model move (the best point of a local quadratic fit)
#: ``moved`` of a slide along a wall: it moves two coordinates, so it says nothing about the step
#: size of either (a failed slide must not shrink the line search's step).
SLIDE = -4
PLATEAU = -5  # ``moved`` of a plateau move (the knobs found flat, redrawn together)
TIES = -6  # ``moved`` of a ties move (each line's tied probe, combined)
#: ``moved`` of each move off the axes, by phase (the others record the coordinate they moved).
OFF_AXIS = {"pattern": PATTERN, "model": MODEL, "slide": SLIDE, "plateau": PLATEAU,
            "ties": TIES}
MAX_FAILED_SLIDES = 2  # failed slides from one wall before it counts as independent of the rest
RULES = ("cyclic", "random", "sensitivity")
_SAME = 1e-6  # unit-cube distance below which two coordinates are the same value
RECENT_REPEATS = 4  # repeated points the noise estimate pools (the most recent ones)
MAX_LINE_STEPS = 6  # moves along one line through one center before it counts as resolved


@dataclass(frozen=True)
class Evidence:
    """Trials of one structure, one row each, oldest first.

    Attributes:
        points: ``(n, d)`` unit-cube coordinates (every row has all ``d`` coordinates).
        scores: ``(n,)`` values oriented so that larger is better; NaN for failed/pending rows.
        kinds: ``(n,)`` one of ``REAL``, ``ESTIMATE``, ``FAILED``, ``PENDING``.
        moved: ``(n,)`` coordinate index each row's trial moved, the ``OFF_AXIS`` code of its
            phase for a pattern, model, slide or plateau move, -1 for none.
        centers: ``(n,)`` row index of the center that trial moved from, -1 for none.
        restarts: ``(n,)`` True for rows proposed as restarts.
        steps: ``(n,)`` the step each trial recorded (for a pattern move: its ``t`` along the
            center's travel); None reads as zeros.
        vertex: ``(n,)`` True for rows proposed as a line search's parabola vertex (phase
            ``"step"``); None reads as all False.
    """

    points: np.ndarray
    scores: np.ndarray
    kinds: np.ndarray
    moved: np.ndarray
    centers: np.ndarray
    restarts: np.ndarray
    steps: np.ndarray = field(default=None)  # type: ignore[assignment]
    vertex: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.steps is None:
            object.__setattr__(self, "steps", np.zeros(len(self.kinds)))
        if self.vertex is None:
            object.__setattr__(self, "vertex", np.zeros(len(self.kinds), dtype=bool))


@dataclass(frozen=True)
class Move:
    """The decision for one trial.

    Attributes:
        phase: ``"startup"``, ``"confirm"``, ``"probe"``, ``"step"``, ``"slide"``,
            ``"pattern"``, ``"plateau"``, ``"model"`` or ``"restart"``.
        point: ``(d,)`` unit-cube point to evaluate.
        coordinate: Index of the coordinate moved, -1 if none (or all, for a restart), the
            ``OFF_AXIS`` code for a pattern, model or plateau move (a slide names the knob it
            moved besides the wall's; the evidence records it as ``SLIDE``).
        step: Signed distance moved along ``coordinate`` in the unit cube (pattern: ``t``, in
            multiples of the center's travel).
        slope: Estimated score change per unit along ``coordinate`` at the center, or None.
        center: Row index of the center, -1 without one.
        noise: Estimated measurement noise (standard deviation), None until known.
    """

    phase: str
    point: np.ndarray
    coordinate: int = -1
    step: float = 0.0
    slope: float | None = None
    center: int = -1
    noise: float | None = None


@dataclass(frozen=True)
class Settings:
    """Knobs of the rule (validated by the sampler's constructor)."""

    rule: str = "cyclic"
    initial_step: float = 0.25
    min_step: float = 1e-3
    confidence: float = 1.75
    wall_radius: float = 0.02
    restart_radius: float = 1.0
    resolve_fraction: float = 0.02
    headroom: bool = True


Snap = Callable[[int, float], float]


def snap_point(snap: Snap, point: np.ndarray) -> np.ndarray:
    """``point`` with every coordinate snapped onto its knob's grid (ints, steps, bounds)."""
    return np.array([snap(i, u) for i, u in enumerate(point)])


def lines_through(points: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``points``: how many coordinates differ from ``c``, and the one that does
    where exactly one does (the row lies on the line through ``c`` along it; -1 elsewhere)."""
    differ = np.abs(points - c) > _SAME
    n_diff = differ.sum(axis=1)
    return n_diff, np.where(n_diff == 1, differ.argmax(axis=1), -1)


def margin_of(noise: float | None, settings: Settings) -> float:
    """Score differences below this are ties: ``confidence`` times the noise."""
    return 0.0 if noise is None else settings.confidence * noise


def point_mean(evidence: Evidence, row: int) -> float:
    """Mean of the real measurements taken at exactly the point of ``row``."""
    same = _same_point_rows(evidence, row)
    return float(np.mean(evidence.scores[same]))


def choose_center(
    evidence: Evidence, confidence: float, prior_noise: float | None = None
) -> tuple[int, int, float | None]:
    """(center row, best-mean row, noise sigma) among the real rows.

    The center maximizes the lower confidence bound. Until two repeated measurements give a noise
    estimate, the relative ``prior_noise`` (from elsewhere in the study) stands in for it;
    without either, a point measured once is trusted only when nothing else was measured.
    """
    real = np.flatnonzero(evidence.kinds == REAL)
    _, first, inverse = np.unique(
        np.round(evidence.points[real], 9), axis=0, return_index=True, return_inverse=True
    )
    inverse = inverse.ravel()
    scores = evidence.scores[real]
    counts = np.bincount(inverse)
    means = np.bincount(inverse, weights=scores) / counts
    rows = real[first]
    pooled = _recent_noise(scores, means, counts, inverse)
    noise = None
    if pooled is not None:
        # Noise in absolute terms, or relative to the value (measurements such as throughput
        # are noisy in percent): whichever says less at the level of the best point.
        noise = min(pooled[0], pooled[1] * abs(float(np.max(means))))
    elif prior_noise is not None:
        noise = prior_noise * abs(float(np.max(means)))
    top = int(np.argmax(means))
    if noise is None:
        repeated = counts >= 2
        if repeated.any():
            center = int(np.flatnonzero(repeated)[np.argmax(means[repeated])])
        else:
            center = int(np.argmin(first))  # no repeat yet: the first point stands
    else:
        center = int(np.argmax(means - confidence * noise / np.sqrt(counts)))
    # Only a point measured once is worth re-measuring; beyond that trust the bound.
    if counts[top] >= 2:
        top = center
    return int(rows[center]), int(rows[top]), noise


def _recent_noise(
    scores: np.ndarray, means: np.ndarray, counts: np.ndarray, inverse: np.ndarray
) -> tuple[float, float] | None:
    """(absolute, relative) pooled noise of the most recently repeated points; None below 2 dof.

    Recent, because noise often scales with the value: the repeats made near the current center
    say more about its noise than those made far away at the start.
    """
    repeated = np.flatnonzero(counts >= 2)
    if repeated.size == 0:
        return None
    last_row = np.zeros(len(counts), dtype=int)
    np.maximum.at(last_row, inverse, np.arange(len(inverse)))
    recent = repeated[np.argsort(-last_row[repeated])][:RECENT_REPEATS]
    members = np.isin(inverse, recent)
    dof = int(np.sum(counts[recent] - 1))
    if dof < 2:
        return None
    residuals = scores[members] - means[inverse[members]]
    levels = np.maximum(np.abs(means[inverse[members]]), 1e-300)
    return (float(np.sqrt(np.sum(residuals**2) / dof)),
            float(np.sqrt(np.sum((residuals / levels) ** 2) / dof)))


def sensitivities(evidence: Evidence) -> np.ndarray:
    """Per coordinate, the largest score change a move along it produced (NaN: never moved)."""
    rows = np.flatnonzero(
        (evidence.kinds == REAL) & (evidence.moved >= 0) & (evidence.centers >= 0)
    )
    changes = evidence.scores[rows] - evidence.scores[evidence.centers[rows]]
    return largest_change(evidence.moved[rows], changes, evidence.points.shape[1])


def largest_change(coordinates: np.ndarray, changes: np.ndarray, d: int) -> np.ndarray:
    """Per coordinate, the largest ``|change|`` of the moves along it; NaN where none.

    Args:
        coordinates: ``(m,)`` coordinate index each move changed (others are ignored).
        changes: ``(m,)`` the score change each produced (non-finite ones are ignored).
        d: Number of coordinates.
    """
    out = np.full(d, np.nan)
    ok = np.isfinite(changes) & (coordinates >= 0) & (coordinates < d)
    np.fmax.at(out, coordinates[ok], np.abs(changes[ok]))  # fmax: NaN (none yet) loses
    return out


def step_size(evidence: Evidence, settings: Settings, i: int, margin: float = 0.0) -> float:
    """From the last move along ``i``: double after a success, keep after a tie (a flat
    coordinate is explored widely by restarts), halve after a miss or a failure."""
    rows = np.flatnonzero((evidence.moved == i) & (evidence.centers >= 0))
    if rows.size == 0:
        return settings.initial_step
    row = rows[-1]
    center = evidence.centers[row]
    distance = abs(evidence.points[row, i] - evidence.points[center, i])
    kind = evidence.kinds[row]
    change = evidence.scores[row] - evidence.scores[center]
    if kind == REAL and change >= -margin:
        distance *= 2.0
    elif kind == FAILED or (kind == REAL and change < -margin):
        distance *= 0.5
    return float(np.clip(distance, settings.min_step, 0.5))


def _is_taken(point: np.ndarray, others: np.ndarray) -> bool:
    return bool(others.size) and bool(np.any(np.all(np.abs(others - point) <= _SAME, axis=1)))


def _same_point_rows(evidence: Evidence, row: int) -> np.ndarray:
    same = np.all(np.abs(evidence.points - evidence.points[row]) <= _SAME, axis=1)
    return same & (evidence.kinds == REAL)
