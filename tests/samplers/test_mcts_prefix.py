"""Dead pairs of choices (layouts no trial got past) in MCTS's feasibility model."""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility
from autoscout_optuna.samplers._mcts.prefix import dead_pairs, p_dead
from autoscout_optuna.samplers._mcts.tree import ABSENT

# Three params asked in column order; (column 0 = 1, column 2 = 1) is an invalid layout.
CODES = np.array([
    [1, 0, 1],  # failed when column 2 was asked: suspects (0=1, 2=1) and (1=0, 2=1)
    [0, 0, 1],  # ran: clears (1=0, 2=1)
    [1, 1, 0],  # ran
    [1, 1, 1],  # failed the same way: only (0=1, 2=1) is left a suspect, (1=1) never got past
])
POSITIONS = np.array([[0, 1, 2]] * 4)
FAILED = np.array([True, False, False, True])


def test_a_pair_some_trial_got_past_is_cleared():
    pairs = dead_pairs(CODES, POSITIONS, FAILED, FAILED)
    found = {tuple(row[:4]): row[4] for row in pairs}
    assert found == {(0, 1, 2, 1): 2, (1, 1, 2, 1): 1}
    p = p_dead(np.array([[1, 2, 1], [1, 1, 1], [0, 1, 1], [1, 0, 0]]), pairs)
    np.testing.assert_allclose(p, [0.75, 0.75, 0.5, 0.0])


def test_a_failure_after_the_culprit_clears_the_pair():
    # A row that asked column 2 = 1 and then failed later (it asked column 3) got past it.
    codes = np.array([[1, 0, 1, ABSENT], [1, 1, 1, 0], [0, 0, 0, 0]])
    positions = np.array([[0, 1, 2, -1], [0, 1, 2, 3], [0, 1, 2, 3]])
    failed = np.array([True, True, False])
    pairs = dead_pairs(codes, positions, failed, np.array([True, False, False]))
    assert {tuple(row[:4]) for row in pairs} == {(1, 0, 2, 1)}


def test_feasibility_model_counts_dead_pairs_even_without_a_full_length_failure():
    codes = np.vstack([CODES, [0, 1, 0]])
    positions = np.vstack([POSITIONS, [0, 1, 2]])
    failed = np.append(FAILED, False)
    # The feasible rows ask a fourth param: both failures are prefix failures.
    codes = np.hstack([codes, np.array([[ABSENT], [0], [0], [ABSENT], [0]])])
    positions = np.hstack([positions, np.array([[-1], [3], [3], [-1], [3]])])
    model = fit_feasibility(codes, [2, 2, 2, 1], failed, ~failed, positions=positions)
    assert model.weights is None  # no full-length failure: no logistic fit
    p = model.p_fail(np.array([[1, 0, 1, 0], [0, 1, 0, 0]]))
    np.testing.assert_allclose(p, [0.75, 0.0])
    plain = fit_feasibility(codes, [2, 2, 2, 1], failed, ~failed)
    np.testing.assert_array_equal(plain.p_fail(np.array([1, 0, 1, 0])), [0.0])
