import math

import optuna
import pandas as pd
import pytest

from autoscout_optuna import Infeasible, studies
from autoscout_optuna.benchmark.suites import _fidelity_report, fidelity
from autoscout_optuna.benchmark.suites._oracle import ORACLE_KEY, OraclePruner, with_oracle_value


@pytest.fixture(scope="module")
def serving():
    return studies.load("llm_serving")


def _trial_with(definition):
    """A trial whose config is feasible (the simulators need a reference value)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    while True:
        trial = study.ask()
        try:
            config = definition.suggest(trial)
            definition.measure(config, None)
            return study, trial, config
        except Infeasible:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_simulator_noise_is_seeded_per_trial(serving):
    _, trial, config = _trial_with(serving)
    truth = serving.measure(config, None)
    assert fidelity.noisy_reference(serving, 0.0, 3, trial, config) == truth
    first = fidelity.noisy_reference(serving, 0.2, 3, trial, config)
    assert first == fidelity.noisy_reference(serving, 0.2, 3, trial, config)
    assert first != fidelity.noisy_reference(serving, 0.2, 4, trial, config)
    assert first != truth


def test_biased_simulator_is_a_fixed_factor_per_structure(serving):
    _, trial, config = _trial_with(serving)
    factor = fidelity.biased_reference(serving, 0, trial, config) / serving.measure(config, None)
    n_structural = sum(fidelity.is_structural(d) for d in trial.distributions.values())
    assert factor == fidelity.biased_reference(serving, 0, trial, config) / serving.measure(
        config, None
    )
    assert abs(math.log(factor)) <= fidelity.BIAS_PER_VALUE * n_structural + 1e-12
    assert factor != 1.0


def test_suites_compare_the_same_sampler_with_and_without_simulators():
    suite, _ = fidelity.suites(quick=True)
    names = [c.name for c in suite.contenders]
    assert names[0] == fidelity.SAMPLER
    assert all(name.startswith((fidelity.SAMPLER + "+sim", fidelity.SAMPLER + "+oracle"))
               for name in names[1:])
    assert all(c.make_pruner is not None for c in suite.contenders[1:])
    oracles = [c for c in suite.contenders if "+oracle" in c.name]
    assert len(oracles) == len(fidelity.ORACLE_TOLERANCES)
    assert all(isinstance(c.make_pruner(0), OraclePruner) for c in oracles)


def test_long_suite_is_the_headline_pair_past_the_short_suites_censoring():
    short, long = fidelity.suites()
    assert long.name == "fidelity-long" and long.n_seeds == fidelity.LONG_N_SEEDS > short.n_seeds
    assert [c.name for c in long.contenders] == [fidelity.SAMPLER,
                                                  f"{fidelity.SAMPLER}+sim noise 20%"]
    assert long.n_trials > short.n_trials and max(long.budgets) == long.n_trials
    assert fidelity.LONG_REAL_RUN_BUDGET > fidelity.REAL_RUN_BUDGET
    # each contender is the short suite's, with the larger real-run budget
    assert [c.make_objective.args[-1] for c in long.contenders] == [
        fidelity.LONG_REAL_RUN_BUDGET] * 2
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    objective = fidelity.long_contenders(budget=2)[0].make_objective(
        studies.load("llm_serving"), 0)
    study.optimize(objective, n_trials=50, catch=(Infeasible,))
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2


def test_run_stats_counts_only_real_runs():
    rows = []
    # One run: a pruned trial "at the optimum" comes first; only the later real run counts.
    for trial, (state, true_value, best) in enumerate(
        [("COMPLETE", 50.0, 50.0), ("PRUNED", 100.0, 50.0), ("COMPLETE", 99.5, 99.5)]
    ):
        rows.append(dict(
            suite="fidelity", study="s", definition="s", direction="maximize", optimum=100.0,
            contender="c", seed=0, trial=trial, state=state, value=true_value,
            true_value=true_value, best_true_so_far=best, is_real_run=state == "COMPLETE",
            is_low_fidelity=state == "PRUNED", failure_reason="", sampler_ms=0.0,
        ))
    stats = _fidelity_report.run_stats(pd.DataFrame(rows))
    assert stats.loc[0, "real_runs_to_99"] == 2 and stats.loc[0, "reached_99"]
    assert stats.loc[0, "real_runs_total"] == 2


def test_real_runs_table_without_the_sampler_alone_has_no_ratio_column_to_fill():
    rows = [dict(
        suite="fidelity", study="s", definition="s", direction="maximize", optimum=100.0,
        contender="c+sim", seed=0, trial=0, state="COMPLETE", value=99.5, true_value=99.5,
        best_true_so_far=99.5, is_real_run=True, is_low_fidelity=False, failure_reason="",
        sampler_ms=0.0,
    )]
    (header, _, line) = _fidelity_report.real_runs_table(
        _fidelity_report.run_stats(pd.DataFrame(rows)), baseline="c")
    assert line.split(" | ")[:5] == ["| s", "c+sim", "1/1", "1", "-"]


def _oracle_states(values, direction, tolerance):
    """States of trials whose noiseless value is each of ``values`` in turn, under the oracle."""
    study = optuna.create_study(direction=direction, pruner=OraclePruner(tolerance=tolerance))
    for value in values:
        study.enqueue_trial({"x": value})

    def objective(trial):
        x = trial.suggest_float("x", 0.0, 10.0)
        trial.set_user_attr(ORACLE_KEY, x)
        trial.report(x * 1.5, 0)  # a badly scaled estimate: the oracle must not read it
        if trial.should_prune():
            raise optuna.TrialPruned()
        return x

    study.optimize(objective, n_trials=len(values))
    return [t.state.name[0] for t in study.trials], study


def test_oracle_pruner_runs_exactly_what_beats_the_best_real_run():
    states, study = _oracle_states([5, 3, 7, 6, 7, 9], "maximize", 0.0)
    assert states == ["C", "P", "C", "P", "P", "C"]  # a tie with the best is no improvement
    reasons = [t.user_attrs["autoscout:fidelity_reason"] for t in study.trials]
    assert reasons == ["oracle_real", "oracle_simulator", "oracle_real", "oracle_simulator",
                       "oracle_simulator", "oracle_real"]
    # the pruner's own records stay, so the sampler reads the study as with FidelityPruner
    assert study.trials[1].user_attrs["autoscout:estimate"] == 4.5
    states, _ = _oracle_states([5, 3, 2, 4, 1], "minimize", 0.0)
    assert states == ["C", "C", "C", "P", "C"]


def test_oracle_tolerance_runs_what_comes_close_to_the_best():
    states, _ = _oracle_states([5, 4.9, 4.7, 5.2, 5.0], "maximize", 0.03)
    assert states == ["C", "C", "P", "C", "P"]  # 5.0 < 5.2 - 3 % of 5.2
    states, _ = _oracle_states([5, 5.1, 5.2, 4], "minimize", 0.03)
    assert states == ["C", "C", "P", "C"]


def test_oracle_without_a_noiseless_value_decides_as_the_pruner_does():
    study = optuna.create_study(pruner=OraclePruner())
    trial = study.ask()
    trial.report(1.0, 0)
    assert not trial.should_prune()  # warm-up: the first real runs go through
    assert study.trials[0].user_attrs["autoscout:fidelity_reason"] == "warm_up"


@pytest.mark.parametrize("tolerance", [-0.1, 1.0, "3%", float("nan")])
def test_oracle_rejects_a_bad_tolerance(tolerance):
    with pytest.raises(ValueError, match="tolerance"):
        OraclePruner(tolerance=tolerance)


def test_with_oracle_value_records_the_noiseless_value(serving):
    _, trial, config = _trial_with(serving)
    simulate = with_oracle_value(serving, lambda t, c: 123.0)
    assert simulate(trial, config) == 123.0
    assert trial.user_attrs[ORACLE_KEY] == serving.measure(config, None)
