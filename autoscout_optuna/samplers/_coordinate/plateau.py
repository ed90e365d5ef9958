"""Plateau moves: jointly redraw the knobs each found flat around the center.

System throughput is often a staircase: a knob changes nothing over a wide range (every line
search along it ends in a tie), and the next stair needs two such knobs moved together (a
serving engine gains a batch level only when both the sequence cap and the token budget allow
it). No single-coordinate move sees that, and a quadratic fitted to flat data promises nothing.
Moving inside a plateau costs nothing, though: the knobs known to be flat are redrawn together,
each uniformly between the first clearly different measurements on either side of the tied
span its line searches saw (where the next stair may start), the rest held. A point that is
better is then confirmed and becomes the center as usual. On ``llm_serving`` with its layout
fixed this took cd-cyclic from 5/10 to 6/10 seeds reaching 99 % (with the other staircase
fixes of that change, 164.5 -> 37 trials). Pure numpy.
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
    lines_through,
    snap_point,
)

MIN_FLAT_WIDTH = 0.1  # unit-cube width a tied interval needs before its knob counts as flat
TRIES_PER_FLAT_KNOB = 3  # plateau points around one center, per flat knob (at least two knobs)
_DRAWS = 16  # redraws when a point snaps onto one already tried


def flat_intervals(
    evidence: Evidence, center: int, score_c: float, margin: float
) -> dict[int, tuple[float, float]]:
    """Per coordinate found flat: where to redraw it, as a unit-cube interval.

    The plateau's level is the median of the measurements on the lines through the center:
    the center's own mean is biased upwards (it won its place among many noisy measurements),
    and against it every honest neighbour would look lower. Measurements within ``margin`` of
    that level are ties. Line searches of earlier centers count as well as the current one's,
    if their typical point is at the plateau's level. Walking out from the center's value, the
    ties span the plateau; the interval reaches on to the first clearly different measurement
    (or the bound) on each side: the next stair usually starts just beyond the span a line
    search saw, where nothing was measured yet.
    """
    points, kinds, scores = evidence.points, evidence.kinds, evidence.scores
    c = points[center]
    real = kinds == REAL
    through_center = real & (lines_through(points, c)[0] <= 1)
    level = float(np.median(scores[through_center])) if through_center.any() else score_c
    tied_score = np.abs(scores - level) <= margin
    real_rows = np.flatnonzero(real)
    out: dict[int, tuple[float, float]] = {}
    for i in range(points.shape[1]):
        # A line whose typical point is not at the center's level lies elsewhere in the
        # landscape (one noisy point on it may still look tied).
        lines = _lines(points, real_rows, i)
        rows = np.concatenate(
            [line for line in lines if abs(np.median(scores[line]) - level) <= margin]
            or [np.zeros(0, dtype=int)]
        )
        values, tied = points[rows, i], tied_score[rows]
        low = high = float(c[i])
        bounds = [0.0, 1.0]
        for k, side in enumerate((-1.0, 1.0)):
            ahead = (values - c[i]) * side > _SAME
            order = np.argsort((values[ahead] - c[i]) * side, kind="stable")
            for value, ok in zip(values[ahead][order], tied[ahead][order], strict=True):
                if not ok:  # the plateau ends at the first clearly different measurement
                    bounds[k] = float(value)
                    break
                low, high = min(low, float(value)), max(high, float(value))
        if high - low >= MIN_FLAT_WIDTH:
            out[i] = (bounds[0], bounds[1])
    return out


def _lines(points: np.ndarray, rows: np.ndarray, i: int) -> list[np.ndarray]:
    """Groups (two or more) of ``rows`` whose points differ only in coordinate ``i``."""
    if rows.size == 0:
        return []
    rest = np.round(np.delete(points[rows], i, axis=1), 6)
    _, inverse, counts = np.unique(rest, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    return [rows[inverse == g] for g in np.flatnonzero(counts >= 2)]


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
