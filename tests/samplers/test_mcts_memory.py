"""The memory model: peak memory reported by trials that ran tells which structures won't fit."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from _memory_space import N_VALUES, OFFSETS, VALUES, every_structure  # tests/samplers/

from autoscout_optuna import AutoScoutSampler, Infeasible, MCTSSampler
from autoscout_optuna._memory import memory_use
from autoscout_optuna.samplers._mcts.feasibility import (
    fit_feasibility,
    memory_features,
    numeric_trends,
)
from autoscout_optuna.samplers._mcts.memory import MIN_ROWS, fit_memory
from autoscout_optuna.samplers._mcts.tree import unique_rows


def log_fraction(codes):
    """Memory halves with each step of tp, doubles with micro-batch; recompute saves a third."""
    mb, tp = VALUES[0][codes[:, 0]], VALUES[1][codes[:, 1]]
    return np.log(0.3 * mb / tp * np.where(codes[:, 2] == 1, 0.67, 1.0))


def fitted(codes, fraction):
    structures, structure, _ = unique_rows(codes)
    trends = numeric_trends(VALUES, OFFSETS)
    model = fit_memory(memory_features(structures, OFFSETS, trends), structure, fraction)
    return model, (lambda rows: memory_features(rows, OFFSETS, trends))


def test_learns_the_memory_law_from_structures_that_fit_and_extrapolates_it():
    rows = every_structure()
    truth = log_fraction(rows)
    fits = truth <= np.log(0.6)  # only light structures ran: none came near the wall
    model, features = fitted(rows[fits], np.exp(truth[fits]))
    p = model.p_out_of_memory(features(rows))
    assert np.all(p[truth > np.log(1.5)] > 0.9)  # unseen, far over the wall
    assert np.all(p[truth < np.log(0.5)] < 0.05)
    assert model.sigma < 0.15  # an exact law: only the ridge's shrinkage is left as error


def test_needs_enough_measured_rows():
    rows = every_structure()[: MIN_ROWS - 1]
    fraction = np.exp(log_fraction(rows))
    assert fitted(rows, fraction)[0] is None
    # rows that reported nothing usable do not count
    rows = every_structure()[:20]
    fraction = np.full(20, np.nan)
    fraction[: MIN_ROWS - 1] = 0.5
    fraction[MIN_ROWS:] = -1.0
    assert fitted(rows, fraction)[0] is None


def test_per_structure_sums_equal_the_ridge_over_every_row():
    # The fit runs on distinct structures with counts; it must be the per-row ridge.
    rng = np.random.default_rng(3)
    rows = every_structure()[rng.integers(0, 40, 120)]
    fraction = np.exp(log_fraction(rows) + rng.normal(0, 0.1, len(rows)))
    model, features = fitted(rows, fraction)
    x, y = features(rows), np.log(fraction)
    mean = y.mean()
    weights = np.linalg.solve(x.T @ x + np.eye(x.shape[1]), x.T @ (y - mean))
    assert model.mean == pytest.approx(mean)
    assert np.allclose(model.weights, weights)


def test_feasibility_model_without_any_failure_still_predicts_out_of_memory():
    rows = every_structure()
    truth = log_fraction(rows)
    light = truth <= np.log(0.6)
    codes = rows[light]
    memory = np.exp(truth[light])
    kwargs = dict(numeric=VALUES)
    blind = fit_feasibility(codes, N_VALUES, np.zeros(len(codes), bool),
                            np.ones(len(codes), bool), **kwargs)
    seeing = fit_feasibility(codes, N_VALUES, np.zeros(len(codes), bool),
                             np.ones(len(codes), bool), memory=memory, **kwargs)
    heavy = rows[truth > np.log(1.5)]
    assert np.all(blind.p_fail(heavy) == 0.0)
    assert np.all(seeing.p_fail(heavy) > 0.9)


@pytest.mark.parametrize(
    "kind, value, expected",
    [("real", 0.7, 0.7), ("real", 2, 2.0), ("estimate", 0.7, math.nan),
     ("failed", 0.7, math.nan), ("real", None, math.nan), ("real", "0.7", math.nan),
     ("real", True, math.nan), ("real", -0.1, math.nan), ("real", 0.0, math.nan),
     ("real", math.inf, math.nan), ("real", math.nan, math.nan)],
)
def test_only_a_positive_number_from_a_trial_that_ran_counts(kind, value, expected):
    attrs = {} if value is None else {"memory_use": value}
    got = memory_use(kind, attrs)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


def test_a_trial_that_ran_out_of_memory_is_over_capacity_by_an_unknown_amount():
    assert memory_use("failed", {"failure_reason": "oom"}) == math.inf
    assert math.isnan(memory_use("failed", {"failure_reason": "timeout"}))
    # the model fits only measured peaks: an infinite one is no row
    rows = every_structure()[:MIN_ROWS]
    fraction = np.exp(log_fraction(rows))
    fraction[0] = math.inf
    assert fitted(rows, fraction)[0] is None


def _memory_objective(report: bool):
    def objective(trial: optuna.Trial) -> float:
        mb = trial.suggest_categorical("micro_batch", [1, 2, 4, 8, 16, 32])
        tp = trial.suggest_categorical("tp", [1, 2, 4, 8])
        recompute = trial.suggest_categorical("recompute", ["none", "full"])
        fraction = 0.12 * mb / tp * (0.6 if recompute == "full" else 1.0)
        if fraction > 1.0:
            trial.set_user_attr("failure_reason", "oom")
            raise Infeasible("oom")
        if report:
            trial.set_user_attr("memory_use", fraction)
        # bigger micro-batches run faster; parallelism and recomputation cost a little
        return math.log(mb) - 0.15 * math.log(tp) - (0.3 if recompute == "full" else 0.0)

    return objective


def test_mcts_runs_fewer_structures_that_do_not_fit_when_trials_report_memory():
    def failures(report: bool) -> int:
        total = 0
        for seed in range(4):
            sampler = MCTSSampler(seed=seed, memory_model=True)
            study = optuna.create_study(direction="maximize", sampler=sampler)
            study.optimize(_memory_objective(report), n_trials=30, catch=(Infeasible,))
            total += sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
        return total

    assert failures(report=True) < failures(report=False)


def test_the_plan_records_the_memory_it_expects():
    sampler = MCTSSampler(seed=0, memory_model=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(_memory_objective(report=True), n_trials=25, catch=(Infeasible,))
    records = [t.user_attrs.get("mcts:feasibility", {}) for t in study.trials]
    expected = [r["memory_use"] for r in records if "memory_use" in r]
    assert expected, "no plan recorded a memory prediction"
    for trial, record in zip(study.trials, records, strict=True):
        if "memory_use" in record and "memory_use" in trial.user_attrs:
            # the law is exact and log-linear: predictions land near what the trial reports
            assert record["memory_use"] == pytest.approx(trial.user_attrs["memory_use"], rel=0.5)



def _trials(sampler, n_trials=25):
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(_memory_objective(report=True), n_trials=n_trials, catch=(Infeasible,))
    return [(t.params, t.state) for t in study.trials], study


def test_off_by_default_memory_reports_change_nothing():
    with_reports, study = _trials(MCTSSampler(seed=1))
    assert not any("memory_use" in t.user_attrs.get("mcts:feasibility", {})
                   for t in study.trials)
    # the same search as on an objective that reports nothing
    study = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=1))
    study.optimize(_memory_objective(report=False), n_trials=25, catch=(Infeasible,))
    assert with_reports == [(t.params, t.state) for t in study.trials]


def test_autoscout_hands_the_option_to_mcts_and_the_model_arm(monkeypatch):
    from autoscout_optuna.samplers._autoscout import plan as autoscout_plan

    seen = []
    original = autoscout_plan.propose_encoded

    def spy(*args, **kwargs):
        seen.append(kwargs.get("memory") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(autoscout_plan, "propose_encoded", spy)
    _, study = _trials(AutoScoutSampler(seed=0, memory_model=True), n_trials=40)
    assert any("memory_use" in t.user_attrs.get("mcts:feasibility", {}) for t in study.trials)
    assert seen and all(seen)
    seen.clear()
    _trials(AutoScoutSampler(seed=0), n_trials=40)
    assert seen and not any(seen)
