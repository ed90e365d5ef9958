"""Learned infeasibility in MCTS: the pure model, and proposals steered away from failures."""

from __future__ import annotations

import types

import numpy as np
import optuna
import pytest

from autoscout_optuna import MCTSSampler
from autoscout_optuna.samplers._mcts import plan as plan_module
from autoscout_optuna.samplers._mcts.descent import Step, TreePolicy
from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility
from autoscout_optuna.samplers._mcts.plan import PlanSettings, fail_bar
from autoscout_optuna.samplers._mcts.sampler import FEASIBILITY_KEY
from autoscout_optuna.samplers._mcts.tree import ABSENT

MEMORY = {"micro_batch": [1, 2, 4, 8], "recompute": ["full", "none"], "shard": [4, 1]}


def _memory_rows():
    """Every (micro_batch, recompute, shard) combination; OOM when the memory sum is > 3."""
    codes, failed = [], []
    for mb in range(4):
        for rc in range(2):
            for sh in range(2):
                codes.append([mb, rc, sh])
                failed.append(mb + 2 * rc + sh > 3)
    return np.array(codes), np.array(failed)


def test_model_ranks_configs_by_the_memory_they_add():
    codes, failed = _memory_rows()
    seen = np.ones(len(codes), dtype=bool)
    seen[[13, 15]] = False  # hold out two configs with micro_batch 8 and shard 1
    model = fit_feasibility(codes[seen], [4, 2, 2], failed[seen], ~failed[seen])
    p = model.p_fail(codes)
    assert p[failed].mean() > p[~failed].mean() + 0.2
    assert p[15] > 0.5 > p[0]  # held out, the most memory-hungry config; the lightest
    # More memory under the same other choices: more likely to fail.
    assert p[4 * 3 + 2 * 1 + 1] > p[4 * 0 + 2 * 1 + 1] and p[4 * 2 + 1] > p[4 * 2]


def test_model_without_a_full_length_failure_predicts_nothing():
    codes = np.array([[0, 1], [1, 0], [0, ABSENT]])
    prefix_failure = np.array([False, False, True])  # failed before asking column 1
    model = fit_feasibility(codes, [2, 2], prefix_failure, ~prefix_failure)
    np.testing.assert_array_equal(model.p_fail(codes), np.zeros(3))


def _memory_objective(trial):
    mb = trial.suggest_categorical("micro_batch", MEMORY["micro_batch"])
    recompute = trial.suggest_categorical("recompute", MEMORY["recompute"])
    shard = trial.suggest_categorical("shard", MEMORY["shard"])
    layout = trial.suggest_categorical("layout", ["a", "b", "c"])
    if np.log2(mb) + 2 * (recompute == "none") + (shard == 1) > 3:
        raise RuntimeError("oom")
    return np.log2(mb) + (recompute == "none") + 0.5 * (shard == 1) + {"a": 0, "b": 0.2, "c": 0.1}[
        layout
    ]


def _oom_configs(study, start):
    return [t for t in study.trials[start:] if t.state == optuna.trial.TrialState.FAIL]


def test_structures_whose_neighbours_all_failed_are_not_proposed_again():
    fails = []
    for seed in range(3):
        study = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=seed))
        study.optimize(_memory_objective, n_trials=60, catch=(RuntimeError,))
        late = _oom_configs(study, 30)
        fails.append(len(late))
        records = [t.user_attrs.get(FEASIBILITY_KEY) for t in study.trials[30:]]
        assert any(r and r["rejected"] for r in records)  # rejections are recorded
        for record in filter(None, records):
            assert 0.3 <= record["bar"] <= 0.6
            for p_fail, bar, path in record["rejected"]:
                assert p_fail > bar >= 0.3 and set(path) <= {"micro_batch", "recompute",
                                                             "shard", "layout"}
    # 24 of the 48 structures fail; uninformed, half the late trials would.
    assert np.mean(fails) < 0.25 * 30


def _steps(*values):
    return [Step(column=i, code=0, score=v + 1.0, value=v, visits=1.0)
            for i, v in enumerate(values)]


