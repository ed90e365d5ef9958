"""Broken rules: the pair of structural choices that full-length rule failures share."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import Infeasible, MCTSSampler
from autoscout_optuna._failure import breaks_a_rule
from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility
from autoscout_optuna.samplers._mcts.rules import rule_pairs


@pytest.mark.parametrize(
    ("reason", "rule"),
    [("invalid_combination", True), ("invalid_layout", True), ("unsupported", True),
     ("oom", False), ("kv_cache_oom", False), ("timeout", False), (None, False), (3, False)],
)
def test_rule_reasons_are_the_invalid_and_unsupported_ones(reason, rule):
    assert breaks_a_rule(reason) is rule


# Columns: zero stage (0-3), CUDA graphs (0/1), micro-batch (0-2). ZeRO 3 with graphs breaks.
FEASIBLE = [[0, 1, 0], [1, 1, 1], [3, 0, 0], [3, 0, 2], [2, 1, 2]]


def test_the_pair_two_rule_failures_share_and_no_feasible_row_has_is_named():
    codes = np.array(FEASIBLE + [[3, 1, 1], [3, 1, 0]])
    broke = np.array([False] * 5 + [True, True])
    pairs = rule_pairs(codes, broke, ~broke)
    # (zero 3, graphs) is in both failures; (zero 3, micro-batch 0) is in one failure only and
    # in a feasible row; the failures share no other pair.
    assert pairs.tolist() == [[0, 3, 1, 1, 2]]
    assert rule_pairs(codes[:6], broke[:6], ~broke[:6]).size == 0  # one failure names nothing
    # a feasible row with the pair clears it
    cleared = np.vstack([codes, [[3, 1, 2]]])
    assert rule_pairs(cleared, np.append(broke, False), np.append(~broke, True)).size == 0


def test_the_feasibility_model_bars_the_pair_only_when_the_failures_broke_a_rule():
    codes = np.array(FEASIBLE + [[3, 1, 1], [3, 1, 0]])
    failed = np.array([False] * 5 + [True, True])
    args = (codes, [4, 2, 3], failed, ~failed)
    new_rows = np.array([[3, 1, 2], [3, 0, 1], [0, 1, 1]])
    as_rule = fit_feasibility(*args, broke_rule=failed).p_fail(new_rows)
    as_resource = fit_feasibility(*args, broke_rule=np.zeros(7, dtype=bool)).p_fail(new_rows)
    assert as_rule[0] >= 0.75 > as_resource[0]
    np.testing.assert_allclose(as_rule[1:], as_resource[1:])


def _objective(reason: str):
    def objective(trial: optuna.Trial) -> float:
        # Larger "a" and larger "b" each look better, but a=3 with b=3 breaks a rule.
        a = trial.suggest_categorical("a", [0, 1, 2, 3])
        b = trial.suggest_categorical("b", [0, 1, 2, 3])
        c = trial.suggest_categorical("c", ["x", "y", "z", "w"])
        if a == 3 and b == 3:
            trial.set_user_attr("failure_reason", reason)
            raise Infeasible(reason)
        return a + b + {"x": 0.0, "y": 0.2, "z": 0.1, "w": 0.3}[c] + 0.01 * trial.number

    return objective


def _repeats(reason: str, seed: int) -> int:
    study = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=seed))
    study.optimize(_objective(reason), n_trials=60, catch=(Infeasible,))
    return sum(t.state == TrialState.FAIL for t in study.trials)


def test_a_broken_rule_is_tried_at_most_twice_where_a_resource_failure_is_retried():
    rule = [_repeats("invalid_combination", seed) for seed in range(4)]
    resource = [_repeats("oom", seed) for seed in range(4)]
    assert max(rule) <= 2, rule
    assert sum(resource) > sum(rule), (rule, resource)
