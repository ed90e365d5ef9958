"""The pure tree code of MCTSSampler, on plain arrays."""

from __future__ import annotations

import numpy as np
import pytest

from autoscout_optuna.samplers._mcts.descent import TreePolicy, plan_path
from autoscout_optuna.samplers._mcts.tree import (
    ABSENT,
    child_scores,
    node_rows,
    normalize_rewards,
    pick,
)

GREEDY = TreePolicy(exploration=0.0, rave_equivalence=0.0, rave_visit_share=0.0)


def test_rewards_are_ranks_so_any_monotone_rescaling_gives_the_same():
    kinds = ["real"] * 5
    scores = [3.0, -1.0, 10.0, 2.0, 2.0]
    rewards, weights = normalize_rewards(scores, kinds)
    rescaled, _ = normalize_rewards([np.exp(s) for s in scores], kinds)
    np.testing.assert_allclose(rewards, rescaled)
    assert rewards[2] == 1.0 and rewards[1] == 0.0
    assert rewards[3] == rewards[4]  # ties share their rank
    np.testing.assert_array_equal(weights, np.ones(5))


def test_failed_below_every_real_pending_is_worst_real_estimate_weighs_less():
    kinds = ["real", "real", "failed", "pending", "estimate"]
    rewards, weights = normalize_rewards(
        [1.0, 2.0, None, None, 5.0], kinds, failure_reward=-0.5, estimate_weight=0.25
    )
    assert rewards[2] == -0.5 < rewards[:2].min()
    assert rewards[3] == min(rewards[0], rewards[1], rewards[4])
    assert rewards[4] == 1.0 and weights[4] == 0.25
    with pytest.raises(ValueError, match="kind"):
        normalize_rewards([1.0], ["bogus"])


def test_untried_child_goes_first_and_better_mean_scores_higher():
    codes = np.array([[0], [0], [1], [1]])
    rewards = np.array([0.9, 0.8, 0.1, 0.2])
    scores = child_scores(
        codes, 0, 3, rewards, np.ones(4), np.arange(4),
        exploration=0.5, rave_equivalence=1.0, rave_visit_share=0.1,
    )
    assert np.isinf(scores.score[2])
    assert scores.value[0] > scores.value[1]
    np.testing.assert_allclose(scores.visits, [2, 2, 0])


def test_rave_uses_study_wide_statistics_for_a_child_unseen_in_this_node():
    # Column 1's value 1 was good everywhere, but never under column 0 = 0.
    codes = np.array([[0, 0], [1, 1], [1, 1], [1, 0]])
    rewards = np.array([0.5, 1.0, 1.0, 0.0])
    rows = node_rows(codes, {0: 0})
    scores = child_scores(
        codes, 1, 2, rewards, np.ones(4), rows,
        exploration=0.0, rave_equivalence=2.0, rave_visit_share=0.1,
    )
    assert np.isfinite(scores.score).all()
    assert scores.value[1] == pytest.approx(1.0)  # study-wide mean of value 1
    assert scores.visits[1] == 0


def test_node_rows_keep_rows_that_lack_the_column():
    codes = np.array([[0, 1], [1, ABSENT], [0, ABSENT], [1, 0]])
    np.testing.assert_array_equal(node_rows(codes, {0: 0}), [0, 2])
    np.testing.assert_array_equal(node_rows(codes, {1: 1}), [0, 1, 2])


def test_pick_breaks_ties_among_the_best_only():
    rng = np.random.default_rng(0)
    chosen = {pick(np.array([1.0, 3.0, 3.0, 2.0]), rng) for _ in range(50)}
    assert chosen == {1, 2}
    allowed = np.array([True, False, False, True])
    assert pick(np.array([1.0, 3.0, 3.0, 2.0]), rng, allowed=allowed) == 3


def _table(paths, rewards):
    return np.array(paths), np.array(rewards, dtype=float)


def test_greedy_plan_follows_the_best_values_level_by_level():
    codes, rewards = _table(
        [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]],
        [0.1, 0.2, 0.9, 0.5, 0.3, 0.0],
    )
    steps = plan_path(
        codes, [3, 3], rewards, np.ones(6), [0, 1], {}, np.random.default_rng(0), GREEDY
    )
    # Value 1 of column 0 is best; under it every value of column 1 is tried but value 2,
    # which is untried and so expanded first.
    assert [(s.column, s.code) for s in steps] == [(0, 1), (1, 2)]
    assert steps[1].score == np.inf


