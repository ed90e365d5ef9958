"""Broken rules: the structural choices that full-length rule failures share."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import Infeasible, MCTSSampler
from autoscout_optuna._failure import breaks_a_rule
from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility
from autoscout_optuna.samplers._mcts.rules import rule_patterns


@pytest.mark.parametrize(
    ("reason", "rule"),
    [("invalid_combination", True), ("invalid_layout", True), ("unsupported", True),
     ("oom", False), ("kv_cache_oom", False), ("timeout", False), (None, False), (3, False)],
)
def test_rule_reasons_are_the_invalid_and_unsupported_ones(reason, rule):
    assert breaks_a_rule(reason) is rule


# Columns: zero stage (0-3), CUDA graphs (0/1), micro-batch (0-2), pp (0-1). ZeRO 3 with graphs
# breaks a rule.
FEASIBLE = [[0, 1, 0, 0], [1, 1, 1, 1], [3, 0, 0, 0], [3, 0, 2, 1], [2, 1, 2, 0]]


def test_two_rule_failures_blame_what_they_share_and_nothing_that_lacks_it():
    codes = np.array(FEASIBLE + [[3, 1, 1, 1], [3, 1, 0, 1]])
    broke = np.array([False] * 5 + [True, True])
    patterns = rule_patterns(codes, broke, ~broke)
    # The two failures share ZeRO 3, graphs and pp 1; no feasible row made all three.
    pairs = zip(patterns.columns, patterns.codes, strict=True)
    assert [(c.tolist(), v.tolist()) for c, v in pairs] == [([0, 1, 3], [3, 1, 1])]
    assert patterns.failures.tolist() == [2]
    rows = np.array([[3, 1, 2, 1], [3, 1, 2, 0], [0, 1, 1, 1], [3, 0, 1, 1]])
    # Only a row with all three choices is judged: a companion that happened to be there
    # (pp 1 with graphs, as the optimum might have) is never blamed alone.
    np.testing.assert_allclose(patterns.p_fail(rows), [0.75, 0.0, 0.0, 0.0])
    assert rule_patterns(codes[:6], broke[:6], ~broke[:6]).failures.size == 0  # one names none
    # a feasible row that made every shared choice clears the pattern
    cleared = np.vstack([codes, [[3, 1, 2, 1]]])
    clearing = rule_patterns(cleared, np.append(broke, False), np.append(~broke, True))
    assert clearing.failures.size == 0
    # a third failure without pp 1 narrows the blame to ZeRO 3 with graphs
    third = np.vstack([codes, [[3, 1, 2, 0]]])
    wider = rule_patterns(third, np.append(broke, True), np.append(~broke, False))
    np.testing.assert_allclose(wider.p_fail(np.array([[3, 1, 0, 0]])), [1 - 0.5**3])


def test_the_feasibility_model_bars_the_pattern_only_when_the_failures_broke_a_rule():
    codes = np.array(FEASIBLE + [[3, 1, 1, 1], [3, 1, 0, 1]])
    failed = np.array([False] * 5 + [True, True])
    args = (codes, [4, 2, 3, 2], failed, ~failed)
    new_rows = np.array([[3, 1, 2, 1], [3, 0, 1, 1], [0, 1, 1, 1]])
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