def test_a_promising_path_may_take_more_risk():
    settings = PlanSettings()  # max_fail_probability 0.3, slack 0.3
    assert fail_bar(_steps(0.0, 0.0), settings) == pytest.approx(0.3)
    assert fail_bar(_steps(1.0, 0.5), settings) == pytest.approx(0.3 + 0.3 * 0.75)
    # A failed branch's negative value counts as no promise, not as a lower bar.
    assert fail_bar(_steps(-0.05, 1.0), settings) == pytest.approx(0.3 + 0.3 * 0.5)
    assert fail_bar([], settings) == pytest.approx(0.3)
    fixed = PlanSettings(fail_promise_slack=0.0)
    assert fail_bar(_steps(1.0, 1.0), fixed) == pytest.approx(0.3)


def test_an_accepted_promising_path_is_run_even_if_a_rejected_one_was_safer(monkeypatch):
    safer_dull = [Step(column=0, code=0, score=0.1, value=0.0, visits=1.0)]  # bar 0.3
    riskier_promising = [Step(column=0, code=1, score=1.1, value=1.0, visits=1.0)]  # bar 0.6
    draws = iter([safer_dull, riskier_promising])
    p_of_code = {0: 0.35, 1: 0.5}
    monkeypatch.setattr(plan_module, "plan_path", lambda *a, **k: next(draws))
    model = types.SimpleNamespace(p_fail=lambda row: np.array([p_of_code[int(row[0])]]),
                                  predicts_memory=False, calibration=None)
    monkeypatch.setattr(plan_module, "fit_feasibility", lambda *a, **k: model)
    table = types.SimpleNamespace(
        values=[["a", "b"]], kinds=["real"], codes=np.array([[0]]), positions=np.array([[0]]),
        broke_rule=np.zeros(1, dtype=bool), memory=np.full(1, np.nan),
    )
    evidence = plan_module.Evidence(table, np.array([0.5]), np.array([1.0]))
    steps, record = plan_module._feasible_path(
        evidence, [0], {}, np.random.default_rng(0), TreePolicy(), PlanSettings(), None
    )
    assert steps == riskier_promising
    assert record["p_fail"] == 0.5 and record["bar"] == pytest.approx(0.6)
    assert record["rejected"] == [(0.35, 0.3, safer_dull)]


def test_resume_from_sqlite_reproduces_feasibility_decisions(tmp_path):
    storage = f"sqlite:///{tmp_path / 'f.db'}"
    whole = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=1))
    whole.optimize(_memory_objective, n_trials=40, catch=(RuntimeError,))
    first = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=1),
                                storage=storage, study_name="s")
    first.optimize(_memory_objective, n_trials=25, catch=(RuntimeError,))
    resumed = optuna.load_study(study_name="s", storage=storage, sampler=MCTSSampler(seed=1))
    resumed.optimize(_memory_objective, n_trials=15, catch=(RuntimeError,))
    assert [t.params for t in resumed.trials] == [t.params for t in whole.trials]
    assert [t.user_attrs.get(FEASIBILITY_KEY) for t in resumed.trials] == [
        t.user_attrs.get(FEASIBILITY_KEY) for t in whole.trials
    ]


