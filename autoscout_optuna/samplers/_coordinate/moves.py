"""Where to look next along a line, beside a wall, or around a resolved center.

Pure numpy, no Optuna: the geometry of the moves ``search.plan_move`` chooses between.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    _SAME,
    FAILED,
    MAX_FAILED_SLIDES,
    REAL,
    SLIDE,
    Evidence,
    Settings,
    Snap,
    _is_taken,
    lines_through,
    point_mean,
    step_size,
)


def line_proposal(
    evidence: Evidence,
    settings: Settings,
    i: int,
    c: np.ndarray,
    score_c: float,
    on_line: np.ndarray,
    step: float,
    snap: Snap,
    noise_margin: float = 0.0,
) -> tuple[float, str, float | None] | None:
    """Next value of coordinate ``i`` on the line through ``c``, or None if it is resolved.

    A bracket whose sides are within ``noise_margin`` of the center is resolved too: the noise
    hides where the vertex is. So is one whose parabola promises less than ``noise_margin``
    at its vertex: the step could not be told from the center (coordinate suite, cd-cyclic, 20
    seeds, median trials to 99 %: llm_serving 30 -> 24.5, seeds 20-39 27 -> 18; coupled 94 ->
    78; throughput 73.5 -> 62; sphere 18 -> 16; Rosenbrock 53.5 -> 56).
    """
    u_c = float(c[i])
    kinds, points = evidence.kinds, evidence.points
    us = points[on_line & (kinds == REAL), i]
    ys = evidence.scores[on_line & (kinds == REAL)]
    away = np.abs(us - u_c) > _SAME
    us, ys = us[away], ys[away]
    lo_wall, hi_wall = _walls(evidence, settings, i, c)
    lo, hi = max(0.0, lo_wall), min(1.0, hi_wall)
    left, right = us < u_c, us > u_c
    slope = local_slope(evidence, settings, i, c, score_c)
    if left.any() and right.any():
        u_l = us[left].max()
        u_r = us[right].min()
        y_l = ys[left][us[left] == u_l].mean()
        y_r = ys[right][us[right] == u_r].mean()
        if y_l > score_c or y_r > score_c:
            return None  # the center is not the line's best yet: wait for it to move
        if max(score_c - y_l, score_c - y_r) < noise_margin:
            # Flat within the noise: a plateau, or steps too small to see the slope. Look
            # further out (doubling the farthest tie's distance) before calling it resolved.
            # Not towards a wall: a flat score there only costs failures.
            return _beyond_flat(us, ys, u_c, score_c, lo if np.isinf(lo_wall) else u_c,
                                hi if np.isinf(hi_wall) else u_c, noise_margin, snap, i, slope,
                                settings.min_step)
        vertex = parabola_vertex(u_l, y_l, u_c, score_c, u_r, y_r)
        if vertex is None:  # flat or convex: split the wider side (noiseless only: with noise,
            # the gain check below resolves the line, as such a triple promises no gain)
            vertex = (u_c + u_l) / 2 if u_c - u_l > u_r - u_c else (u_c + u_r) / 2
        vertex = float(np.clip(vertex, u_l, u_r))
        if noise_margin > 0.0 and (
            parabola_at(vertex, (u_l, y_l), (u_c, score_c), (u_r, y_r)) - score_c < noise_margin
        ):
            # The parabola promises less than the noise lets a measurement show: a vertex step
            # could not be told from the center, only walk on the noise (llm_serving spent up
            # to 5 trials per line refining a flat bracket down to 0.4 % of the range).
            return None
        if abs(vertex - u_c) < max(settings.min_step, settings.resolve_fraction * (u_r - u_l)):
            return None
        return _unless_measured(snap(i, vertex), i, u_c, us, "step", slope)
    if left.any() or right.any():
        direction = 1.0 if left.any() else -1.0  # the unexplored side
    elif slope is not None and slope != 0.0:
        direction = float(np.sign(slope))
    else:
        direction = 1.0 if _towards_middle(c, i) else -1.0
    room = (hi - u_c) if direction > 0 else (u_c - lo)
    if room < settings.min_step:
        if left.any() or right.any():
            return None  # at a bound or wall, and the other side is worse: resolved
        direction, room = -direction, (u_c - lo) if direction > 0 else (hi - u_c)
        if room < settings.min_step:
            return None
    wall = hi_wall if direction > 0 else lo_wall
    distance = min(step, room)
    if np.isfinite(wall) and abs(wall - u_c) <= distance + _SAME:
        distance = abs(wall - u_c) / 2  # step back from the wall and shrink
    target = u_c + direction * distance
    snapped = snap(i, target)
    for _ in range(8):  # an integer knob: go at least one grid step
        if abs(snapped - u_c) > _SAME:
            break
        distance *= 2
        snapped = snap(i, u_c + direction * min(distance, room))
    if np.isfinite(wall) and (snapped - wall) * direction >= -_SAME:
        return None
    return _unless_measured(snapped, i, u_c, us, "probe", slope)


def _beyond_flat(
    us: np.ndarray, ys: np.ndarray, u_c: float, score_c: float, lo: float, hi: float,
    margin: float, snap: Snap, i: int, slope: float | None, min_step: float,
) -> tuple[float, str, float | None] | None:
    """A probe twice as far as the farthest tie on the less explored side, None if none.

    ``lo`` and ``hi`` bound the probe (a side with a wall is passed as no room at all).
    """
    sides = []
    for side in (-1.0, 1.0):
        mine = (us - u_c) * side > 0
        far = float(np.max((us[mine] - u_c) * side))
        tie = ys[mine][np.argmax((us[mine] - u_c) * side)] >= score_c - margin
        room = (hi - u_c) if side > 0 else (u_c - lo)
        if tie and room - far >= min_step:
            sides.append((far, side, min(2.0 * far, room)))
    for _, side, distance in sorted(sides):
        probe = _unless_measured(snap(i, u_c + side * distance), i, u_c, us, "probe", slope)
        if probe is not None:
            return probe
    return None


def parabola_at(
    u: float, left: tuple[float, float], middle: tuple[float, float], right: tuple[float, float]
) -> float:
    """Value at ``u`` of the parabola through three ``(u, score)`` points (distinct ``u``)."""
    (a, fa), (b, fb), (c, fc) = left, middle, right
    return float(
        fa * (u - b) * (u - c) / ((a - b) * (a - c))
        + fb * (u - a) * (u - c) / ((b - a) * (b - c))
        + fc * (u - a) * (u - b) / ((c - a) * (c - b))
    )


def parabola_vertex(a: float, fa: float, b: float, fb: float, c: float, fc: float) -> float | None:
    """Maximum of the parabola through three points, None when it is not concave."""
    p = (b - a) * (fb - fc)
    q = (b - c) * (fb - fa)
    denominator = p - q
    numerator = (b - a) * p - (b - c) * q
    if denominator >= -1e-300 and denominator <= 1e-300:
        return None
    # Concave iff the middle point is above the chord between the outer points.
    chord = fa + (fc - fa) * (b - a) / (c - a) if c != a else fa
    if fb <= chord:
        return None
    return float(b - 0.5 * numerator / denominator)


def local_slope(
    evidence: Evidence, settings: Settings, i: int, c: np.ndarray, score_c: float
) -> float | None:
    """Least-squares slope of the score along ``i`` from real points that differ mainly in ``i``."""
    real = evidence.kinds == REAL
    delta = evidence.points - c
    along = delta[:, i]
    rest = np.delete(np.abs(delta), i, axis=1)
    others = rest.max(axis=1) if rest.shape[1] else np.zeros(len(along))
    near = real & (np.abs(along) > _SAME) & (others <= settings.wall_radius)
    if not near.any():
        return None
    dx, dy = along[near], evidence.scores[near] - score_c
    weights = 1.0 / (1.0 + others[near] / max(settings.wall_radius, 1e-12))
    return float(np.sum(weights * dx * dy) / np.sum(weights * dx * dx))


def headroom_center(evidence: Evidence, settings: Settings, center: int, margin: float) -> int:
    """The center, or a point tied with it (within ``margin``) farther from a wall on its line.

    A knob that does not change the score but bounds another one (the memory fraction against
    the batch size that still fits) leaves the center wherever it was first measured, often
    next to the wall, where the other knob has no room. Among points equally good within the
    noise, the one with the most room from the failure is the better place to search from.
    """
    points, kinds = evidence.points, evidence.kinds
    if not np.any(kinds == FAILED) or margin <= 0.0:
        return center
    c = points[center]
    score_c = point_mean(evidence, center)
    _, along = lines_through(points, c)
    for i in range(points.shape[1]):
        lo_wall, hi_wall = _walls(evidence, settings, i, c)
        if np.isfinite(lo_wall) == np.isfinite(hi_wall):
            continue  # no wall on this line, or walls on both sides
        away = 1.0 if np.isfinite(lo_wall) else -1.0
        rows = np.flatnonzero(
            (along == i) & (kinds == REAL) & ((points[:, i] - c[i]) * away > 0)
            & (evidence.scores >= score_c - margin)
        )
        if rows.size:
            return int(rows[np.argmax((points[rows, i] - c[i]) * away)])
    return center


def wall_slide(
    evidence: Evidence, settings: Settings, c: np.ndarray, center: int, snap: Snap, margin: float
) -> tuple[int, np.ndarray] | None:
    """Slide along a wall the center is pressed against: the failed neighbour's value of the
    blocked coordinate ``j``, with one other coordinate ``i`` moved by its step either way.

    The optimum of a throughput-like objective often sits on a constraint that couples knobs
    (batch size against memory fraction): no single coordinate can move, a pair can. Returns
    ``(i, point)`` or None when there is no wall next to the center or every slide was tried.
    """
    points, kinds = evidence.points, evidence.kinds
    failed = np.flatnonzero(kinds == FAILED)
    if failed.size == 0:
        return None
    _, along = lines_through(points, c)
    failed_along = along[failed]
    d = points.shape[1]
    tried = points[kinds != FAILED]
    tried_failed = points[failed]
    real = kinds == REAL
    score_c = point_mean(evidence, center)
    nearest: dict[tuple[int, float], int] = {}  # (coordinate, side) -> nearest failed row
    on_a_line = failed_along >= 0
    for row, j in zip(failed[on_a_line].tolist(), failed_along[on_a_line].tolist(), strict=True):
        key = (j, float(np.sign(points[row, j] - c[j])))
        if key not in nearest or abs(points[row, j] - c[j]) < abs(
            points[nearest[key], j] - c[j]
        ):
            nearest[key] = int(row)
    slid_into_wall = failed[evidence.moved[failed] == SLIDE]
    for (j, _), row in sorted(nearest.items(), key=lambda item: -item[1]):  # recent first
        # A wall that stopped every slide so far does not yield to the other knobs (a memory
        # fraction that fails whatever the batch): more slides would only fail again.
        at_wall = np.abs(points[slid_into_wall, j] - points[row, j]) <= _SAME
        if int(np.sum(at_wall)) >= MAX_FAILED_SLIDES:
            continue
        # Only a wall the score climbs towards: the line's other side is clearly worse.
        side = np.sign(points[row, j] - c[j])
        behind = real & (along == j) & ((points[:, j] - c[j]) * side < 0.0)
        if not np.any(evidence.scores[behind] < score_c - margin):
            continue
        for k in range(1, d):
            i = (j + k) % d
            step = step_size(evidence, settings, i, margin)
            for sign in (1.0, -1.0):
                point = points[row].copy()
                point[i] = snap(i, float(np.clip(c[i] + sign * step, 0.0, 1.0)))
                if abs(point[i] - c[i]) <= _SAME:
                    continue
                if _is_taken(point, tried) or _is_taken(point, tried_failed):
                    continue
                return i, point
    return None


def _likely_infeasible(
    point: np.ndarray, c: np.ndarray, failed: np.ndarray, feasible: np.ndarray, radius: float
) -> bool:
    """Whether ``point`` lies beyond a failed point seen from the center, or nearer a failure
    than any feasible point (a nearest-neighbour guess of the infeasible region)."""
    if not failed.size:
        return False
    nearest_failed = np.min(np.sum((failed - point) ** 2, axis=1))
    if not feasible.size or nearest_failed < np.min(np.sum((feasible - point) ** 2, axis=1)):
        return True
    towards = failed - c
    length2 = np.sum(towards**2, axis=1)
    ok = length2 > 0
    projection = (towards[ok] @ (point - c)) / length2[ok]
    off_axis = np.abs((point - c) - projection[:, None] * towards[ok]).max(axis=1)
    return bool(np.any((projection >= 1.0 - 1e-9) & (off_axis <= radius)))


def _towards_middle(c: np.ndarray, i: int) -> bool:
    """Direction for a line with no evidence at all: towards the middle of the range."""
    return bool(c[i] <= 0.5)


def _walls(
    evidence: Evidence, settings: Settings, i: int, c: np.ndarray
) -> tuple[float, float]:
    """Nearest infeasible values of coordinate ``i`` below and above the center."""
    failed = evidence.kinds == FAILED
    if not failed.any():
        return -np.inf, np.inf
    delta = evidence.points[failed] - c
    rest = np.delete(np.abs(delta), i, axis=1)
    near = rest.max(axis=1) <= settings.wall_radius if rest.shape[1] else np.ones(len(delta), bool)
    along = delta[near, i]
    below, above = along[along < -_SAME], along[along > _SAME]
    lo = c[i] + below.max() if below.size else -np.inf
    hi = c[i] + above.min() if above.size else np.inf
    return float(lo), float(hi)


def _unless_measured(
    u: float, i: int, u_c: float, measured: np.ndarray, phase: str, slope: float | None
) -> tuple[float, str, float | None] | None:
    if abs(u - u_c) <= _SAME or (measured.size and np.min(np.abs(measured - u)) <= _SAME):
        return None
    return float(u), phase, slope