def test_plan_skips_a_child_inactive_under_the_planned_parent():
    codes, rewards = _table([[0, 0], [0, 1], [1, ABSENT]], [0.0, 0.1, 1.0])
    inactive = {1: {0: frozenset({1})}}
    steps = plan_path(
        codes, [2, 2], rewards, np.ones(3), [0, 1], inactive, np.random.default_rng(0), GREEDY
    )
    assert [(s.column, s.code) for s in steps] == [(0, 1)]


def test_plan_does_not_repeat_a_configuration_already_evaluated():
    # Three of the four paths are tried and (1, 1) is the best: greedy descent would repeat
    # it. The plan revises the deepest decisions until it reaches a path not yet evaluated.
    codes, rewards = _table([[0, 1], [1, 0], [1, 1]], [0.1, 0.5, 1.0])
    steps = plan_path(
        codes, [2, 2], rewards, np.ones(3), [0, 1], {}, np.random.default_rng(0), GREEDY
    )
    assert tuple(s.code for s in steps) == (0, 0)


def test_a_revision_does_not_complete_a_failed_prefix_while_another_child_is_left():
    # Both completions of the best prefix (0) were taken, so the plan is revised at the top.
    # Value 1 failed as soon as it was chosen (the row lacks column 1); value 2 has a path
    # left, (2, 1). The exploration bonus ranks the once-visited failure above value 2, but
    # a revision, like the descent, must not complete a failed prefix while another child is
    # left.
    codes, rewards = _table(
        [[0, 0], [0, 1], [1, ABSENT]] + [[2, 0]] * 5, [1.0, 0.9, -0.05] + [0.1] * 5
    )
    failed = np.array([False, False, True] + [False] * 5)
    policy = TreePolicy(exploration=1.0, rave_equivalence=0.0, rave_visit_share=0.0)
    for seed in range(5):
        steps = plan_path(
            codes, [3, 2], rewards, np.ones(8), [0, 1], {}, np.random.default_rng(seed),
            policy, failed=failed,
        )
        assert [s.code for s in steps] == [2, 1]
    # With every other path taken, neither the revisions nor the search for an unseen path
    # complete the failed prefix (every completion fails as it did): the plan stays a full
    # path that repeats a known configuration, a wasted trial rather than a failed one.
    crowded = np.vstack([codes, [[2, 1]]])
    for backtracks in (8, 0):  # 0: straight to the search for an unseen path
        steps = plan_path(
            crowded, [3, 2], np.append(rewards, 0.1), np.ones(9), [0, 1], {},
            np.random.default_rng(0),
            TreePolicy(exploration=1.0, rave_equivalence=0.0, rave_visit_share=0.0,
                       max_backtracks=backtracks),
            failed=np.append(failed, False),
        )
        assert len(steps) == 2 and steps[0].code != 1


def test_a_revision_moves_up_a_level_rather_than_take_the_last_child_if_it_failed():
    # Both completions of (0, 0) were taken; (0, 1) failed as soon as it was chosen. At
    # level 1 under 0 the only untried child is that failure: the revision moves up to
    # level 0 instead, where value 1 has unseen paths.
    codes, rewards = _table(
        [[0, 0, 0], [0, 0, 1], [0, 1, ABSENT], [1, 0, 0]], [1.0, 0.9, -0.05, 0.2]
    )
    failed = np.array([False, False, True, False])
    for seed in range(5):
        steps = plan_path(
            codes, [2, 2, 2], rewards, np.ones(4), [0, 1, 2], {},
            np.random.default_rng(seed), GREEDY, failed=failed,
        )
        path = [s.code for s in steps]
        assert path[:2] != [0, 1] and path not in [[0, 0, 0], [0, 0, 1], [1, 0, 0]], path


def test_plan_with_everything_evaluated_still_returns_a_full_path():
    codes, rewards = _table([[0, 0], [0, 1], [1, 0], [1, 1]], [0.0, 0.1, 0.5, 1.0])
    steps = plan_path(
        codes, [2, 2], rewards, np.ones(4), [0, 1], {}, np.random.default_rng(0), GREEDY
    )
    assert tuple(s.code for s in steps) == (1, 1)


def test_max_backup_values_a_child_by_its_best_result_too():
    # Value 0: steady 0.6; value 1: one great (1.0) and one poor (0.0) result.
    codes = np.array([[0], [0], [1], [1]])
    rewards = np.array([0.6, 0.6, 1.0, 0.0])
    kwargs = dict(exploration=0.0, rave_equivalence=0.0, rave_visit_share=0.0)
    mean = child_scores(codes, 0, 2, rewards, np.ones(4), np.arange(4), **kwargs)
    best = child_scores(codes, 0, 2, rewards, np.ones(4), np.arange(4), max_backup=0.5, **kwargs)
    assert mean.value[0] > mean.value[1]
    assert best.value[1] > best.value[0]