@pytest.mark.parametrize("with_trends", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_logistic_fit_matches_the_dense_newton_solution(seed, with_trends):
    # The fit works on feature indices, never forming the one-hot design (no BLAS threads):
    # it must land on the same penalized optimum as the textbook dense Newton iteration, also
    # with absent params, values outside the domain, and a failure rate near 0; with numeric
    # trends, the dense design has one more column per trend (its rows' values).
    from autoscout_optuna.samplers._mcts.feasibility import (
        L2,
        _logistic,
        numeric_trends,
        one_hot,
    )
    from autoscout_optuna.samplers._mcts.tree import OTHER

    rng = np.random.default_rng(seed)
    n_values = [int(v) for v in rng.integers(2, 6, size=5)]
    offsets = np.concatenate([[0], np.cumsum(n_values)]).astype(int)
    codes = np.stack([rng.integers(0, n, size=300) for n in n_values], axis=1)
    codes[rng.random(codes.shape) < 0.1] = ABSENT
    codes[rng.random(codes.shape) < 0.02] = OTHER
    heavy = (codes == 0).sum(axis=1) + rng.normal(0.0, 1.0, len(codes))
    y = (heavy > np.quantile(heavy, 0.9 if seed else 0.995)).astype(float)

    numeric = [np.array([1, 2, 4, 8, 16][:n], dtype=float) for n in n_values]
    numeric[1] = None  # a column that is not numbers
    trends = numeric_trends(numeric, offsets) if with_trends else None
    features = one_hot(codes, offsets)
    extra = [] if trends is None else [features @ trends]
    design = np.hstack([np.ones((len(codes), 1)), features, *extra])
    penalty = np.full(design.shape[1], L2)
    penalty[0] = 1e-6
    beta = np.zeros(design.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ beta)))
        hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        beta -= np.linalg.solve(hessian, design.T @ (p - y) + penalty * beta)

    weights, intercept = _logistic(codes, offsets, y, trends)
    n_features = features.shape[1]
    expected = beta[1: 1 + n_features]
    if trends is not None:  # each feature's effective weight carries its trends' share
        assert trends.shape[1] == sum(n >= 3 for n in n_values[:1] + n_values[2:])
        expected = expected + trends @ beta[1 + n_features:]
    np.testing.assert_allclose(weights, expected, atol=1e-8)
    assert abs(intercept - beta[0]) < 1e-8


def test_a_numeric_trend_carries_failure_to_an_unseen_heavier_value():
    # Failures rise with micro_batch 1 -> 2 -> 4; 8 was never run. Alone, its one-hot weight
    # has no data and stays 0 (the base rate); the trend puts it above the values seen.
    from autoscout_optuna.samplers._mcts.feasibility import _logistic, numeric_trends

    offsets = np.array([0, 4])
    codes = np.repeat([[0], [1], [2]], 6, axis=0)
    y = np.array([0] * 6 + [0, 0, 0, 0, 1, 1] + [1, 1, 1, 1, 0, 1], dtype=float)
    plain, _ = _logistic(codes, offsets, y)
    trends = numeric_trends([np.array([1.0, 2.0, 4.0, 8.0])], offsets)
    trended, _ = _logistic(codes, offsets, y, trends)
    assert plain[3] == 0.0
    assert trended[3] > trended[2] > trended[1] > trended[0]


def test_a_structure_that_fails_with_the_trials_dense_values_is_redrawn(monkeypatch):
    # Column 0 is a switch (chunked prefill, say), column 1 a harmless choice. With the old
    # dense values (rows 0-2) "off" ran; with the values this trial gets (rows 3-7) every
    # "off" failed on a rule. Fitted on all rows the model forgives "off"; the trial runs
    # with the new values, so the rows with those values must be heard too.
    codes = np.array([[0, 0], [1, 0], [1, 1], [0, 0], [0, 1], [1, 0], [1, 1], [0, 2]])
    kinds = ["real"] * 5 + ["failed"] * 2 + ["real"]
    table = types.SimpleNamespace(
        values=[["on", "off"], ["a", "b", "c"]], kinds=kinds, codes=codes,
        positions=np.tile([0, 1], (8, 1)), broke_rule=np.array([False] * 5 + [True] * 2 + [False]),
        memory=np.full(8, np.nan),
    )
    evidence = plan_module.Evidence(table, np.array([0.5] * 5 + [-0.05] * 2 + [0.5]), np.ones(8))
    off_c = [Step(0, 1, 0.5, 0.5, 1.0), Step(1, 2, 0.5, 0.5, 0.0)]
    on_b = [Step(0, 0, 0.4, 0.4, 2.0), Step(1, 1, 0.4, 0.4, 1.0)]
    with_new_values = np.array([False] * 3 + [True] * 5)
    for repeatable, runs in ((None, off_c), (with_new_values, on_b)):
        draws = iter([off_c, on_b])
        monkeypatch.setattr(plan_module, "plan_path", lambda *a, d=draws, **k: next(d))
        steps, record = plan_module._feasible_path(
            evidence, [0, 1], {}, np.random.default_rng(0), TreePolicy(), PlanSettings(),
            repeatable,
        )
        assert steps == runs, record
    assert record["rejected"][0][0] > record["rejected"][0][1]  # "off" over its bar
