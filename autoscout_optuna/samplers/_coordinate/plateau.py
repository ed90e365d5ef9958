"""Plateau moves: jointly redraw the knobs each found flat around the center.

System throughput is often a staircase: a knob changes nothing over a wide range (every line
search along it ends in a tie), and the next stair needs two such knobs moved together (a
serving engine gains a batch level only when both the sequence cap and the token budget allow
it). No single-coordinate move sees that, and a quadratic fitted to flat data promises nothing.
Moving inside a plateau costs nothing, though: the knobs known to be flat are redrawn together,
each uniformly within the interval its line search measured as tied with the center, the rest
held. A point that is better is then confirmed and becomes the center as usual. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    _SAME,
    PLATEAU,
    REAL,
    Evidence,
    Snap,
    _is_taken,
    snap_point,
)

MIN_FLAT_WIDTH = 0.1  # unit-cube width a tied interval needs before its knob counts as flat
TRIES_PER_FLAT_KNOB = 3  # plateau points around one center, per flat knob (at least two knobs)
_DRAWS = 16  # redraws when a point snaps onto one already tried


def flat_intervals(
    evidence: Evidence, center: int, score_c: float, margin: float
) -> dict[int, tuple[float, float]]:
    """Per coordinate found flat: the interval, contiguous with the center, over which every
    measurement on the line through the center is tied with it (within ``margin``)."""
    points, kinds, scores = evidence.points, evidence.kinds, evidence.scores
    c = points[center]
    differ = np.abs(points - c) > _SAME
    n_differ = differ.sum(axis=1)
    out: dict[int, tuple[float, float]] = {}
    for i in range(points.shape[1]):
        rows = np.flatnonzero((kinds == REAL) & (n_differ == 1) & differ[:, i])
        if rows.size == 0:
            continue
        values, tied = points[rows, i], np.abs(scores[rows] - score_c) <= margin
        low = high = float(c[i])
        for side in (-1.0, 1.0):
            ahead = (values - c[i]) * side > 0
            order = np.argsort((values[ahead] - c[i]) * side)
            for value, ok in zip(values[ahead][order], tied[ahead][order], strict=True):
                if not ok:
                    break  # the plateau ends at the first clearly different point
                low, high = min(low, float(value)), max(high, float(value))
        if high - low >= MIN_FLAT_WIDTH:
            out[i] = (low, high)
    return out


def plateau_proposal(
    evidence: Evidence, center: int, score_c: float, margin: float, snap: Snap,
    rng: np.random.Generator,
) -> tuple[float, np.ndarray] | None:
    """``(distance, point)``: the flat knobs redrawn together, or None.

    None without a noise estimate (a tie means nothing yet), with fewer than two flat knobs
    (one flat knob is its own line search), or once ``TRIES_PER_FLAT_KNOB`` points per flat
    knob were tried around this center.
    """
    if margin <= 0.0:
        return None
    flat = flat_intervals(evidence, center, score_c, margin)
    if len(flat) < 2:
        return None
    tried = int(np.sum((evidence.moved == PLATEAU) & (evidence.centers == center)))
    if tried >= TRIES_PER_FLAT_KNOB * len(flat):
        return None
    c = evidence.points[center]
    knobs = np.array(sorted(flat))
    low = np.array([flat[i][0] for i in knobs])
    high = np.array([flat[i][1] for i in knobs])
    for _ in range(_DRAWS):
        point = c.copy()
        point[knobs] = low + rng.random(len(knobs)) * (high - low)
        point = snap_point(snap, point)
        if np.count_nonzero(np.abs(point - c) > _SAME) >= 2 and not _is_taken(
            point, evidence.points
        ):
            return float(np.max(np.abs(point - c))), point
    return None
