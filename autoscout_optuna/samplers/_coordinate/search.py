"""Stochastic coordinate descent in the unit cube: pure numpy, no Optuna.

One call of :func:`plan_move` decides one trial from the evidence gathered so far (every trial
of the structure being refined, as rows of arrays). Nothing is remembered between calls: the
center, the per-coordinate step sizes and the coordinate cycle are all recomputed from the rows,
which is what lets the sampler resume from storage and run on many workers.

The rule, per trial:

1. **Center**: the measured point with the best lower confidence bound ``mean - k*sigma/sqrt(n)``
   (sigma pooled from repeated measurements). A single measurement that beats the center by less
   than the noise is re-measured first (``confirm``) instead of being chased.
2. **Coordinate**: the line being searched stays until resolved; then the next coordinate in
   cyclic order (default), uniformly at random, or weighted by the score change each produced.
   The ``coordinate`` benchmark (10 seeds) has cyclic first or tied on 5 of 7 studies; the
   differences between the rules are within seed-to-seed spread, so the simplest one stays.
3. **Line search** on the line through the center along that coordinate: probe one side (the
   direction of the estimated slope), then the other; once bracketed, jump to the vertex of the
   parabola through the center and its two neighbours. Expanding steps double after a success,
   a step into an infeasible point halves: failed points are walls that are never crossed again.
4. **Slide**: when the center is pressed against a wall (a failed neighbour along one
   coordinate), try that neighbour's value with one other coordinate moved: constraints that
   couple knobs (batch size against memory) are followed instead of stopping at them.
5. **Restart**: when every line through the center is resolved, perturb all coordinates around the
   center, each on the scale of its last step, a scale that doubles with each unsuccessful
   restart (1x, 2x, 4x, 8x, then 1x again).
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    _SAME,
    ESTIMATE,
    FAILED,
    MAX_LINE_STEPS,
    PENDING,
    REAL,
    RULES,
    Evidence,
    Move,
    Settings,
    Snap,
    _is_taken,
    choose_center,
    margin_of,
    point_mean,
    sensitivities,
    step_size,
)
from autoscout_optuna.samplers._coordinate.moves import (
    _likely_infeasible,
    line_proposal,
    parabola_vertex,
    pattern_point,
    wall_slide,
)

__all__ = [
    "ESTIMATE", "FAILED", "PENDING", "REAL", "RULES", "Evidence", "Move", "Settings", "Snap",
    "choose_center", "coordinate_order", "line_proposal", "parabola_vertex", "plan_move",
    "sensitivities", "step_size",
]


def plan_move(
    evidence: Evidence,
    settings: Settings,
    rng: np.random.Generator,
    snap: Snap | None = None,
    start: np.ndarray | None = None,
) -> Move:
    """Decide the next point. ``snap(i, u)`` rounds coordinate ``i`` to its grid (ints/steps)."""
    snap = snap or (lambda i, u: float(np.clip(u, 0.0, 1.0)))
    points, kinds = evidence.points, evidence.kinds
    d = points.shape[1]
    real = np.flatnonzero(kinds == REAL)
    if real.size == 0:
        if len(kinds) == 0 and start is not None:
            return Move("startup", np.array([snap(i, u) for i, u in enumerate(start)]))
        # The start point is taken (failed or still running elsewhere): try a random one.
        return Move("startup", np.array([snap(i, u) for i, u in enumerate(rng.random(d))]))
    center, top, noise = choose_center(evidence, settings.confidence)
    pending = points[kinds == PENDING]
    # A re-measure the pruner turned into an estimate was judged already (not promising):
    # asking again would only be pruned again, so such a point is not confirmed twice.
    judged = points[kinds == ESTIMATE]
    if top != center and not _is_taken(points[top], pending) and not _is_taken(points[top], judged):
        return Move("confirm", points[top].copy(), center=center, noise=noise)
    c = points[center]
    score_c = point_mean(evidence, center)
    others_differ = np.abs(points - c) > _SAME
    n_diff = others_differ.sum(axis=1)
    diff_coord = np.where(n_diff == 1, others_differ.argmax(axis=1), -1)
    for i in coordinate_order(evidence, settings, rng, center):
        on_line = (n_diff == 0) | (diff_coord == i)
        if np.sum((evidence.moved == i) & (evidence.centers == center)) >= MAX_LINE_STEPS:
            continue  # noise keeps moving the vertex: enough on this line
        margin = margin_of(noise, settings)
        proposal = line_proposal(
            evidence, settings, i, c, score_c, on_line, step_size(evidence, settings, i, margin),
            snap, margin,
        )
        if proposal is None:
            continue
        u, phase, slope = proposal
        point = c.copy()
        point[i] = u
        if _is_taken(point, pending) or _is_taken(point, points[kinds == ESTIMATE]):
            continue
        return Move(phase, point, i, float(u - c[i]), slope, center, noise)
    slide = wall_slide(evidence, settings, c, center, snap, margin_of(noise, settings))
    if slide is not None:
        i, point = slide
        return Move("slide", point, i, float(point[i] - c[i]), None, center, noise)
    n_restarts = int(np.sum(evidence.restarts & (evidence.centers == center)))
    failed, feasible = points[kinds == FAILED], points[(kinds == REAL) | (kinds == ESTIMATE)]
    if n_restarts == 0:  # first, follow the way the center travelled (a curved valley)
        pattern = pattern_point(evidence, center, depth=d)
        if pattern is not None:
            point = np.array([snap(i, u) for i, u in enumerate(pattern)])
            if not _is_taken(point, points) and not _likely_infeasible(
                point, c, failed, feasible, settings.wall_radius
            ):
                return Move("restart", point, -1, 0.0, None, center, noise)
    # Per coordinate, on the scale its line search ended at: an ill-conditioned problem gets a
    # narrow perturbation along its steep knobs. Widen with each miss, then start small again.
    margin = margin_of(noise, settings)
    scales = np.array([step_size(evidence, settings, i, margin) for i in range(d)])
    radius = float(2.0 ** (n_restarts % 4) * settings.restart_radius)
    spread = np.minimum(radius * scales, 0.5)
    fresh = None
    for _ in range(16):  # a restart does not jump over a known wall either
        raw = np.clip(c + rng.normal(0.0, 1.0, size=d) * spread, 0, 1)
        point = np.array([snap(i, u) for i, u in enumerate(raw)])
        if _is_taken(point, points):
            # Knobs on a coarse grid (or a tiny scale) snap back onto a point already judged,
            # measured, pruned or running: repeating it would waste the trial. Look wider.
            spread = np.minimum(2.0 * spread + settings.min_step, 0.5)
            continue
        fresh = point
        if not _likely_infeasible(point, c, failed, feasible, settings.wall_radius):
            break
    if fresh is not None:
        point = fresh
    return Move("restart", point, -1, radius, None, center, noise)


def coordinate_order(
    evidence: Evidence, settings: Settings, rng: np.random.Generator, center: int
) -> list[int]:
    """Coordinates in the order they are tried for this trial.

    The coordinate moved last comes first: a line search runs until its line is resolved (one
    exact line search per coordinate, the classic form of coordinate descent). The rule orders
    the rest: cyclic after the last one, uniformly random, or weighted by sensitivity.
    """
    d = evidence.points.shape[1]
    moved = evidence.moved[evidence.moved >= 0]
    last = int(moved[-1]) if moved.size else -1
    if settings.rule == "random":
        order = [int(i) for i in rng.permutation(d)]
    elif settings.rule == "sensitivity":
        weights = sensitivities(evidence)
        weights = np.where(np.isnan(weights), np.nanmax(np.append(weights, 1.0)), weights)
        weights = weights + 0.1 * weights.max() + 1e-12
        keys = np.log(1.0 - rng.random(d)) / weights  # weighted order without replacement
        order = [int(i) for i in np.argsort(-keys)]
    else:
        # Before any move, the cycle starts at a random coordinate: the order params are
        # declared in (or named in) says nothing about which knob matters, and a fixed start
        # would spend every study's first line searches on the same, possibly flat, knob.
        first = last + 1 if last >= 0 else int(rng.integers(d))
        order = [(first + k) % d for k in range(d)]
    if last < 0:
        return order
    return [last] + [i for i in order if i != last]
