"""The monotone dominance rule of MCTS's feasibility model, on plain numbers."""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._mcts.feasibility import DOMINATED_P_FAIL, fit_feasibility
from autoscout_optuna.samplers._mcts.monotone import fit_dominance
from autoscout_optuna.samplers._mcts.tree import ABSENT, OTHER, unique_rows

# Two numeric columns (micro-batch 1/2/4/8, shards 1/2/4) and one of strings (3 values).
NUMERIC = [np.array([1.0, 2.0, 4.0, 8.0]), np.array([1.0, 2.0, 4.0]), None]
# Logistic weights: failure rises with micro-batch, falls with sharding; string order c < a < b.
WEIGHTS = [np.array([-1.0, -0.2, 0.4, 0.0]), np.array([0.8, 0.1, -0.9]),
           np.array([0.0, 0.5, -0.5])]


def _model(codes, failed):
    codes, failed = np.array(codes), np.array(failed)
    return fit_dominance(codes, NUMERIC, WEIGHTS, failed, ~failed)


# One failure (micro-batch 4, 2 shards, "c") and two successes.
ROWS, FAILED = [[2, 1, 2], [1, 1, 0], [0, 2, 2]], [True, False, False]


def test_heavier_than_a_failure_fails_and_lighter_than_a_success_fits():
    fails, fits = _model(ROWS, FAILED).verdicts(np.array([
        [3, 1, 2],  # more micro-batch than the failure (8 was never seen: extrapolated)
        [2, 0, 2],  # less sharding than the failure
        [2, 2, 2],  # more sharding: lighter than the failure, says nothing
        [1, 1, 2],  # the success [1, 1, 0] with the lighter string value "c"
        [0, 2, 0],  # lighter than the success [1, 1, 0]
        [2, 1, 0],  # the failure with the heavier string value "a"
    ]))
    np.testing.assert_array_equal(fails, [True, True, False, False, False, True])
    np.testing.assert_array_equal(fits, [False, False, False, True, True, False])


def test_values_the_data_do_not_order_must_be_equal():
    # A column whose weights do not rise or fall with its values gets no direction.
    weights = [WEIGHTS[0], np.array([0.5, -0.5, 0.5]), WEIGHTS[2]]
    codes, failed = np.array([[2, 1, 2], [1, 0, 0], [0, 2, 2]]), np.array(FAILED)
    model = fit_dominance(codes, NUMERIC, weights, failed, ~failed)
    fails, _ = model.verdicts(np.array([[2, 0, 2], [2, 2, 2], [3, 1, 2]]))
    np.testing.assert_array_equal(fails, [False, False, True])
    # A string value the data never saw ("b") cannot be placed either.
    assert not _model(ROWS, FAILED).verdicts(np.array([2, 1, 1]))[0][0]


def test_absent_and_out_of_domain_values_compare_only_when_equal():
    model = _model([[2, ABSENT, 2], [1, 1, 0], [0, 2, 2]], FAILED)
    fails, _ = model.verdicts(np.array([[3, ABSENT, 2], [3, 0, 2]]))
    np.testing.assert_array_equal(fails, [True, False])
    model = _model([[2, OTHER, 2], [1, 1, 0], [0, 2, 2]], FAILED)
    assert not model.verdicts(np.array([3, OTHER, 2]))[0][0]


def test_a_failure_a_success_dominates_is_no_evidence():
    # The same structure failed once and ran once (other dense values, a non-monotone cause):
    # neither row predicts anything about heavier or lighter structures.
    model = _model([[1, 1, 0], [1, 1, 0], [0, 2, 2]], [True, False, False])
    fails, fits = model.verdicts(np.array([[2, 1, 0], [0, 1, 0], [0, 2, 2]]))
    np.testing.assert_array_equal(fails, [False, False, False])
    np.testing.assert_array_equal(fits, [False, False, True])  # the other success counts


