import math

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import FidelityPruner
from autoscout_optuna.fidelity import multi_fidelity_objective

REASON = "autoscout:fidelity_reason"


def _loss(config):
    # Positive everywhere (like a step time): relative errors are meaningful.
    return 1.0 + (config["x"] - 1.0) ** 2 + (config["y"] + 0.5) ** 2


def _suggest(trial):
    return {"x": trial.suggest_float("x", -3, 3), "y": trial.suggest_float("y", -3, 3)}


def _phased_objective(sign, bad_from, bad_until, calls=None, lucky=(0, 0)):
    """The simulator is right before ``bad_from``, reversed until ``bad_until`` except in
    ``lucky`` (a half-open range of trial numbers), then right."""

    def make_estimate(trial):
        def estimate(config):
            value = 1.2 * _loss(config)  # 20% pessimistic, in the right order
            bad = bad_from <= trial.number < bad_until
            if bad and not lucky[0] <= trial.number < lucky[1]:
                value = 1.2 * (35.0 - _loss(config))  # reversed, on the same scale
            return sign * value

        return estimate

    def objective(trial):
        config = _suggest(trial)
        inner = multi_fidelity_objective(
            lambda _: config, make_estimate(trial), lambda c: sign * _loss(c)
        )
        return inner(trial)

    return objective


def _run(direction, n_trials, pruner=None, bad=(10**9, 10**9), seed=0, lucky=(0, 0)):
    sign = 1.0 if direction == "minimize" else -1.0
    study = optuna.create_study(
        direction=direction,
        sampler=optuna.samplers.RandomSampler(seed=seed),
        pruner=pruner or FidelityPruner(),
    )
    study.optimize(_phased_objective(sign, *bad, lucky=lucky), n_trials=n_trials)
    return study


def test_switches_to_real_when_simulator_is_bad_and_back_when_it_recovers():
    study = _run("minimize", 300, bad=(60, 160))
    trials = study.get_trials()
    reasons = [t.user_attrs.get(REASON) for t in trials]
    assert any(t.state == TrialState.PRUNED for t in trials[:60])
    assert "simulator_error_high" in reasons[60:160]
    # Once the error is detected, every trial of the bad stretch runs for real.
    first_alarm = 60 + reasons[60:160].index("simulator_error_high")
    assert first_alarm < 130
    assert all(t.state == TrialState.COMPLETE for t in trials[first_alarm:160])
    # After the simulator recovers, its estimates are trusted again.
    recovered = [t for t in trials[160:] if t.user_attrs.get(REASON) == "not_promising"]
    assert len(recovered) > 50
    assert all(t.state == TrialState.PRUNED for t in recovered)
    for trial in trials[first_alarm:160]:
        detail = trial.user_attrs["autoscout:sim_error_detail"]
        assert detail["relative_error"] > 0.3 or detail["discordance"] > 0.35
        assert trial.user_attrs["autoscout:sim_error"] == detail["relative_error"]


def test_a_brief_good_stretch_does_not_win_back_trust():
    # Reversed from trial 40 to 200, except 15 right estimates from trial 120: a full recent
    # window (20 pairs) comes out right by then, the longer trust window (40) does not.
    lucky = (120, 135)
    trials = _run("minimize", 300, bad=(40, 200), lucky=lucky).get_trials()
    reasons = [t.user_attrs.get(REASON) for t in trials]
    first_alarm = 40 + reasons[40:].index("simulator_error_high")
    assert first_alarm < 110
    # Every trial runs for real from the alarm to the end of the bad stretch, lucky or not.
    assert all(t.state == TrialState.COMPLETE for t in trials[first_alarm:200])
    # Trust returns once the simulator is right for good.
    assert sum(t.state == TrialState.PRUNED for t in trials[200:]) > 30
    detail = trials[lucky[1]].user_attrs["autoscout:sim_error_detail"]
    assert detail["trust_n_pairs"] == 40 and detail["trust_discordance"] > 0.35
    # The trust fields the pruner's docstring promises, and no others.
    assert {k for k in detail if k.startswith("trust_")} == {
        "trust_relative_error", "trust_relative_error_bound", "trust_discordance", "trust_n_pairs"
    }
    # Without the longer window, the lucky stretch wins trust back, and the simulator's few
    # validations afterwards leave its reversal unnoticed (the recent window is full of the
    # lucky pairs): it prunes through the rest of the bad stretch.
    alone = _run("minimize", 300, FidelityPruner(trust_window=None), bad=(40, 200), lucky=lucky)
    assert sum(t.state == TrialState.PRUNED for t in alone.get_trials()[lucky[0]:200]) > 20


