"""What a study's other structures tell coordinate descent (``_coordinate/prior.py``).

End to end (a new structure's first line): ``test_coordinate_sampler.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoscout_optuna.samplers._coordinate.evidence import (
    REAL,
    Evidence,
    choose_center,
    largest_change,
)
from autoscout_optuna.samplers._coordinate.prior import cycle, relative_noise
from autoscout_optuna.samplers._coordinate.search import Settings, coordinate_order


def test_knob_priority_is_the_largest_change_per_coordinate() -> None:
    coordinates = np.array([0, 2, 0, 2, 5, 1])
    priority = largest_change(coordinates, np.array([0.01, -0.3, -0.02, 0.1, 1.0, np.nan]), 4)
    np.testing.assert_allclose(priority, [0.02, np.nan, 0.3, np.nan])  # 5 is out of range


def test_cycle_puts_unknown_knobs_with_the_most_sensitive_and_flat_ones_last() -> None:
    assert cycle(np.array([0.01, np.nan, 0.3, 0.05])) == [1, 2, 3, 0]
    assert cycle(np.array([np.nan, np.nan])) is None
    assert cycle(None) is None


def test_relative_noise_pools_repeats_in_percent_of_their_level() -> None:
    assert relative_noise([[1.0], [2.0]]) is None  # nothing repeated
    assert relative_noise([[1.0, 1.2]]) is None  # one degree of freedom
    # Two configs, 1 dof each, both 10 % apart around their means: the level does not matter.
    noise = relative_noise([[0.95, 1.05], [95.0, 105.0], [7.0]])
    assert noise == pytest.approx(np.sqrt(0.05**2 + 0.05**2))


def _evidence(points: list[list[float]], scores: list[float], moved: list[int],
              centers: list[int]) -> Evidence:
    n = len(points)
    return Evidence(points=np.array(points, dtype=float), scores=np.array(scores, dtype=float),
                    kinds=np.full(n, REAL), moved=np.array(moved), centers=np.array(centers),
                    restarts=np.zeros(n, dtype=bool))


def test_coordinate_order_follows_the_priority_cycle_after_the_line_moved_last() -> None:
    evidence = _evidence([[0.5, 0.5, 0.5], [0.5, 0.75, 0.5]], [1.0, 0.9], [-1, 1], [-1, 0])
    rng = np.random.default_rng(0)
    order = coordinate_order(evidence, Settings(), rng, 0, np.array([0.2, 0.5, 0.1]))
    assert order == [1, 0, 2]  # the line in progress, then the cycle 1 -> 0 -> 2 wraps on
    fresh = _evidence([[0.5, 0.5, 0.5]], [1.0], [-1], [-1])
    assert coordinate_order(fresh, Settings(), rng, 0, np.array([0.2, 0.5, 0.1]))[0] == 1


def test_prior_noise_stands_in_until_the_structure_repeats_a_point() -> None:
    points, moved, centers = [[0.5], [0.6]], [-1, 0], [-1, 0]
    evidence = _evidence(points, [1.0, 1.03], moved, centers)
    center, top, noise = choose_center(evidence, 1.75)
    assert (center, top, noise) == (0, 1, None)  # the first point stands; the other is confirmed
    center, top, noise = choose_center(evidence, 1.75, prior_noise=0.1)
    assert noise == pytest.approx(0.103)
    assert center == top == 1  # a known noise ranks single measurements by their bound
    repeated = _evidence(points + [[0.5], [0.5]], [1.0, 1.03, 1.0, 1.0], moved + [-1, -1],
                         centers + [-1, -1])
    assert choose_center(repeated, 1.75, prior_noise=0.1)[2] == pytest.approx(0.0)  # its own
