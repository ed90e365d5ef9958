"""Tied moves together: the probes that tied with the center on several lines, in one point.

Under measurement noise a line search calls a step a tie when it is within the noise margin of
the center, and a center that owes its place to a lucky measurement makes every honest gain of
a few percent read as one. Two such gains on two knobs are each invisible, yet together they
may be clearly better (``llm_serving``, 3 % noise: a structure whose center sat at 0.82 of the
optimum had tied probes at 0.85 on the memory fraction and on the sequence cap; both together
are 0.94). Once every line through the center is resolved, the best tied-or-better probe of
each line is combined into one point, tried once per center. Flat knobs move to another value
of their plateau, which costs nothing. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    REAL,
    TIES,
    Evidence,
    Snap,
    _is_taken,
    lines_through,
    snap_point,
)


def tied_combination(
    evidence: Evidence, center: int, score_c: float, margin: float, snap: Snap
) -> tuple[float, np.ndarray] | None:
    """``(knobs moved, point)``: the center with each line's best probe that scored within
    ``margin`` of ``score_c`` or better; None with fewer than two such lines, once tried from
    this center, or when the point was tried already."""
    if np.any((evidence.moved == TIES) & (evidence.centers == center)):
        return None
    points, scores = evidence.points, evidence.scores
    c = points[center]
    _, along = lines_through(points, c)
    real = evidence.kinds == REAL
    point, moved = c.copy(), 0
    for i in range(points.shape[1]):
        rows = np.flatnonzero(real & (along == i))
        if rows.size == 0:
            continue
        best = rows[int(np.argmax(scores[rows]))]
        if scores[best] >= score_c - margin:
            point[i] = points[best, i]
            moved += 1
    if moved < 2:
        return None
    point = snap_point(snap, point)
    if _is_taken(point, points):
        return None
    return float(moved), point