@pytest.mark.parametrize("seed", range(60))
def test_unseen_path_check_agrees_with_enumerating_every_path(seed):
    # The fast walk (bit masks, memoized nodes, leaves tested in bulk) must give the same
    # answer as testing every complete path with `_is_duplicate`, also with absent and partial
    # rows, and with columns skipped under some value of an earlier one.
    from autoscout_optuna.samplers._mcts.descent import Step, _is_duplicate, _UnseenPaths

    rng = np.random.default_rng(seed)
    n_columns = 3 + seed % 2
    n_values = [int(v) for v in rng.integers(2, 4, size=n_columns)]
    n_rows = int(rng.integers(1, 100))
    codes = np.stack([rng.integers(0, n, size=n_rows) for n in n_values], axis=1)
    codes[rng.random(codes.shape) < 0.1] = ABSENT
    partial = rng.random(n_rows) < 0.3
    order = [int(c) for c in rng.permutation(n_columns)]
    inactive = {}
    if seed % 3:  # the last column is skipped under value 0 of the first
        inactive = {order[-1]: {order[0]: frozenset({0})}}
        codes[codes[:, order[0]] == 0, order[-1]] = ABSENT

    def paths(decided):
        rest = [c for c in order if c not in decided
                and not any(decided.get(p) in v for p, v in inactive.get(c, {}).items())]
        if not rest:
            yield decided
            return
        for code in range(n_values[rest[0]]):
            yield from paths({**decided, rest[0]: code})

    expected = any(
        not _is_duplicate(codes, [Step(c, v, 0, 0, 0) for c, v in path.items()], partial)
        for path in paths({})
    )
    unseen = _UnseenPaths(codes, partial, n_values, order, inactive)
    assert unseen.below({}, unseen.every_row) == expected
    for path in paths({}):
        steps = [Step(c, v, 0, 0, 0) for c, v in path.items()]
        assert unseen.repeats(steps) == _is_duplicate(codes, steps, partial)


@pytest.mark.parametrize("seed", range(20))
def test_unique_rows_agrees_with_numpy_unique(seed):
    from autoscout_optuna.samplers._mcts.tree import unique_rows

    rng = np.random.default_rng(seed)
    n_columns = int(rng.integers(1, 8)) if seed % 5 else 40  # 40 columns: the key overflows
    rows = rng.integers(-2, 1 + seed % 4, size=(int(rng.integers(1, 200)), n_columns))
    unique, inverse, counts = unique_rows(rows)
    expected, expected_inverse, expected_counts = np.unique(
        rows, axis=0, return_inverse=True, return_counts=True
    )
    np.testing.assert_array_equal(unique, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_array_equal(unique[inverse], rows)


def test_unique_rows_of_no_rows():
    from autoscout_optuna.samplers._mcts.tree import unique_rows

    unique, inverse, counts = unique_rows(np.zeros((0, 3), dtype=np.int64))
    assert unique.shape == (0, 3) and len(inverse) == 0 and len(counts) == 0


def test_revisions_do_not_descend_below_a_child_whose_completions_were_all_taken(monkeypatch):
    import autoscout_optuna.samplers._mcts.descent as descent

    # Every completion under column 0 = 0 was taken (and scored best, so the greedy path goes
    # there first); under 0 = 1 one of four was.
    paths = [[0, a, b] for a in (0, 1) for b in (0, 1)] + [[1, 0, 0]]
    codes, rewards = _table(paths, [0.9, 0.8, 0.7, 0.6, 0.1])
    heads = []
    real_descend = descent._descend

    def recording(*args):
        heads.append([(s.column, s.code) for s in args[8]])
        return real_descend(*args)

    monkeypatch.setattr(descent, "_descend", recording)
    steps = plan_path(
        codes, [2, 2, 2], rewards, np.ones(5), [0, 1, 2], {}, np.random.default_rng(0), GREEDY
    )
    path = [s.code for s in steps]
    assert path[0] == 1 and path not in paths
    # the first descent starts at the root; no revision starts inside the taken subtree
    assert heads[0] == []
    assert all(head[0] == (0, 1) for head in heads[1:]), heads


def test_bit_rows_are_the_bits_of_each_row():
    from autoscout_optuna.samplers._mcts.descent import _bit_rows, _bits

    masks = np.random.default_rng(3).random((5, 77)) < 0.5
    assert _bit_rows(masks) == [_bits(row) for row in masks]
    assert _bit_rows(np.zeros((2, 0), dtype=bool)) == [0, 0]