def test_good_simulator_saves_real_runs_and_keeps_the_best():
    study = _run("minimize", 120)
    states = [t.state for t in study.get_trials()]
    assert states.count(TrialState.PRUNED) > states.count(TrialState.COMPLETE)
    # The best config by the real loss among all trials was run for real (order is right).
    best_any = min(study.get_trials(), key=lambda t: _loss(t.params))
    assert best_any.state == TrialState.COMPLETE


def test_the_default_config_autoscout_run_queues_always_runs_for_real():
    # The simulator is trusted by now, and a poor config is pruned on its estimate; the same
    # config queued as the study's default (the baseline of the gain line) runs for real.
    from autoscout_optuna._keys import DEFAULT_CONFIG

    study = _run("minimize", 60, pruner=FidelityPruner(validation_period=None))
    poor = {"x": 3.0, "y": 3.0}
    study.enqueue_trial(poor)
    study.enqueue_trial(poor, user_attrs={DEFAULT_CONFIG: True})
    study.optimize(_phased_objective(1.0, 10**9, 10**9), n_trials=2)
    unmarked, default = study.get_trials()[-2:]
    assert unmarked.state == TrialState.PRUNED and unmarked.user_attrs[REASON] == "not_promising"
    assert default.state == TrialState.COMPLETE
    assert default.user_attrs[REASON] == "default_config"
    assert default.value == pytest.approx(_loss(poor))


def test_minimize_and_maximize_decide_alike():
    low = _run("minimize", 80, bad=(30, 60), seed=3).get_trials()
    high = _run("maximize", 80, bad=(30, 60), seed=3).get_trials()
    assert [t.state for t in low] == [t.state for t in high]
    assert [t.user_attrs.get(REASON) for t in low] == [t.user_attrs.get(REASON) for t in high]


def test_state_rebuilds_from_storage_on_resume(tmp_path):
    rng = np.random.default_rng(7)
    points = [{"x": float(a), "y": float(b)} for a, b in rng.uniform(-3, 3, size=(40, 2))]
    objective = _phased_objective(1.0, 10, 30)

    def run(storage, chunks):
        study = None
        for i, n_trials in enumerate(chunks):
            # A fresh study object and pruner instance per chunk: nothing survives in memory.
            study = optuna.create_study(
                storage=storage, study_name="resume", load_if_exists=i > 0,
                pruner=FidelityPruner(n_warmup_real=3, min_pairs=3, window=6, validation_period=3),
                sampler=optuna.samplers.RandomSampler(seed=i),
            )
            if i == 0:
                for point in points:
                    study.enqueue_trial(point)
            study.optimize(objective, n_trials=n_trials)
        return study.get_trials()

    whole = run(None, [40])
    resumed = run(f"sqlite:///{tmp_path / 'resume.db'}", [12, 16, 12])
    reasons = {t.user_attrs.get(REASON) for t in whole}
    assert {"warm_up", "not_promising", "simulator_error_high"} <= reasons
    keys = ("autoscout:fidelity", REASON, "autoscout:sim_error")
    assert [t.params for t in whole] == [t.params for t in resumed]
    assert [t.state for t in whole] == [t.state for t in resumed]
    for a, b in zip(whole, resumed, strict=True):
        assert [a.user_attrs.get(k) for k in keys] == [b.user_attrs.get(k) for k in keys]


def test_should_prune_asked_twice_answers_the_same():
    answers = []

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        trial.report(x, step=0)
        first = trial.should_prune()
        answers.append((first, trial.should_prune()))
        return x

    study = optuna.create_study(pruner=FidelityPruner(n_warmup_real=2, min_pairs=2))
    study.optimize(objective, n_trials=30)
    assert all(first == second for first, second in answers)
    assert any(first for first, _ in answers)


def _four_real_runs():
    """A minimizing study with four real runs (estimates equal to their values), and its
    distribution: past warm-up, no validation, no trust window."""
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    study = optuna.create_study(pruner=FidelityPruner(
        n_warmup_real=2, min_pairs=2, validation_period=None, trust_window=None))
    for x in (0.5, 0.6, 0.7, 0.8):
        study.add_trial(optuna.trial.create_trial(
            params={"x": x}, distributions=dist, value=x, intermediate_values={0: x}))
    return study, dist