def test_feasibility_model_applies_the_rule_only_when_given_numeric_values():
    codes = np.array([[2, 1, 0], [0, 1, 0], [1, 2, 1], [0, 0, 2]])
    failed = np.array([True, False, False, False])
    candidates = np.array([[3, 1, 0], [0, 0, 2]])
    plain = fit_feasibility(codes, [4, 3, 3], failed, ~failed)
    monotone = fit_feasibility(codes, [4, 3, 3], failed, ~failed, numeric=NUMERIC)
    p_plain, p = plain.p_fail(candidates), monotone.p_fail(candidates)
    assert p_plain[0] < DOMINATED_P_FAIL and p[0] == DOMINATED_P_FAIL
    assert p_plain[1] > 0.0 and p[1] == 0.0


def test_repeated_structures_are_one_anchor_and_blocks_give_the_same_answer(monkeypatch):
    from autoscout_optuna.samplers._mcts import monotone

    rng = np.random.default_rng(0)
    candidates = np.column_stack([rng.integers(0, 4, 200), rng.integers(0, 3, 200),
                                  rng.integers(0, 3, 200)])
    single = _model(ROWS, FAILED)
    repeated = _model(ROWS * 50, FAILED * 50)  # each structure refined 50 times
    assert len(repeated.failures) == 1 and len(repeated.successes) == 2
    expected = single.verdicts(candidates)
    monkeypatch.setattr(monotone, "CELLS_PER_BLOCK", 7)  # a block of one or two rows
    for got, want in zip(repeated.verdicts(candidates), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert expected[0].any() and expected[1].any()  # both verdicts occur


def _dominates(heavy, light, heaviness) -> bool:
    """The rule, cell by cell: in every column equal codes (not OTHER), or both ordered and
    ``heavy``'s value at least as heavy."""
    for column, (a, b) in enumerate(zip(heavy, light, strict=True)):
        if a == b and a != OTHER:
            continue
        if a >= 0 and b >= 0 and heaviness[column, a] >= heaviness[column, b]:
            continue
        return False
    return True


def test_verdicts_agree_with_the_rule_pair_by_pair():
    # The verdicts compare packed bit masks per column; on random tables they must say what
    # comparing every candidate with every anchor says, absent, OTHER and unordered included.
    rng = np.random.default_rng(3)
    verdicts_seen = 0
    for _ in range(60):
        sizes = rng.integers(1, 6, size=rng.integers(1, 6))
        numeric = [np.sort(rng.choice(20, n, replace=False)).astype(float)
                   if rng.random() < 0.6 else None for n in sizes]
        weights = [rng.normal(size=n) for n in sizes]
        n_rows = int(rng.integers(1, 40))
        codes = np.column_stack([rng.integers(OTHER, n, n_rows) for n in sizes])
        failed = rng.random(n_rows) < 0.4
        model = fit_dominance(codes, numeric, weights, failed, ~failed)
        candidates = np.column_stack([rng.integers(OTHER, n, 50) for n in sizes])
        fails, fits = model.verdicts(candidates)
        h = model.heaviness
        for row, fail, fit in zip(candidates, fails, fits, strict=True):
            assert fail == any(_dominates(row, f, h) for f in model.failures)
            assert fit == any(_dominates(s, row, h) for s in model.successes)
        verdicts_seen += int(fails.sum() + fits.sum())
        # the anchors kept are exactly those no anchor of the other kind contradicts
        failures, successes = unique_rows(codes[failed])[0], unique_rows(codes[~failed])[0]
        kept_failures = [f for f in failures if not any(_dominates(s, f, h) for s in successes)]
        kept_successes = [s for s in successes if not any(_dominates(s, f, h) for f in failures)]
        np.testing.assert_array_equal(model.failures, np.reshape(kept_failures, (-1, len(sizes))))
        np.testing.assert_array_equal(model.successes,
                                      np.reshape(kept_successes, (-1, len(sizes))))
    assert verdicts_seen > 100
