import math

import optuna
import pandas as pd
import pytest

from autoscout_optuna import Infeasible, studies
from autoscout_optuna.benchmark.suites import _fidelity_report, fidelity


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
    (suite,) = fidelity.suites(quick=True)
    names = [c.name for c in suite.contenders]
    assert names[0] == fidelity.SAMPLER
    assert all(name.startswith(fidelity.SAMPLER + "+sim") for name in names[1:])
    assert all(c.make_pruner is not None for c in suite.contenders[1:])


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
