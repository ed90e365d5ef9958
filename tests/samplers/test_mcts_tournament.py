"""Feature prioritization: dependencies, dependency-respecting orders, the tournament."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscout_optuna.samplers._mcts.tournament import (
    Dependencies,
    DependencyLearner,
    SpreadOfRows,
    candidate_orders,
    explained_spread,
    learn_dependencies,
    run_tournament,
    topological_order,
)
from autoscout_optuna.samplers._mcts.tree import ABSENT, OTHER


def _conditional_table(n: int = 60, seed: int = 0):
    """Column 0 (3 values) asks column 2 only when it is 1; column 1 is always asked.

    The reward is decided by column 1 alone; column 0 and 2 are noise.
    """
    rng = np.random.default_rng(seed)
    codes = np.full((n, 3), ABSENT)
    positions = np.full((n, 3), -1)
    codes[:, 0] = rng.integers(0, 3, n)
    codes[:, 1] = rng.integers(0, 4, n)
    positions[:, 0], positions[:, 1] = 0, 1
    asks = codes[:, 0] == 1
    codes[asks, 2] = rng.integers(0, 2, asks.sum())
    positions[asks, 2] = 2
    rewards = codes[:, 1] / 3.0 + rng.normal(0, 0.05, n)
    return codes, positions, rewards, np.ones(n)


def test_a_conditional_param_follows_the_parent_whose_value_asks_it():
    codes, positions, _, _ = _conditional_table()
    deps = learn_dependencies(codes, positions)
    assert deps.must_follow == {2: frozenset({0})}
    assert deps.inactive_under == {2: {0: frozenset({0, 2})}}


def test_without_a_deciding_parent_a_conditional_param_follows_everything_asked_before_it():
    # Column 2 is asked in some rows, but no single earlier column's value explains when.
    codes = np.array([[0, 0, 1], [0, 0, ABSENT], [1, 1, 0], [1, 1, ABSENT]])
    positions = np.array([[0, 1, 2], [0, 1, -1], [0, 1, 2], [0, 1, -1]])
    deps = learn_dependencies(codes, positions)
    assert deps.must_follow == {2: frozenset({0, 1})}
    assert deps.inactive_under == {}


def test_a_failed_row_counts_as_skipping_once_a_later_row_shows_what_comes_after():
    # Column 2 is asked under column 0 = 1 only. A failed row with column 0 = 0 that also
    # asked column 1 skipped column 2 only if column 1 comes after column 2 somewhere: the
    # row that shows it may arrive after the failed one.
    failed = (np.array([0, 1, ABSENT]), np.array([0, 1, -1]))
    rows = [(np.array([1, 0, 0]), np.array([0, 2, 1])), (np.array([1, 1, 1]), np.array([0, 2, 1]))]
    early, late = DependencyLearner(3), DependencyLearner(3)
    early.add(*failed, complete=False)
    for codes, positions in rows:
        early.add(codes, positions)
        late.add(codes, positions)
    assert late.dependencies() == Dependencies({}, {})  # nothing skipped column 2 yet
    late.add(*failed, complete=False)
    expected = Dependencies({2: frozenset({0})}, {2: {0: frozenset({0})}})
    assert early.dependencies() == late.dependencies() == expected


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_dependencies_do_not_depend_on_the_order_rows_come_in(seed):
    codes, positions, _, _ = _conditional_table(n=30, seed=seed)
    rng = np.random.default_rng(seed)
    complete = rng.random(30) < 0.7
    cut = rng.random(30) < 0.3  # failed rows that stopped before their last param
    positions[cut & ~complete, 1] = -1
    codes[positions < 0] = ABSENT
    forward = learn_dependencies(codes, positions, complete)
    order = rng.permutation(30)
    assert learn_dependencies(codes[order], positions[order], complete[order]) == forward


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=5, max_size=5),
    st.sets(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=8),
)
def test_topological_order_places_every_column_once_and_parents_first(priority, edges):
    must_follow: dict[int, set[int]] = {}
    for parent, child in edges:
        if parent < child:  # a DAG
            must_follow.setdefault(child, set()).add(parent)
    frozen = {c: frozenset(p) for c, p in must_follow.items()}
    order = topological_order(5, frozen, priority)
    assert sorted(order) == list(range(5))
    for child, parents in frozen.items():
        assert all(order.index(p) < order.index(child) for p in parents)


def test_topological_order_survives_a_cycle():
    order = topological_order(3, {0: frozenset({1}), 1: frozenset({0})}, [0.0, 1.0, 2.0])
    assert sorted(order) == [0, 1, 2]


def test_the_deciding_column_explains_the_spread_and_a_noise_column_does_not():
    codes, _, rewards, weights = _conditional_table(n=200)
    assert explained_spread(codes, rewards, weights, [1]) > 0.9
    assert explained_spread(codes, rewards, weights, [0]) < 0.1
    assert explained_spread(codes, rewards, weights, []) == 0.0


def test_tournament_puts_the_high_impact_feature_on_top():
    codes, positions, rewards, weights = _conditional_table(n=80)
    deps = learn_dependencies(codes, positions)
    rng = np.random.default_rng(1)
    candidates = candidate_orders(
        codes, rewards, weights, deps, [0.0, 0.5, 1.0], previous=[0, 2, 1], rng=rng,
        n_candidates=6,
    )
    assert candidates[0] == [0, 2, 1]  # the last winner enters first
    assert len({tuple(c) for c in candidates}) == len(candidates)
    for order in candidates:
        assert order.index(0) < order.index(2)
    winner, score = run_tournament(codes, rewards, weights, candidates, rng, depth=2)
    assert candidates[winner][0] == 1
    assert score > 0.9


def test_tournament_of_one_returns_it():
    codes, _, rewards, weights = _conditional_table(n=20)
    winner, _ = run_tournament(codes, rewards, weights, [[0, 1, 2]], np.random.default_rng(0))
    assert winner == 0


def test_candidate_orders_without_history_are_still_valid():
    codes = np.zeros((0, 2), dtype=int)
    orders = candidate_orders(
        codes, np.zeros(0), np.zeros(0), Dependencies({}, {}), [0.0, 1.0], None,
        np.random.default_rng(0), 4,
    )
    assert all(sorted(o) == [0, 1] for o in orders)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_each_column_at_once_gives_exactly_the_one_column_answers(n_rows, n_columns, seed):
    # Exactly, not approximately: the plan's level order, and so every later trial, follows
    # these numbers, and computing them at once must not change a single decision.
    rng = np.random.default_rng(seed)
    codes = rng.integers(OTHER, rng.integers(1, 12), (n_rows, n_columns))
    rewards = rng.random(n_rows)
    weights = rng.choice([0.0, 0.1, 0.5, 1.0], n_rows)
    spread = SpreadOfRows(codes, rewards, weights)
    one_by_one = [SpreadOfRows(codes, rewards, weights)([c]) for c in range(n_columns)]
    assert spread.each_column().tolist() == one_by_one


def test_dependencies_asked_after_every_row_match_a_fresh_learning_of_those_rows():
    # the learner keeps its answer until the next row: every answer must still be current
    codes, positions, _, _ = _conditional_table(n=25, seed=3)
    learner = DependencyLearner(codes.shape[1])
    for i in range(len(codes)):
        learner.add(codes[i], positions[i])
        assert learner.dependencies() == learn_dependencies(codes[: i + 1], positions[: i + 1])
        assert learner.dependencies() is learner.dependencies()
