"""Stochastic coordinate descent in the unit cube: pure numpy, no Optuna.

One call of :func:`plan_move` decides one trial from the evidence gathered so far (every trial
of the structure being refined, as rows of arrays). Nothing is remembered between calls: the
center, the per-coordinate step sizes and the coordinate cycle are all recomputed from the rows,
which is what lets the sampler resume from storage and run on many workers.

The rule, per trial:

1. **Center**: the measured point with the best lower confidence bound ``mean - k*sigma/sqrt(n)``
   (sigma pooled from repeated measurements). A single measurement that beats the center by less
   than the noise is re-measured first (``confirm``) instead of being chased; so is a center
   that owes its place to one noisy measurement and has resisted ``2d + 2`` moves (the best of
   many noisy measurements is biased upwards, and every honest neighbour then looks worse).
   Next to a wall, a point tied with the center (within the noise) farther from the failure on
   the same line takes its place (``headroom_center``): a knob that does not change the score
   but bounds another (memory fraction against batch size) then leaves the other knob room.
2. **Coordinate**: the line being searched stays until resolved; then the next coordinate in
   cyclic order (default), uniformly at random, or weighted by the score change each produced.
   In the ``coordinate`` benchmark (20 seeds, median trials to 99 %) no rule wins everywhere:
   cyclic / random / sensitivity take sphere 16 / 19 / 18, ellipsoid 31 / 30 / 29.5, coupled
   78 / 90.5 / 89.5, Rosenbrock 56 / 67 / 65.5, throughput 62 / 67 / 49, llm_training 2 / 2 /
   2, llm_serving 24.5 / 34.5 / 21 (seeds 20-39: 18 / - / 23). Cyclic has the lowest total and
   wins the two hardest (coupled, Rosenbrock), and is the simplest to reason about, so it is
   the default.
3. **Line search** on the line through the center along that coordinate: probe one side (the
   direction of the estimated slope), then the other; once bracketed, jump to the vertex of the
   parabola through the center and its two neighbours, unless the parabola promises less than the
   noise margin there (a step nobody could tell from the center). Steps double after a success or a
   tie within the noise (a step too small to see the slope says nothing), halve after a clear loss
   or a failure. Failed points are walls: a probe that would reach one bisects between the center
   and the wall, and no point at or beyond a failure is proposed again. A bracket flat within the
   noise (a plateau) is probed further out before it counts as resolved; a line whose last vertex
   tied with the center is resolved (on a staircase the parabola's vertex is noise, and chasing it
   cost llm_serving ~6 trials per line). The first probe reaches at least as far as the center
   travelled along the other knobs since the line was last searched (a step shrunk on a line
   elsewhere says nothing about this one), unless failures bound the knob.
4. **Pattern** (``pattern.py``): when every coordinate line is resolved, a line search along the
   way the center travelled over its last ``d`` moves (Hooke-Jeeves), from ``t = 1``, bisecting
   towards failures; a center found this way continues along its longer travel first.
5. **Ties** (``ties.py``): each line's best probe that tied with the center (within the
   noise) or beat it, all in one point, once per center: under noise a center that owes its
   place to a lucky measurement makes a gain of a few percent on one knob read as a tie, and
   two such gains together are clear (``llm_serving``, AutoScout at 100 trials, paired over
   seeds 0-79 and held-out seeds 80-199: +0.003 and +0.005 of the optimum).
6. **Plateau** (``plateau.py``): knobs whose line searches all ended in ties (flat within the
   noise over a wide interval) are redrawn together within those intervals: a staircase whose
   next stair needs two flat knobs moved at once (a serving engine's sequence cap and token
   budget) is invisible to single-coordinate moves and to a quadratic fit.
7. **Model** (``model.py``): then the best point, within the region its data covers, of a
   quadratic fitted to the points around the center: its cross terms see curved valleys and
   coupled knobs that no axis move can. Until a trial fails, the model is also asked each
   time a coordinate line is resolved (a center it finds continues with the model): in 10-D a
   cycle of lines costs ~40 trials, and coupled knobs gain little per line (``coupled``
   benchmark, cd-cyclic: 4/10 -> 8/10 seeds to 99%; ``rosenbrock`` 8/10 -> 10/10). A model
   point waits for new points around its center before the next one.
8. **Slide**: when the center is pressed against a wall (a failed neighbour along one
   coordinate), try that neighbour's value with one other coordinate moved: constraints that
   couple knobs (batch size against memory) are followed instead of stopping at them.
9. **Restart**: perturb all coordinates around the center, each on the scale of its last step,
   a scale that doubles with each unsuccessful restart (1x ... 8x, then 1x again; wider was
   uniform sampling piled up on the bounds), reflected at the bounds.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._coordinate.evidence import (
    ESTIMATE,
    FAILED,
    MAX_LINE_STEPS,
    MODEL,
    OFF_AXIS,
    PATTERN,
    PENDING,
    PLATEAU,
    REAL,
    RULES,
    SLIDE,
    TIES,
    Evidence,
    Move,
    Settings,
    Snap,
    _is_taken,
    _same_point_rows,
    choose_center,
    largest_change,
    lines_through,
    margin_of,
    point_mean,
    sensitivities,
    snap_point,
    step_size,
)
from autoscout_optuna.samplers._coordinate.model import model_proposal
from autoscout_optuna.samplers._coordinate.moves import (
    _likely_infeasible,
    headroom_center,
    line_proposal,
    parabola_vertex,
    wall_slide,
)
from autoscout_optuna.samplers._coordinate.pattern import pattern_proposal
from autoscout_optuna.samplers._coordinate.plateau import plateau_proposal
from autoscout_optuna.samplers._coordinate.prior import Prior
from autoscout_optuna.samplers._coordinate.prior import cycle as prior_cycle
from autoscout_optuna.samplers._coordinate.ties import tied_combination

#: Parabola vertices in a row that tie with the center (within the noise) before a line counts
#: as resolved. One is enough since the model moves between lines (coordinate suite, 20 seeds,
#: against two: coupled 106 -> 95.5, llm_serving 45 -> 36.5, throughput 13/20 -> 17/20 seeds).
VERTEX_TIES = 1

__all__ = [
    "ESTIMATE", "FAILED", "MODEL", "OFF_AXIS", "PATTERN", "PENDING", "PLATEAU", "REAL", "RULES",
    "SLIDE", "TIES", "Evidence", "Move", "Prior", "Settings", "Snap",
    "choose_center", "coordinate_order", "largest_change", "line_proposal", "parabola_vertex",
    "plan_move", "sensitivities", "step_size",
]


def plan_move(
    evidence: Evidence,
    settings: Settings,
    rng: np.random.Generator,
    snap: Snap | None = None,
    start: np.ndarray | None = None,
    prior: Prior | None = None,
) -> Move:
    """Decide the next point. ``snap(i, u)`` rounds coordinate ``i`` to its grid (ints/steps).

    ``prior`` is what the study's other structures tell this one (``prior.py``): which knobs
    to search first, and the measurement noise before this structure repeated a point.
    """
    prior = prior or Prior()
    snap = snap or (lambda i, u: float(np.clip(u, 0.0, 1.0)))
    points, kinds = evidence.points, evidence.kinds
    d = points.shape[1]
    real = np.flatnonzero(kinds == REAL)
    if real.size == 0:
        if len(kinds) == 0 and start is not None:
            return Move("startup", snap_point(snap, start))
        # The start point is taken (failed or still running elsewhere): try a random one.
        return Move("startup", snap_point(snap, rng.random(d)))
    center, top, noise = choose_center(evidence, settings.confidence, prior.noise)
    pending = points[kinds == PENDING]
    # A re-measure the pruner turned into an estimate was judged already (not promising):
    # asking again would only be pruned again, so such a point is not confirmed twice.
    judged = points[kinds == ESTIMATE]
    if top != center and not _is_taken(points[top], pending) and not _is_taken(points[top], judged):
        return Move("confirm", points[top].copy(), center=center, noise=noise)
    if _stalled_on_one_measurement(evidence, center, noise, d) and not _is_taken(
        points[center], pending
    ) and not _is_taken(points[center], judged):
        return Move("confirm", points[center].copy(), center=center, noise=noise)
    margin = margin_of(noise, settings)
    if settings.headroom:
        center = headroom_center(evidence, settings, center, margin)
    c = points[center]
    score_c = point_mean(evidence, center)
    n_diff, diff_coord = lines_through(points, c)
    failed, feasible = points[kinds == FAILED], points[(kinds == REAL) | (kinds == ESTIMATE)]

    def off_axis(phase: str, proposal: tuple[float, np.ndarray] | None) -> Move | None:
        """A move off the axes, unless it lies beyond (or nearest to) a known failure."""
        if proposal is None or _likely_infeasible(
            proposal[1], c, failed, feasible, settings.wall_radius
        ):
            return None
        return Move(phase, proposal[1], OFF_AXIS[phase], proposal[0], None, center, noise)

    def pattern() -> Move | None:
        return off_axis("pattern", pattern_proposal(evidence, center, score_c, snap, depth=d))

    def fitted() -> Move | None:
        return off_axis("model", model_proposal(evidence, center, snap, margin))

    # Momentum: a center a pattern (model) move found continues along its travel (model).
    if evidence.moved[center] == PATTERN and (move := pattern()) is not None:
        return move
    if evidence.moved[center] == MODEL and (move := fitted()) is not None:
        return move
    order = coordinate_order(evidence, settings, rng, center, prior.priority)
    # Between lines, a model point: ten-odd trials per coordinate cycle leave coupled knobs to
    # crawl, and the fit sees the coupling. A quadratic cannot describe a wall, though: once a
    # trial failed, the model waits until every line is resolved (below).
    between_lines = not np.any(kinds == FAILED)
    for i in order:
        if between_lines and i != order[0]:
            between_lines = False  # the line moved last is resolved: ask the model once
            if (move := fitted()) is not None:
                return move
        on_line = (n_diff == 0) | (diff_coord == i)
        from_here = (evidence.moved == i) & (evidence.centers == center)
        if np.sum(from_here) >= MAX_LINE_STEPS:
            continue  # noise keeps moving the vertex: enough on this line
        vertices = np.flatnonzero(from_here & evidence.vertex & (kinds == REAL))
        if vertices.size >= VERTEX_TIES and np.all(
            np.abs(evidence.scores[vertices[-VERTEX_TIES:]] - score_c) <= margin
        ):
            continue  # the vertices tied with the center: the noise hides the rest of this line
        step = _line_step(evidence, settings, i, c, margin)
        proposal = line_proposal(evidence, settings, i, c, score_c, on_line, step, snap, margin)
        if proposal is None:
            continue
        u, phase, slope = proposal
        point = c.copy()
        point[i] = u
        # Running elsewhere, judged by the pruner, or known to fail: never proposed again.
        if _is_taken(point, points[(kinds == PENDING) | (kinds == ESTIMATE) | (kinds == FAILED)]):
            continue
        return Move(phase, point, i, float(u - c[i]), slope, center, noise)
    # Every coordinate line is resolved: follow the way the center travelled (a valley).
    if (move := pattern()) is not None:
        return move
    # Probes that tied with the center on several lines, together (``ties.py``).
    if (move := off_axis("ties", tied_combination(evidence, center, score_c, margin, snap))) \
            is not None:
        return move
    # Knobs each flat around the center: redraw them together (the next stair of a staircase).
    if (move := off_axis("plateau", plateau_proposal(
        evidence, center, score_c, margin, snap, rng
    ))) is not None:
        return move
    # Then the best point of a quadratic fitted around the center (sees coupled knobs).
    if (move := fitted()) is not None:
        return move
    slide = wall_slide(evidence, settings, c, center, snap, margin)
    if slide is not None:
        i, point = slide
        return Move("slide", point, i, float(point[i] - c[i]), None, center, noise)
    n_restarts = int(np.sum(evidence.restarts & (evidence.centers == center)))
    # Per coordinate, on the scale its line search ended at: an ill-conditioned problem gets a
    # narrow perturbation along its steep knobs. Widen with each miss, then start small again.
    scales = np.array([step_size(evidence, settings, i, margin) for i in range(d)])
    radius = float(2.0 ** (n_restarts % 4) * settings.restart_radius)
    spread = np.minimum(radius * scales, 0.5)
    fresh = None
    for _ in range(16):  # a restart does not jump over a known wall either
        raw = c + rng.normal(0.0, 1.0, size=d) * spread
        raw = np.abs(raw) - 2.0 * np.maximum(np.abs(raw) - 1.0, 0.0)  # reflect at the bounds
        raw = np.clip(raw, 0, 1)
        point = snap_point(snap, raw)
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


def _line_step(
    evidence: Evidence, settings: Settings, i: int, c: np.ndarray, margin: float
) -> float:
    """First probe distance along ``i``: its adapted step, or farther when the center has moved
    farther along the other knobs since ``i`` was last searched.

    A step shrunk to where the old line's vertex was says nothing about a line that runs
    elsewhere now: on a staircase the next stair along ``i`` may have come within reach
    (a serving engine's token budget matters only once the sequence cap was raised).
    """
    step = step_size(evidence, settings, i, margin)
    rows = np.flatnonzero((evidence.moved == i) & (evidence.centers >= 0))
    if rows.size == 0 or evidence.points.shape[1] < 2:
        return step
    if np.any(evidence.kinds[rows] == FAILED):
        return step  # a knob bounded by failures: a longer probe would find the wall again
    then = evidence.points[evidence.centers[rows[-1]]]
    travelled = float(np.max(np.abs(np.delete(c - then, i))))
    return float(np.clip(max(step, travelled), settings.min_step, 0.5))


def coordinate_order(
    evidence: Evidence, settings: Settings, rng: np.random.Generator, center: int,
    priority: np.ndarray | None = None,
) -> list[int]:
    """Coordinates in the order they are tried for this trial.

    The coordinate moved last comes first: a line search runs until its line is resolved (one
    exact line search per coordinate, the classic form of coordinate descent). The rule orders
    the rest: cyclic after the last one, uniformly random, or weighted by sensitivity. With a
    ``priority`` the cycle runs from the highest to the lowest (see ``prior.cycle``).
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
    elif (cycle := prior_cycle(priority)) is not None:
        first = cycle.index(last) + 1 if last >= 0 else 0
        order = [cycle[(first + k) % d] for k in range(d)]
    else:
        # Before any move, the cycle starts at a random coordinate: the order params are
        # declared in (or named in) says nothing about which knob matters, and a fixed start
        # would spend every study's first line searches on the same, possibly flat, knob.
        first = last + 1 if last >= 0 else int(rng.integers(d))
        order = [(first + k) % d for k in range(d)]
    if last < 0:
        return order
    return [last] + [i for i in order if i != last]


def _stalled_on_one_measurement(
    evidence: Evidence, center: int, noise: float | None, d: int
) -> bool:
    """Whether a noisy center, measured once, has already resisted ``2 d + 2`` moves.

    The best of many noisy measurements is biased upwards (the winner's curse): a center that
    owes its place to one lucky measurement makes every honest neighbour look worse, and the
    search stalls around it. Measuring it again is cheaper than the moves it would waste.
    """
    if noise is None or noise <= 0.0:
        return False
    if int(np.sum(_same_point_rows(evidence, center))) >= 2:
        return False
    return int(np.sum(evidence.centers == center)) >= 2 * d + 2
