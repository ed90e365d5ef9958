"""Pattern moves: a line search along the way the center travelled (Hooke-Jeeves, Powell).

Axis-aligned line searches crawl along a curved valley or a constraint that couples knobs: every
single coordinate is already at its best, yet moving two together gains. The displacement of
the center over its last few moves points along such a valley. A *pattern line* is the line
through the center along that displacement; it is searched like a coordinate line, in units of
the displacement ``t`` (``t = 1``: the classic Hooke-Jeeves pattern point ``c + (c - anchor)``):

1. no point on it yet: probe ``t = 1`` (or as far as the box allows);
2. a failed point on it is a wall: the next probe bisects between the center and the nearest
   failure, and nothing at or beyond a failure is proposed again;
3. measured points that are no better than the center: the vertex of the parabola through
   ``t = 0`` and the two nearest, else half the nearest distance.

A successful pattern point becomes the center; its own displacement then contains the jump, so
the next pattern line is longer (acceleration). Pure numpy, no Optuna.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    _SAME,
    FAILED,
    PATTERN,
    REAL,
    Evidence,
    Snap,
    _is_taken,
    snap_point,
)
from autoscout_optuna.samplers._coordinate.moves import parabola_vertex

MAX_PATTERN_STEPS = 2  # points along one pattern line before it counts as resolved
_MIN_T = 1.0 / 64.0  # shorter than this, the pattern line is resolved (the center is it)


def travel(evidence: Evidence, center: int, depth: int) -> np.ndarray | None:
    """The center minus the center ``depth`` moves before it; None without a diagonal travel.

    A travel along a single coordinate is what that coordinate's own line already searches, so
    only a displacement in two or more coordinates makes a pattern line.
    """
    row, steps = center, 0
    while steps < depth and evidence.centers[row] >= 0 and evidence.centers[row] != row:
        row = int(evidence.centers[row])
        steps += 1
    if row == center:
        return None
    displacement = evidence.points[center] - evidence.points[row]
    if np.sum(np.abs(displacement) > _SAME) < 2:
        return None
    return displacement


def pattern_proposal(
    evidence: Evidence, center: int, score_c: float, snap: Snap, depth: int
) -> tuple[float, np.ndarray] | None:
    """``(t, point)`` of the next probe on the center's pattern line, or None if it is resolved.

    ``t`` is the signed distance along the travel (recorded as the trial's step, which is how
    the points of this line are found again: same center, phase pattern).
    """
    direction = travel(evidence, center, depth)
    if direction is None:
        return None
    c = evidence.points[center]
    on_line = (evidence.moved == PATTERN) & (evidence.centers == center)
    if int(on_line.sum()) >= MAX_PATTERN_STEPS:
        return None
    ts = evidence.steps[on_line]
    kinds = evidence.kinds[on_line]
    reach = _box_reach(c, direction)
    failed_ts = ts[(kinds == FAILED) & (ts > 0)]
    wall = float(failed_ts.min()) if failed_ts.size else np.inf
    real = (kinds == REAL) & (ts > 0)
    ts_real, ys_real = ts[real], evidence.scores[on_line][real]
    if ts_real.size and np.max(ys_real) > score_c:
        return None  # a pattern point beat the center once: the confirmation decides
    if ts_real.size == 0:
        t = min(1.0, reach) if not np.isfinite(wall) else wall / 2.0
    else:
        order = np.argsort(ts_real)
        t = _shrink(ts_real[order], ys_real[order], score_c)
    t = min(t, reach, wall / 2.0 if np.isfinite(wall) else np.inf)
    if t < _MIN_T or (ts.size and np.min(np.abs(ts - t)) < _MIN_T / 2):
        return None
    point = snap_point(snap, c + t * direction)
    if np.max(np.abs(point - c)) <= _SAME or _is_taken(point, evidence.points):
        return None
    return t, point


def _shrink(ts: np.ndarray, ys: np.ndarray, score_c: float) -> float:
    """Next ``t`` when every measured point on the line is no better than the center."""
    if ts.size >= 2:
        vertex = parabola_vertex(0.0, score_c, float(ts[0]), float(ys[0]), float(ts[1]),
                                 float(ys[1]))
        if vertex is not None and 0.0 < vertex < ts[0]:
            return float(vertex)
    return float(ts[0]) / 2.0


def _box_reach(c: np.ndarray, direction: np.ndarray) -> float:
    """Largest ``t`` with ``c + t * direction`` inside the unit cube."""
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(direction > 0, (1.0 - c) / direction,
                        np.where(direction < 0, -c / direction, np.inf))
    return float(np.min(room))
