"""The pure coordinate-descent rule (``samplers/_coordinate/search.py``) on plain numbers."""

from __future__ import annotations

import numpy as np
import pytest

from autoscout_optuna.samplers._coordinate import search
from autoscout_optuna.samplers._coordinate.evidence import MAX_FAILED_SLIDES, SLIDE, lines_through
from autoscout_optuna.samplers._coordinate.model import _trust_region_step, model_proposal
from autoscout_optuna.samplers._coordinate.moves import parabola_at
from autoscout_optuna.samplers._coordinate.pattern import pattern_proposal
from autoscout_optuna.samplers._coordinate.plateau import flat_intervals
from autoscout_optuna.samplers._coordinate.search import (
    ESTIMATE,
    FAILED,
    PATTERN,
    PENDING,
    REAL,
    TIES,
    Evidence,
    Settings,
    choose_center,
    parabola_vertex,
    plan_move,
)
from autoscout_optuna.samplers._coordinate.ties import tied_combination


class Rows:
    """Build an :class:`Evidence` trial by trial, the way the sampler records moves."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.points: list[np.ndarray] = []
        self.scores: list[float] = []
        self.kinds: list[int] = []
        self.moved: list[int] = []
        self.centers: list[int] = []
        self.restarts: list[bool] = []
        self.steps: list[float] = []
        self.vertex: list[bool] = []

    def add(self, point, score=np.nan, kind=REAL, moved=-1, center=-1, restart=False,
            step=0.0, vertex=False) -> None:
        self.points.append(np.asarray(point, dtype=float))
        self.scores.append(float(score))
        self.kinds.append(kind)
        self.moved.append(moved)
        self.centers.append(center)
        self.restarts.append(restart)
        self.steps.append(float(step))
        self.vertex.append(bool(vertex))

    def add_move(self, move: search.Move, score: float, kind: int = REAL) -> None:
        moved = search.OFF_AXIS.get(move.phase, move.coordinate)  # as the sampler records it
        self.add(move.point, score, kind, moved, move.center, move.phase == "restart", move.step,
                 move.phase == "step")

    def evidence(self) -> Evidence:
        return Evidence(
            points=np.array(self.points, dtype=float).reshape(len(self.points), self.d),
            scores=np.array(self.scores, dtype=float),
            kinds=np.array(self.kinds, dtype=int),
            moved=np.array(self.moved, dtype=int),
            centers=np.array(self.centers, dtype=int),
            restarts=np.array(self.restarts, dtype=bool),
            steps=np.array(self.steps, dtype=float),
            vertex=np.array(self.vertex, dtype=bool),
        )


DEFAULTS = Settings()


def run(objective, d: int, n: int, settings: Settings = DEFAULTS, snap=None, seed: int = 0):
    """Drive plan_move for ``n`` trials on ``objective(point) -> score or None (infeasible)``."""
    rows = Rows(d)
    moves = []
    for number in range(n):
        move = plan_move(rows.evidence(), settings, np.random.default_rng([seed, number]),
                         snap=snap, start=np.full(d, 0.5))
        score = objective(move.point)
        rows.add_move(move, np.nan if score is None else score, FAILED if score is None else REAL)
        moves.append(move)
    return rows, moves


def test_parabola_vertex_is_exact_on_a_quadratic() -> None:
    f = lambda u: -3.0 * (u - 0.37) ** 2 + 1.0  # noqa: E731
    assert parabola_vertex(0.1, f(0.1), 0.3, f(0.3), 0.8, f(0.8)) == pytest.approx(0.37)


def test_parabola_vertex_refuses_a_convex_triple() -> None:
    assert parabola_vertex(0.0, 1.0, 0.5, 0.0, 1.0, 1.0) is None


def test_first_move_is_the_start_point() -> None:
    move = plan_move(Rows(3).evidence(), Settings(), np.random.default_rng(0),
                     start=np.array([0.2, 0.4, 0.6]))
    assert move.phase == "startup"
    np.testing.assert_allclose(move.point, [0.2, 0.4, 0.6])


def test_taken_start_point_leads_to_a_different_startup_point() -> None:
    rows = Rows(2)
    rows.add([0.5, 0.5], kind=FAILED)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0), start=np.full(2, 0.5))
    assert move.phase == "startup"
    assert not np.allclose(move.point, 0.5)


def test_single_lucky_measurement_is_confirmed_before_the_center_moves() -> None:
    rows = Rows(1)
    rows.add([0.5], 1.0)
    rows.add([0.75], 2.0, moved=0, center=0)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "confirm"
    np.testing.assert_allclose(move.point, [0.75])
    assert move.center == 0  # the first point still stands


def test_noise_estimate_keeps_center_on_the_lower_confidence_bound() -> None:
    rows = Rows(1)
    for point, values in (([0.2], [1.0, 1.2]), ([0.4], [2.0, 1.8]), ([0.6], [1.95])):
        for value in values:
            rows.add(point, value)
    center, top, noise = choose_center(rows.evidence(), confidence=2.0)
    assert noise == pytest.approx(np.sqrt((0.02 + 0.02) / 2))
    assert rows.points[center][0] == pytest.approx(0.4)  # 1.95 once is within the noise
    assert rows.points[top][0] == pytest.approx(0.6)  # ... so it is the one to re-measure


def test_noiseless_clear_improvement_moves_center_without_confirmation() -> None:
    rows = Rows(1)
    for point, values in (([0.2], [1.0, 1.0]), ([0.4], [2.0, 2.0]), ([0.6], [3.0])):
        for value in values:
            rows.add(point, value)
    center, top, noise = choose_center(rows.evidence(), confidence=2.0)
    assert noise == 0.0
    assert center == top == 4


def test_bracketed_line_jumps_to_the_parabola_vertex() -> None:
    f = lambda u: -((u - 0.58) ** 2)  # noqa: E731
    rows = Rows(1)
    rows.add([0.5], f(0.5))
    rows.add([0.5], f(0.5))  # repeated: a noise estimate of zero once a second pair exists
    rows.add([0.25], f(0.25), moved=0, center=0)
    rows.add([0.75], f(0.75), moved=0, center=0)
    rows.add([0.25], f(0.25))
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "step"
    assert move.point[0] == pytest.approx(0.58)


@pytest.mark.parametrize("rule", search.RULES)
def test_separable_quadratic_is_solved_quickly(rule: str) -> None:
    target = np.array([0.21, 0.83, 0.64, 0.4])
    rows, _ = run(lambda u: -float(np.sum((u - target) ** 2)), 4, 45, Settings(rule=rule))
    best = rows.points[int(np.nanargmax(rows.scores))]
    assert np.max(np.abs(best - target)) < 0.02


def test_failed_points_are_walls_that_are_never_crossed_again() -> None:
    wall = 0.7

    def objective(u):
        return None if u[0] > wall else float(u[0] - 0.3 * (u[1] - 0.5) ** 2)

    rows, moves = run(objective, 2, 40)
    kinds = np.array(rows.kinds)
    points = np.array(rows.points)
    fails = [m.phase for m, k in zip(moves, kinds, strict=True) if k == FAILED]
    assert sum(phase in ("probe", "step") for phase in fails) <= 6  # bisecting to the wall
    assert fails.count("slide") <= 8  # this wall couples nothing: sliding along it fails
    # No line move re-proposes a failed point or steps beyond one on its line.
    for number, move in enumerate(moves):
        if move.phase == "restart":
            continue
        earlier = points[:number][kinds[:number] == FAILED]
        on_line = np.abs(earlier[:, 1] - move.point[1]) < 1e-9
        assert not np.any(on_line & (move.point[0] >= earlier[:, 0] - 1e-12))
    best = np.array(rows.points)[int(np.nanargmax(rows.scores))]
    assert wall - 0.02 < best[0] <= wall


def test_step_shrinks_after_a_failure_and_grows_after_a_success() -> None:
    settings = Settings(initial_step=0.2)
    rows = Rows(1)
    rows.add([0.5], 1.0)
    rows.add([0.7], np.nan, kind=FAILED, moved=0, center=0)
    assert search.step_size(rows.evidence(), settings, 0) == pytest.approx(0.1)
    rows.add([0.3], 2.0, moved=0, center=0)
    assert search.step_size(rows.evidence(), settings, 0) == pytest.approx(0.4)
    rows.add([0.4], 0.5, moved=0, center=2)
    assert search.step_size(rows.evidence(), settings, 0) == pytest.approx(0.05)


def test_pending_point_is_not_proposed_again() -> None:
    rows = Rows(2)
    rows.add([0.5, 0.5], 1.0)
    first = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    rows.add(first.point, kind=PENDING, moved=first.coordinate, center=0)
    second = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert not np.allclose(first.point, second.point)


def test_estimates_never_become_the_center() -> None:
    rows = Rows(1)
    rows.add([0.5], 1.0)
    rows.add([0.75], 100.0, kind=ESTIMATE, moved=0, center=0)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.center == 0
    assert move.phase != "confirm"
    assert not np.isclose(move.point[0], 0.75)


def test_cyclic_rule_continues_after_the_last_moved_coordinate() -> None:
    rows = Rows(3)
    rows.add([0.5, 0.5, 0.5], 1.0)
    rows.add([0.5, 0.75, 0.5], 0.5, moved=1, center=0)
    # The line being searched first, then the next ones in cyclic order.
    assert search.coordinate_order(rows.evidence(), Settings(), np.random.default_rng(0), 0) == [
        1, 2, 0]


def test_resolved_center_restarts_with_growing_radius() -> None:
    rows = Rows(2)
    rows.add([0.5, 0.5], 1.0)
    rows.add([0.5, 0.5], 1.0)
    for i in range(2):
        for u in (0.4, 0.6, 0.45, 0.55):
            point = [0.5, 0.5]
            point[i] = u
            rows.add(point, 1.0 - (u - 0.5) ** 2, moved=i, center=0)
    first = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert first.phase == "restart"
    rows.add_move(first, 0.0)
    restarts = [first]
    for number in range(1, 6):  # model moves (fitted on the points around) come in between
        move = plan_move(rows.evidence(), Settings(), np.random.default_rng(number))
        assert move.phase in ("restart", "model")
        rows.add_move(move, 0.0)
        restarts += [move] if move.phase == "restart" else []
    assert len(restarts) >= 3
    assert [m.step for m in restarts[:3]] == pytest.approx([first.step, 2 * first.step,
                                                            4 * first.step])


def test_integer_snap_moves_at_least_one_grid_step() -> None:
    grid = 1 / 9  # an int knob with 10 values

    def snap(i, u):
        return float(np.clip(round(u / grid) * grid, 0.0, 1.0))

    rows, moves = run(lambda u: -float((u[0] - 7 * grid) ** 2), 1, 12,
                      Settings(initial_step=0.01), snap=snap)
    values = np.array(rows.points)[:, 0] / grid
    np.testing.assert_allclose(values, np.round(values), atol=1e-9)
    assert np.nanmax(rows.scores) == pytest.approx(0.0, abs=1e-12)


def test_cyclic_order_starts_at_a_random_coordinate_before_any_move():
    rows = Rows(4)
    rows.add([0.5, 0.5, 0.5, 0.5], 1.0)
    orders = [search.coordinate_order(rows.evidence(), Settings(), np.random.default_rng(seed), 0)
              for seed in range(20)]
    assert len({order[0] for order in orders}) > 1  # declaration order does not decide
    for order in orders:  # still a cycle
        assert order == [(order[0] + k) % 4 for k in range(4)]


# ---- pattern, model and wall moves -------------------------------------------------------


def _travelled_rows() -> Rows:
    """A center reached by moving x, then y: it travelled (+0.1, +0.1) in two moves."""
    rows = Rows(2)
    rows.add([0.5, 0.5], 1.0)
    rows.add([0.6, 0.5], 2.0, moved=0, center=0)
    rows.add([0.6, 0.6], 3.0, moved=1, center=1)
    return rows


def test_pattern_move_direction_equals_the_accumulated_displacement() -> None:
    rows = _travelled_rows()
    t, point = pattern_proposal(rows.evidence(), 2, 3.0, lambda i, u: u, depth=2)
    assert t == pytest.approx(1.0)
    np.testing.assert_allclose(point - [0.6, 0.6], [0.1, 0.1])  # the center + its travel
    # A single-coordinate travel is that coordinate's own line: no pattern line.
    assert pattern_proposal(rows.evidence(), 2, 3.0, lambda i, u: u, depth=1) is None


def test_pattern_line_bisects_towards_a_failed_pattern_point_and_never_past_it() -> None:
    rows = _travelled_rows()
    rows.add([0.7, 0.7], np.nan, kind=FAILED, moved=PATTERN, center=2, step=1.0)
    t, point = pattern_proposal(rows.evidence(), 2, 3.0, lambda i, u: u, depth=2)
    assert t == pytest.approx(0.5)
    np.testing.assert_allclose(point, [0.65, 0.65])


def test_pattern_moves_follow_a_diagonal_valley() -> None:
    # Score rises along the diagonal only: every single coordinate is resolved at once.
    def objective(u):
        along, across = (u[0] + u[1]) / 2, (u[0] - u[1]) / 2
        return float(along - 500.0 * across**2)

    rows, moves = run(objective, 2, 30)
    phases = {m.phase for m in moves}
    assert "pattern" in phases or "model" in phases
    assert np.nanmax(rows.scores) > 0.95  # the far corner (1, 1) scores 1


def test_model_move_finds_the_optimum_of_a_coupled_quadratic() -> None:
    # A rotated quadratic: the best point moves both knobs, which no coordinate line sees.
    target = np.array([0.62, 0.58])
    hessian = np.array([[2.0, 1.8], [1.8, 2.0]])

    def f(u):
        delta = np.asarray(u) - target
        return float(-delta @ hessian @ delta)

    rows = Rows(2)
    center = np.array([0.5, 0.5])
    rows.add(center, f(center))
    rng = np.random.default_rng(0)
    for k in range(12):
        point = center + rng.uniform(-0.15, 0.15, size=2)
        rows.add(point, f(point), moved=k % 2, center=0)
    radius, point = model_proposal(rows.evidence(), 0, lambda i, u: u, margin=0.0)
    assert radius > 0
    assert f(point) > max(rows.scores)  # better than everything measured so far
    assert np.max(np.abs(point - target)) < 0.05


def _coupled_quadratic(d: int):
    """Cost of the ``coupled`` benchmark in ``d`` dims: an ellipsoid plus a rank-one coupling."""
    target = np.linspace(0.3, 0.7, d)
    weights = 10.0 ** np.linspace(0.0, 1.0, d)

    def cost(u) -> float:
        delta = np.asarray(u) - target
        return 5.0 * float(np.sum(weights * delta**2) + 0.5 * np.sum(delta) ** 2)

    return cost


def test_model_points_between_lines_reach_a_noisy_coupled_quadratic() -> None:
    # 10-D, 0.5% noise: coordinate lines alone end 120 trials above a cost of 0.0104 on these
    # seeds (the coupling makes each line gain less than the noise); the model sees it.
    cost = _coupled_quadratic(10)
    reached = 0
    for seed in range(5):
        noise = np.random.default_rng(seed)
        rows, moves = run(lambda u, noise=noise: -(1.0 + cost(u))
                          * (1.0 + 0.005 * noise.standard_normal()), 10, 120, seed=seed)
        phases = [m.phase for m in moves]
        assert "model" in phases
        # Between lines: coordinate moves still follow the first model point.
        assert {"probe", "step"} & set(phases[phases.index("model"):])
        reached += min(cost(p) for p in rows.points) < 0.0101  # the benchmark's 99% level
    assert reached >= 4


def test_a_failed_trial_keeps_the_model_out_of_the_lines() -> None:
    cost = _coupled_quadratic(4)
    phases = {}
    for failed in (False, True):
        rows = Rows(4)
        if failed:  # a wall somewhere: a quadratic cannot describe it
            rows.add(np.ones(4), kind=FAILED)
        phases[failed] = []
        for number in range(40):
            move = plan_move(rows.evidence(), Settings(), np.random.default_rng([0, number]),
                             start=np.full(4, 0.5))
            rows.add_move(move, -cost(move.point))
            phases[failed].append(move.phase)
    assert "model" in phases[False]
    assert "model" not in phases[True]  # the lines are not all resolved yet in 40 trials


def test_trust_region_step_is_newton_inside_and_bounded_outside() -> None:
    hessian = -np.array([[4.0, 1.0], [1.0, 2.0]])  # concave
    gradient = np.array([1.0, -0.5])
    newton = -np.linalg.solve(hessian, gradient)
    np.testing.assert_allclose(_trust_region_step(gradient, hessian, 10.0), newton)
    short = _trust_region_step(gradient, hessian, 0.1)
    assert np.linalg.norm(short) == pytest.approx(0.1, rel=1e-6)
    assert gradient @ short + 0.5 * short @ hessian @ short > 0.0  # still an ascent
    # Not concave (a saddle): no maximum, yet a bounded step that gains on the model.
    saddle = np.array([[-2.0, 0.0], [0.0, 1.0]])
    step = _trust_region_step(gradient, saddle, 0.5)
    assert np.linalg.norm(step) == pytest.approx(0.5, rel=1e-6)
    assert gradient @ step + 0.5 * step @ saddle @ step > 0.0


def test_line_bisects_between_the_center_and_the_wall() -> None:
    rows = Rows(1)
    rows.add([0.5], 1.0)
    rows.add([0.5], 1.0)
    rows.add([0.75], np.nan, kind=FAILED, moved=0, center=0)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "probe"
    assert move.point[0] == pytest.approx(0.625)  # half way to the wall
    rows.add_move(move, 1.5)
    rows.add([0.625], 1.5)  # confirmed: the new center
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(1))
    assert 0.625 < move.point[0] < 0.75  # towards the wall again, never at or past it


def _noisy_center_rows() -> Rows:
    """A center measured three times (noise sigma ~0.1) at 0.5 on a 1-D line."""
    rows = Rows(1)
    for score in (1.0, 1.1, 0.9):
        rows.add([0.5], score)
    return rows


def test_flat_line_within_the_noise_is_probed_further_out() -> None:
    rows = _noisy_center_rows()
    rows.add([0.45], 0.98, moved=0, center=0)  # both neighbours tie with the center
    rows.add([0.55], 0.97, moved=0, center=0)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "probe"
    assert abs(move.point[0] - 0.5) == pytest.approx(0.1)  # twice the farthest tie's distance


def test_flat_line_is_not_probed_further_towards_a_wall() -> None:
    rows = _noisy_center_rows()
    rows.add([0.45], 0.98, moved=0, center=0)
    rows.add([0.55], 0.97, moved=0, center=0)
    rows.add([0.6], np.nan, kind=FAILED, moved=0, center=0)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "probe"
    assert move.point[0] == pytest.approx(0.4)  # only the side without a wall


def test_noisy_center_measured_once_is_remeasured_when_it_stalls() -> None:
    rows = Rows(1)
    for score in (1.0, 1.2, 1.1):  # repeats: the noise is known
        rows.add([0.2], score)
    rows.add([0.5], 2.0, moved=0, center=0)  # a lucky single measurement: now the center
    for u in (0.55, 0.45, 0.6):
        rows.add([u], 1.8, moved=0, center=3)
    assert plan_move(rows.evidence(), Settings(), np.random.default_rng(0)).phase != "confirm"
    rows.add([0.4], 1.8, moved=0, center=3)  # 2d + 2 = 4 moves from it, none better
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "confirm"
    assert move.point[0] == pytest.approx(0.5)


def _next_to_a_wall(tie_score: float) -> Rows:
    """Center (0.3, 0.5) measured three times, a failure below it along x, one point above."""
    rows = Rows(2)
    for score in (1.0, 1.1, 0.9):
        rows.add([0.3, 0.5], score)
    rows.add([0.2, 0.5], np.nan, kind=FAILED, moved=0, center=0)
    rows.add([0.6, 0.5], tie_score, moved=0, center=0)
    return rows


def test_center_moves_away_from_a_wall_to_a_point_tied_with_it() -> None:
    # x does not change the score but bounds another knob (memory fraction against batch):
    # the tied point farther from the failure is the better place to search from.
    move = plan_move(_next_to_a_wall(0.97).evidence(), Settings(), np.random.default_rng(0))
    assert move.center == 4


def test_center_stays_when_the_point_away_from_the_wall_is_clearly_worse() -> None:
    move = plan_move(_next_to_a_wall(0.5).evidence(), Settings(), np.random.default_rng(0))
    assert move.center == 0


def test_headroom_off_keeps_the_center_of_the_lower_confidence_bound() -> None:
    move = plan_move(_next_to_a_wall(0.97).evidence(), Settings(headroom=False),
                     np.random.default_rng(0))
    assert move.center == 0


def test_a_wall_that_stopped_two_slides_is_not_slid_along_again() -> None:
    # A memory fraction above 0.8 fails whatever the other knobs are: after two failed slides
    # from one wall value, sliding along it again would only fail again.
    def objective(u):
        return None if u[0] > 0.8 else float(u[0] - 0.1 * np.sum((u[1:] - 0.4) ** 2))

    rows, moves = run(objective, 4, 80)
    kinds = np.array(rows.kinds)
    points = np.array(rows.points)
    slid = [k for k, m in enumerate(moves) if m.phase == "slide" and kinds[k] == FAILED]
    per_wall: dict[float, int] = {}
    for k in slid:
        wall = round(float(points[k, 0]), 6)
        per_wall[wall] = per_wall.get(wall, 0) + 1
    assert all(count <= MAX_FAILED_SLIDES for count in per_wall.values()), per_wall
    # A failed slide says nothing about the step of the knob it moved: no line step shrank.
    for k in slid:
        assert rows.moved[k] == SLIDE


def _staircase(u: np.ndarray) -> float:
    """1.0 only where knobs 0 and 1 are both in a band; each alone is flat (0.9 plateau)."""
    if u[2] < 0.2:
        return 0.5 + 2.0 * u[2]  # a knob with a slope, to be resolved by its line search
    both = 0.1 <= u[0] <= 0.4 and 0.55 <= u[1] <= 0.85
    return 1.0 if both else 0.9


def test_flat_intervals_reach_to_the_first_clearly_different_measurement() -> None:
    rows = Rows(2)
    rows.add([0.5, 0.5], 0.9)
    rows.add([0.5, 0.5], 0.9)
    for u, score in ((0.7, 0.9), (0.3, 0.9), (0.9, 0.5), (0.1, 0.9)):
        rows.add([u, 0.5], score, moved=0, center=0)
    rows.add([0.5, 0.55], 0.9, moved=1, center=0)  # knob 1: tied, but only over 0.05
    intervals = flat_intervals(rows.evidence(), 0, 0.9, margin=0.02)
    assert set(intervals) == {0}
    assert intervals[0] == pytest.approx((0.0, 0.9))  # down to the bound, up to the drop


def test_plateau_moves_find_a_stair_that_needs_two_flat_knobs_moved_together() -> None:
    reached, plateau_moves = [], 0
    for seed in range(6):
        noise = np.random.default_rng(seed)

        def objective(u, noise=noise):
            return _staircase(u) * (1.0 + 0.01 * noise.standard_normal())

        rows, moves = run(objective, 3, 80, seed=seed)
        true = [_staircase(p) for p in rows.points]
        reached.append(max(true) == 1.0)
        plateau_moves += sum(m.phase == "plateau" for m in moves)
    assert sum(reached) >= 5, reached
    assert plateau_moves > 0


def test_parabola_at_passes_through_its_three_points() -> None:
    points = ((0.1, 2.0), (0.4, 3.0), (0.9, -1.0))
    for u, y in points:
        assert parabola_at(u, *points) == pytest.approx(y)


@pytest.mark.parametrize(("right", "stepped"), [(0.95, False), (0.9, True)])
def test_vertex_step_needs_a_promised_gain_above_the_noise(right: float, stepped: bool) -> None:
    # Center 0.5 measured three times (sigma ~0.1). Left neighbour clearly worse, so the bracket
    # is not flat. With the right neighbour at 0.95 the parabola's peak is ~0.05 above the
    # center, inside the noise: the line is resolved. A steeper left side (0.9 right, -2 left)
    # promises ~0.34, and the vertex is measured.
    rows = _noisy_center_rows()
    rows.add([0.2], 0.5 if not stepped else -2.0, moved=0, center=0)
    rows.add([0.8], right, moved=0, center=0)
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert (move.phase == "step") is stepped
    if stepped:
        assert 0.5 < move.point[0] < 0.8


def _tied_lines() -> Rows:
    """A center measured twice at 0.85; knob 0 and knob 1 each have a probe within the noise
    (0.83, 0.84), knob 2 only a clear loss (0.6)."""
    rows = Rows(3)
    rows.add([0.5, 0.5, 0.5], 0.86)
    rows.add([0.5, 0.5, 0.5], 0.84)
    rows.add([0.7, 0.5, 0.5], 0.83, moved=0, center=0)
    rows.add([0.2, 0.5, 0.5], 0.70, moved=0, center=0)
    rows.add([0.5, 0.8, 0.5], 0.84, moved=1, center=0)
    rows.add([0.5, 0.5, 0.9], 0.60, moved=2, center=0)
    return rows


def test_the_tied_probes_of_several_lines_are_combined_once() -> None:
    rows = _tied_lines()
    proposal = tied_combination(rows.evidence(), 0, 0.85, margin=0.03, snap=lambda i, u: u)
    assert proposal is not None
    moved, point = proposal
    assert moved == 2.0
    np.testing.assert_allclose(point, [0.7, 0.8, 0.5])  # the clear loss on knob 2 is not taken
    rows.add(point, 0.84, moved=TIES, center=0)  # tried from this center: not again
    assert tied_combination(rows.evidence(), 0, 0.85, 0.03, lambda i, u: u) is None


def test_ties_need_two_lines_within_the_margin() -> None:
    rows = _tied_lines()
    # with a tighter margin only knob 1's probe ties: a single line is its own line search's
    assert tied_combination(rows.evidence(), 0, 0.85, margin=0.01, snap=lambda i, u: u) is None


def test_plan_move_combines_the_ties_once_every_line_is_resolved() -> None:
    """Each knob alone gains less than the noise margin (+0.03 against a center measured high);
    together they gain clearly: once both lines are resolved, the ties are tried together."""
    rows = Rows(2)
    for score in (0.88, 0.84, 0.86):  # the center, measured three times (noise ~0.02)
        rows.add([0.5, 0.5], score)
    for i in range(2):
        for u, score in ((0.75, 0.86), (0.25, 0.70), (0.6, 0.85), (0.4, 0.78)):
            point = [0.5, 0.5]
            point[i] = u
            rows.add(point, score, moved=i, center=0, vertex=u in (0.6, 0.4))
    rows.add([0.02, 0.02], kind=FAILED, moved=-1)  # with a failure seen, no model between lines
    move = plan_move(rows.evidence(), Settings(), np.random.default_rng(0))
    assert move.phase == "ties"
    np.testing.assert_allclose(move.point, [0.75, 0.75])


def test_lines_through_names_the_one_coordinate_a_row_differs_in():
    c = np.array([0.5, 0.5, 0.5])
    points = np.array([
        [0.5, 0.5, 0.5],          # the center itself
        [0.5, 0.9, 0.5],          # on the line along coordinate 1
        [0.5 + 1e-9, 0.5, 0.1],   # along 2 (a difference below _SAME is no difference)
        [0.1, 0.9, 0.5],          # off every line
    ])
    n_diff, along = lines_through(points, c)
    assert n_diff.tolist() == [0, 1, 1, 2]
    assert along.tolist() == [-1, 1, 2, -1]