def test_should_prune_asked_again_after_history_moved_keeps_the_first_answer():
    # Ask-and-tell: trial a is told to run for real, then another trial finishes with a far
    # better real value. Asked again (say in its training loop), a must not be pruned halfway
    # through its real run, nor its record turned into "simulator".
    study, dist = _four_real_runs()
    a = study.ask(dist)
    a.report(0.45, step=0)
    assert a.should_prune() is False
    b = study.ask(dist)
    b.report(0.1, step=0)
    assert b.should_prune() is False
    study.tell(b, 0.1)
    assert a.should_prune() is False
    assert study.trials[a.number].user_attrs["autoscout:fidelity"] == "real"
    assert study.trials[a.number].user_attrs[REASON] == "could_beat_best"


def test_should_prune_asked_before_the_estimate_decides_again_once_it_is_reported():
    study, dist = _four_real_runs()
    trial = study.ask(dist)
    assert trial.should_prune() is False
    assert study.trials[trial.number].user_attrs[REASON] == "no_estimate"
    trial.report(0.9, step=0)
    assert trial.should_prune() is True
    assert study.trials[trial.number].user_attrs[REASON] == "not_promising"


def test_trial_without_estimate_always_runs_for_real():
    study = optuna.create_study(pruner=FidelityPruner(n_warmup_real=0, min_pairs=2))

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        return x if trial.should_prune() is False else math.nan

    study.optimize(objective, n_trials=5)
    assert all(t.state == TrialState.COMPLETE for t in study.get_trials())
    assert {t.user_attrs[REASON] for t in study.get_trials()} == {"no_estimate"}


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"error_threshold": 0.0}, "error_threshold"),
        ({"rank_error_threshold": 1.5}, "rank_error_threshold"),
        ({"rank_tolerance": -0.1}, "rank_tolerance"),
        ({"optimism": -1.0}, "optimism"),
        ({"top_fraction": 0.0}, "top_fraction"),
        ({"top_fraction": 1.5}, "top_fraction"),
        ({"validation_top": 0.0}, "validation_top"),
        ({"validation_period": 0}, "validation_period"),
        ({"validation_period": 2.5}, "validation_period"),
        ({"n_warmup_real": -1}, "n_warmup_real"),
        ({"window": 1}, "window"),
        ({"trust_window": 1}, "trust_window"),
        ({"min_pairs": 1}, "min_pairs"),
        ({"window": 5, "min_pairs": 6}, "min_pairs"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FidelityPruner(**kwargs)


def test_multi_objective_is_refused():
    study = optuna.create_study(directions=["minimize", "minimize"])
    trial = study.ask()
    study.tell(trial, [1.0, 1.0])
    with pytest.raises(ValueError, match="single-objective"):
        FidelityPruner().prune(study, study.trials[0])


def test_pruner_pickles_and_a_copy_decides_alike():
    import pickle

    study = _run("minimize", 40)
    copy = pickle.loads(pickle.dumps(FidelityPruner()))
    for trial in study.get_trials()[-5:]:
        assert copy.decide(study, trial) == FidelityPruner().decide(study, trial)


def test_one_pruner_on_two_studies_decides_as_a_fresh_one_on_each():
    # It keeps what it read of finished trials: two studies' trials share numbers, not facts.
    studies = [_run("minimize", 30, seed=1), _run("minimize", 30, seed=2, bad=(0, 30))]
    shared = FidelityPruner()
    for _ in range(2):
        for study in studies:
            for trial in study.get_trials()[-3:]:
                assert shared.decide(study, trial) == FidelityPruner().decide(study, trial)


def _ragged_estimate(config):
    # Right on average, 20% off here and there: a fixed, config-dependent error.
    return _loss(config) * (1.0 + 0.2 * math.sin(7.0 * config["x"] + 3.0 * config["y"]))


@pytest.mark.parametrize("factor", [0.4, 3.0])
def test_constant_bias_is_calibrated_away(factor):
    """A simulator off by a constant factor ranks like the unbiased one: same decisions."""

    def run(scale):
        study = optuna.create_study(
            sampler=optuna.samplers.RandomSampler(seed=5), pruner=FidelityPruner()
        )
        objective = multi_fidelity_objective(
            _suggest, lambda config: scale * _ragged_estimate(config), _loss
        )
        study.optimize(objective, n_trials=80)
        return study.get_trials()

    unbiased, biased = run(1.0), run(factor)
    assert [t.state for t in unbiased] == [t.state for t in biased]
    assert [t.user_attrs.get(REASON) for t in unbiased] == [
        t.user_attrs.get(REASON) for t in biased
    ]
    assert sum(t.state == TrialState.PRUNED for t in biased) > 20
    for a, b in zip(unbiased[10:], biased[10:], strict=True):
        error_a, error_b = a.user_attrs["autoscout:sim_error"], b.user_attrs["autoscout:sim_error"]
        assert error_b == pytest.approx(error_a)
        scale_a = a.user_attrs["autoscout:sim_error_detail"]["scale"]
        scale_b = b.user_attrs["autoscout:sim_error_detail"]["scale"]
        assert scale_b == pytest.approx(scale_a / factor)


def test_new_structure_is_judged_against_the_incumbent_structure_at_its_first_run():
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import create_trial

    layout = CategoricalDistribution(["a", "b", "c"])
    knob = FloatDistribution(0.0, 1.0)
    distributions = {"layout": layout, "x": knob}
    study = optuna.create_study(direction="maximize")
    # Structure "a" ran first at 0.5 and was tuned to 1.0; the simulator is exact (pairs at 1).
    for value, x in [(0.5, 0.1), (0.7, 0.3), (0.8, 0.5), (0.9, 0.7), (1.0, 0.9), (0.95, 0.8)]:
        study.add_trial(create_trial(
            params={"layout": "a", "x": x}, distributions=distributions, value=value,
            intermediate_values={0: value},
            user_attrs={REASON: "warm_up", "autoscout:fidelity": "real"},
        ))

    def judged(structure, estimate, **options):
        study.enqueue_trial({"layout": structure, "x": 0.5})
        trial = study.ask(distributions)
        trial.report(estimate, 0)
        frozen = study._storage.get_trial(trial._trial_id)
        decision = FidelityPruner(n_warmup_real=3, min_pairs=3, validation_period=None,
                                  **options).decide(study, frozen)
        study.tell(trial, state=TrialState.FAIL)
        return decision.reason

    # A new structure "b" estimated at 0.7, above "a"'s first 0.5 but below the best 1.0.
    assert judged("b", 0.7, new_structure_control=False) == "not_promising"
    assert judged("b", 0.7) == "could_beat_best"  # the default
    assert judged("b", 0.4) == "not_promising"
    # A structure with a real run keeps the best real value as its bar.
    assert judged("a", 0.7) == "not_promising"


@pytest.mark.parametrize("rule", [True, False])
def test_a_structure_already_run_for_real_runs_again_while_the_simulator_is_not_measurement_grade(
    rule,
):
    base = {"a": 10.0, "b": 5.0, "c": 1.0}
    errors = [1.12, 0.9, 1.05, 0.93, 1.08, 0.95]  # ~7 % after calibration, the order kept

    def objective(trial):
        layout = trial.suggest_categorical("layout", ["a", "b", "c"])
        x = trial.suggest_float("x", 0.0, 10.0)
        truth = base[layout] + x
        trial.report(truth * errors[trial.number % len(errors)], 0)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return truth

    study = optuna.create_study(direction="maximize", pruner=FidelityPruner(
        validation_period=None, real_for_measured_structures=rule))
    for layout, x in [("a", 9.0), ("b", 1.0), ("a", 5.0), ("b", 8.0), ("a", 2.0), ("b", 6.0),
                      ("a", 0.5), ("c", 0.5)]:
        study.enqueue_trial({"layout": layout, "x": x})
    study.optimize(objective, n_trials=8)
    known, new = study.trials[6], study.trials[7]
    assert new.state == TrialState.PRUNED  # a new structure is judged by its estimate
    reason = known.user_attrs["autoscout:fidelity_reason"]
    if rule:
        assert (known.state, reason) == (TrialState.COMPLETE, "measured_structure")
    else:
        assert (known.state, reason) == (TrialState.PRUNED, "not_promising")
    assert 0.05 < known.user_attrs["autoscout:sim_error"] < 0.3


def test_a_study_without_structural_params_is_pruned_as_before():
    study = optuna.create_study(direction="maximize", pruner=FidelityPruner(
        validation_period=None, real_for_measured_structures=True))

    def objective(trial):
        x = trial.suggest_float("x", 0.0, 10.0)
        trial.report(x * [1.12, 0.9, 1.05, 0.93, 1.08, 0.95, 1.0][trial.number], 0)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return x

    for x in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.5]:
        study.enqueue_trial({"x": x})
    study.optimize(objective, n_trials=7)
    last = study.trials[6]
    # the rule's conditions but for structure: trusted, short of measurement grade
    assert 0.05 < last.user_attrs["autoscout:sim_error"] < 0.3
    assert (last.state, last.user_attrs["autoscout:fidelity_reason"]) == (
        TrialState.PRUNED, "not_promising")
