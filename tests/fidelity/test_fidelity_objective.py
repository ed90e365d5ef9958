import math

import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import FidelityPruner, Infeasible, studies
from autoscout_optuna.fidelity import from_definition, multi_fidelity_objective

REASON = "autoscout:fidelity_reason"


def _suggest(trial):
    return {"x": trial.suggest_float("x", 0.0, 1.0)}


def _bad_simulator(config):
    if config["x"] < 0.3:
        raise ZeroDivisionError("simulator bug")
    if config["x"] < 0.6:
        return math.nan
    if config["x"] < 0.7:
        return None  # not even a number
    return config["x"]


def test_simulator_that_raises_or_returns_nan_is_no_estimate():
    measured = []

    def measure(config):
        measured.append(config["x"])
        return config["x"]

    study = optuna.create_study(
        direction="maximize",
        pruner=FidelityPruner(n_warmup_real=1, min_pairs=2),
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    study.optimize(multi_fidelity_objective(_suggest, _bad_simulator, measure), n_trials=40)
    no_estimate = [t for t in study.trials if t.params["x"] < 0.7]
    assert len(no_estimate) > 10
    for trial in no_estimate:
        assert trial.state == TrialState.COMPLETE
        assert trial.intermediate_values == {}  # nothing reported
        assert trial.user_attrs["autoscout:fidelity"] == "real"
        assert trial.user_attrs[REASON].startswith("no_estimate")
    reasons = {t.user_attrs[REASON] for t in no_estimate}
    assert any("ZeroDivisionError" in r for r in reasons)
    assert any("nan" in r for r in reasons)
    assert len(measured) == sum(t.state == TrialState.COMPLETE for t in study.trials)


def test_predicted_infeasible_fails_without_a_real_run():
    measured = []

    def estimate(config):
        if config["x"] > 0.5:
            raise Infeasible("oom", "predicted out of memory")
        return config["x"]

    objective = multi_fidelity_objective(_suggest, estimate, lambda c: measured.append(c) or 1.0)
    study = optuna.create_study(pruner=FidelityPruner())
    study.optimize(objective, n_trials=20, catch=(Infeasible,))
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert failed and all(t.params["x"] > 0.5 for t in failed)
    assert all(t.user_attrs["failure_reason"] == "oom" for t in failed)
    assert all(t.user_attrs[REASON] == "predicted_infeasible: oom" for t in failed)
    assert len(measured) == sum(t.state == TrialState.COMPLETE for t in study.trials)


def _reference_studies():
    return [name for name in studies.names() if studies.load(name).simulate is not None]


@pytest.mark.parametrize("name", _reference_studies())
def test_from_definition_works_for_every_study_with_a_simulator(name):
    definition = studies.load(name)
    objective = from_definition(definition)  # builds for real studies too
    if definition.is_real:
        pytest.skip(f"{name} measures a real job; only the objective construction is checked")
    study = optuna.create_study(
        direction=definition.direction,
        sampler=optuna.samplers.RandomSampler(seed=1),
        # Trust as early as the pruner allows: both paths (pruned and real) must show up.
        pruner=FidelityPruner(
            n_warmup_real=3, min_pairs=3, validation_period=None, trust_window=None
        ),
    )
    study.optimize(objective, n_trials=40, catch=(Infeasible,))
    states = [t.state for t in study.trials]
    assert TrialState.COMPLETE in states and TrialState.PRUNED in states
    for trial in study.trials:
        # Only real runs carry the noiseless value the benchmark scores: a pruned trial is
        # never "found".
        assert ("true_value" in trial.user_attrs) == (trial.state == TrialState.COMPLETE)
        if trial.state != TrialState.FAIL:
            assert math.isfinite(trial.user_attrs["autoscout:simulated"])
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert all(t.user_attrs["autoscout:fidelity"] == "simulator" for t in pruned)
    # Once real runs exist, the reported estimate is the ensemble's, not the raw simulator's.
    late = [t for t in study.trials[-10:] if 0 in t.intermediate_values]
    assert any(t.intermediate_values[0] != t.user_attrs["autoscout:simulated"] for t in late)


def test_study_without_simulator_is_refused():
    definition = studies.load(_reference_studies()[0])
    import dataclasses

    with pytest.raises(ValueError, match="no simulator"):
        from_definition(dataclasses.replace(definition, simulate=None))


def test_samplers_see_pruned_trials_as_estimates(monkeypatch):
    """End to end: AutoScoutSampler reads PRUNED trials as low-fidelity evidence, not failures."""
    import importlib
    import pkgutil

    from autoscout_optuna import AutoScoutSampler, _history
    from autoscout_optuna.samplers import _autoscout

    seen = {}

    def spying_observation_of(trial, direction):
        observation = _history.observation_of(trial, direction)
        seen[observation.number] = observation.kind
        return observation

    def spying_read_history(study, *args, **kwargs):
        history = _history.read_history(study, *args, **kwargs)
        seen.update({o.number: o.kind for o in history})
        return history

    # Wherever the sampler's modules read history through _history, listen in.
    patched = 0
    for info in pkgutil.iter_modules(_autoscout.__path__):
        module = importlib.import_module(f"{_autoscout.__name__}.{info.name}")
        for name, spy in (("observation_of", spying_observation_of),
                          ("read_history", spying_read_history)):
            if getattr(module, name, None) is getattr(_history, name):
                monkeypatch.setattr(module, name, spy)
                patched += 1
    if not patched:
        pytest.skip("AutoScoutSampler does not read history through _history")
    definition = studies.load("llm_serving")
    study = optuna.create_study(
        direction=definition.direction,
        sampler=AutoScoutSampler(seed=0),
        pruner=FidelityPruner(n_warmup_real=3, min_pairs=3),
    )
    study.optimize(from_definition(definition), n_trials=40, catch=(Infeasible,))
    pruned = [t.number for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned
    assert any(n in seen for n in pruned)
    assert {seen[n] for n in pruned if n in seen} == {"estimate"}
    failed = [t.number for t in study.trials if t.state == TrialState.FAIL]
    assert all(seen[n] == "failed" for n in failed if n in seen)
    complete = [t.number for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(seen[n] == "real" for n in complete if n in seen)


def test_ensemble_calibrates_a_constant_bias_away():
    """Through the study ensemble too: a simulator k times off estimates and decides alike."""
    definition = studies.load("llm_serving")

    def run(factor):
        def simulate(trial, config):
            wobble = 1.0 + 0.2 * math.sin(1.7 * trial.number)  # fixed per trial, not per factor
            return factor * wobble * definition.measure(config, None)

        study = optuna.create_study(
            direction=definition.direction, sampler=optuna.samplers.RandomSampler(seed=2),
            pruner=FidelityPruner(),
        )
        objective = from_definition(definition, noise_seed=0, simulate=simulate)
        study.optimize(objective, n_trials=60, catch=(Infeasible,))
        return study.get_trials()

    plain, biased = run(1.0), run(2.5)
    assert [t.state for t in plain] == [t.state for t in biased]
    assert sum(t.state == TrialState.PRUNED for t in biased) > 5
    # Before the first real result there is nothing to calibrate against; after it, the
    # ensemble's offset absorbs the factor.
    first_real = min(t.number for t in plain if t.state == TrialState.COMPLETE)
    for a, b in zip(plain[first_real + 1 :], biased[first_real + 1 :], strict=True):
        if 0 in a.intermediate_values:
            assert b.intermediate_values[0] == pytest.approx(a.intermediate_values[0], rel=1e-9)


def test_the_selection_aware_options_run_end_to_end():
    from autoscout_optuna.fidelity import StudyEnsembleEstimator
    from autoscout_optuna.fidelity._decision import SELECTED_REASONS

    definition = studies.load("llm_serving")
    study = optuna.create_study(
        direction=definition.direction,
        sampler=optuna.samplers.RandomSampler(seed=3),
        pruner=FidelityPruner(n_warmup_real=3, min_pairs=3, trust_window=None,
                              selection_aware=True, new_structure_control=True),
    )
    objective = from_definition(definition, ensemble_options={"selection_aware": True})
    study.optimize(objective, n_trials=40, catch=(Infeasible,))
    reasons = {t.user_attrs.get(REASON) for t in study.trials}
    assert reasons & SELECTED_REASONS and "warm_up" in reasons  # both kinds of real runs
    assert TrialState.PRUNED in {t.state for t in study.trials}
    # The ensemble's level comes from the real runs the estimate did not choose.
    aware = StudyEnsembleEstimator(selection_aware=True).fit(study)
    plain = StudyEnsembleEstimator().fit(study)
    assert aware._offset != plain._offset


@pytest.mark.parametrize("bad", ["no", None, 1])
def test_study_ensemble_estimator_rejects_a_non_bool_selection_aware(bad):
    from autoscout_optuna.fidelity import StudyEnsembleEstimator

    with pytest.raises(TypeError, match="selection_aware"):
        StudyEnsembleEstimator(selection_aware=bad)


def test_study_ensemble_estimator_refits_when_a_real_run_finishes():
    # It reuses its last fit while the real runs are the same: a new one must still count.
    from autoscout_optuna.fidelity import StudyEnsembleEstimator

    definition = studies.load("llm_serving")
    study = optuna.create_study(
        direction=definition.direction, sampler=optuna.samplers.RandomSampler(seed=1),
        pruner=FidelityPruner(n_warmup_real=3, min_pairs=3),
    )
    study.optimize(from_definition(definition), n_trials=30, catch=(Infeasible,))
    real = [t for t in study.trials
            if t.state == TrialState.COMPLETE and "autoscout:simulated" in t.user_attrs]
    assert len(real) >= 5
    estimator = StudyEnsembleEstimator()
    params, simulated = real[-1].params, real[-1].user_attrs["autoscout:simulated"]
    pending = study.ask()
    before = estimator.estimate(pending, params, simulated)
    assert estimator.estimate(pending, params, simulated) == before
    study.tell(pending, state=TrialState.FAIL)
    # the same config measured again, three times faster than the simulator said
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=real[-1].distributions, value=3 * simulated,
        user_attrs=dict(real[-1].user_attrs),
    ))
    pending = study.ask()  # a trial reads the history as it was when it started
    after = estimator.estimate(pending, params, simulated)
    assert after == StudyEnsembleEstimator().estimate(pending, params, simulated)
    assert after > before


def test_study_ensemble_estimator_falls_back_to_the_raw_value_on_a_value_it_cannot_encode():
    # Real runs so far had only numbers for "mb"; a None choice must not cost the trial its
    # estimate (from_definition would record "no_estimate" and run it for real).
    from autoscout_optuna.fidelity import StudyEnsembleEstimator

    dist = {"mb": optuna.distributions.CategoricalDistribution([None, 1, 2, 4, 8])}
    study = optuna.create_study(direction="maximize")
    for i, mb in enumerate([1, 2, 4, 8, 1, 2, 4, 8]):
        study.add_trial(optuna.trial.create_trial(
            params={"mb": mb}, distributions=dist, value=10.0 * mb + i,
            user_attrs={"autoscout:simulated": 9.0 * mb}))
    study.enqueue_trial({"mb": None})
    trial = study.ask()
    trial.suggest_categorical("mb", [None, 1, 2, 4, 8])
    assert StudyEnsembleEstimator().estimate(trial, trial.params, 50.0) == 50.0


@pytest.mark.parametrize(("result", "reason", "detail"), [
    (None, "no_metric", "not a number"), ("fast", "no_metric", "not a number"),
    ([1.0], "no_metric", "not a number"),
    # Optuna alone fails a NaN with no reason to read and keeps an infinity as COMPLETE (the
    # samplers would then chase a config whose "measurement" was a broken run).
    (math.nan, "nan", "measured nan"), (math.inf, "nan", "measured inf"),
    (-math.inf, "nan", "measured -inf"),
])
def test_a_measurement_that_is_not_a_finite_number_fails_the_trial_not_the_study(
    result, reason, detail
):
    objective = multi_fidelity_objective(_suggest, lambda c: c["x"], lambda c: result)
    study = optuna.create_study(pruner=FidelityPruner())
    study.optimize(objective, n_trials=3, catch=(Infeasible,))
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3
    assert {t.user_attrs["failure_reason"] for t in study.trials} == {reason}
    assert detail in study.trials[0].user_attrs["failure_detail"]
