"""MCTSSampler: Optuna's sampler contract, resume from SQLite, failures, parallel workers."""

from __future__ import annotations

import pickle

import optuna
import pytest
from optuna.testing.pytest_samplers import BasicSamplerTestCase, SingleOnlySamplerTestCase
from optuna.trial import TrialState

from autoscout_optuna import AutoScoutSampler, CoordinateDescentSampler, Infeasible, MCTSSampler
from autoscout_optuna.samplers._mcts.sampler import PATH_KEY, PHASE_KEY, UCT_KEY


class TestMCTSBasic(BasicSamplerTestCase):
    @pytest.fixture
    def sampler(self):
        return lambda: MCTSSampler(seed=0)


class TestMCTSSingleOnly(SingleOnlySamplerTestCase):
    @pytest.fixture
    def sampler(self):
        return lambda: MCTSSampler(seed=0)


def _structural_objective(trial: optuna.Trial) -> float:
    """Deterministic, conditional: ``sm`` is asked only when ``tp > 1``; ``mode="bad"`` fails."""
    tp = trial.suggest_categorical("tp", [1, 2, 4])
    value = {1: 0.0, 2: 1.0, 4: 0.5}[tp]
    if tp > 1:
        value += 0.1 * trial.suggest_int("sm", 1, 4)
    mode = trial.suggest_categorical("mode", ["a", "b", "bad"])
    if mode == "bad":
        raise Infeasible("oom")
    value += {"a": 0.0, "b": 0.3}[mode]
    value += 0.05 * trial.suggest_int("mbs", 0, 6)
    return value


def _run(sampler, n, direction="maximize", sign=1.0, storage=None, name=None):
    study = optuna.create_study(
        direction=direction, sampler=sampler, storage=storage, study_name=name,
        load_if_exists=True,
    )
    study.optimize(lambda t: sign * _structural_objective(t), n_trials=n, catch=(Infeasible,))
    return study


def _configs(study, start=0):
    return [t.params for t in study.trials[start:]]


@pytest.mark.slow  # SQLite commits every write: ~80 trials take tens of seconds on a busy disk
def test_resume_from_sqlite_proposes_what_an_uninterrupted_run_would(tmp_path):
    whole = _run(MCTSSampler(seed=3), 38, storage=f"sqlite:///{tmp_path / 'a.db'}", name="a")
    url = f"sqlite:///{tmp_path / 'b.db'}"
    _run(MCTSSampler(seed=3), 30, storage=url, name="b")
    resumed = _run(MCTSSampler(seed=3), 8, storage=url, name="b")  # a new process would do this
    assert len(resumed.trials) == 38
    assert _configs(resumed, 30) == _configs(whole, 30)


def test_minimize_of_the_negated_objective_takes_the_same_decisions():
    up = _run(MCTSSampler(seed=1), 25, "maximize", 1.0)
    down = _run(MCTSSampler(seed=1), 25, "minimize", -1.0)
    assert _configs(up) == _configs(down)


def test_failed_paths_are_left_and_the_search_beats_random():
    study = _run(MCTSSampler(seed=0), 60)
    late = study.trials[30:]
    fails = sum(t.state == TrialState.FAIL for t in late)
    random_study = _run(optuna.samplers.RandomSampler(seed=0), 60)
    random_fails = sum(t.state == TrialState.FAIL for t in random_study.trials[30:])
    assert fails < random_fails
    assert study.best_value >= random_study.best_value
    best = study.best_params
    assert best["tp"] == 2 and best["mode"] == "b"


def test_decisions_are_recorded_and_a_conditional_knob_never_precedes_its_parent():
    study = _run(MCTSSampler(seed=0), 30)
    phases = [t.user_attrs[PHASE_KEY] for t in study.trials]
    assert phases[0] == "startup"
    assert {"uct", "exploit"} <= set(phases[10:]) <= {"uct", "exploit"}
    for trial in study.trials:
        path = trial.user_attrs[PATH_KEY]
        assert [name for name, _ in path] == [n for n in trial.user_attrs["mcts:order"]
                                              if n in trial.params]
        assert dict((k, v) for k, v in path) == {k: trial.params[k] for k, _ in path}
        assert set(trial.user_attrs[UCT_KEY]) == {name for name, _ in path}
        order = trial.user_attrs["mcts:order"]
        if "sm" in order:
            assert order.index("tp") < order.index("sm")
    assert study.trials_dataframe().filter(like="mcts").shape[1] >= 4


def test_cached_statistics_equal_a_recomputation_from_storage():
    sampler = MCTSSampler(seed=5)
    study = _run(sampler, 35)
    running = study.ask()
    frozen = study.trials[-1]
    assert frozen.number == running.number
    assert sampler.propose_structure(study, frozen) == MCTSSampler(seed=5).propose_structure(
        study, frozen
    )
    restored = pickle.loads(pickle.dumps(sampler))
    assert restored.propose_structure(study, frozen) == sampler.propose_structure(study, frozen)


def test_proposed_structure_is_what_the_trial_then_takes():
    sampler = MCTSSampler(seed=2)
    study = _run(sampler, 20)
    trial = study.ask()
    plan = sampler.propose_structure(study, study.trials[-1])
    try:
        _structural_objective(trial)
    except Infeasible:
        pass
    for name, value in trial.params.items():
        if name in plan.values:
            assert value == plan.values[name]
    assert list(plan.values)[0] == plan.order[0] or plan.order[0] not in trial.params


def test_a_running_trial_is_a_virtual_loss_so_the_next_worker_goes_elsewhere():
    sampler = MCTSSampler(seed=4)
    study = _run(sampler, 20)
    first, second = study.ask(), study.ask()
    for trial in (first, second):
        try:
            _structural_objective(trial)
        except Infeasible:
            pass
    assert first.params != second.params


def test_two_threads_complete_a_study():
    study = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=0))
    study.optimize(_structural_objective, n_trials=20, n_jobs=2, catch=(Infeasible,))
    assert len(study.trials) == 20
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in study.trials)


class _Spy(optuna.samplers.RandomSampler):
    def __init__(self):
        super().__init__(seed=0)
        self.asked = []

    def sample_independent(self, study, trial, name, distribution):
        self.asked.append(name)
        return super().sample_independent(study, trial, name, distribution)


def test_dense_params_go_to_the_fallback_and_structural_hints_are_honoured():
    spy = _Spy()
    sampler = MCTSSampler(seed=0, fallback=spy)
    study = optuna.create_study(sampler=sampler)

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        return lr + (trial.suggest_categorical("opt", ["adam", "sgd"]) == "adam")

    study.optimize(objective, n_trials=5)
    assert spy.asked == ["lr"] * 5
    assert study.trials[0].user_attrs[PHASE_KEY] in ("startup", "uct")
    hinted = MCTSSampler(structural={"layers"})
    dist = optuna.distributions.IntDistribution(1, 100)
    assert hinted.is_structural("layers", dist)
    assert not hinted.is_structural("other", dist)
    assert not MCTSSampler().is_structural("layers", dist)


def test_dense_only_objective_uses_the_default_fallback_and_records_it():
    study = optuna.create_study(sampler=MCTSSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("x", -3, 3) ** 2, n_trials=12)
    assert all(-3 <= t.params["x"] <= 3 for t in study.trials)
    assert study.trials[-1].user_attrs[PHASE_KEY] == "fallback"


def test_seeded_samplers_repeat():
    assert _configs(_run(MCTSSampler(seed=7), 15)) == _configs(_run(MCTSSampler(seed=7), 15))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"exploration": -1.0}, "exploration"),
        ({"failure_reward": 0.5}, "failure_reward"),
        ({"estimate_weight": 0.0}, "estimate_weight"),
        ({"n_orderings": 0}, "n_orderings"),
        ({"tournament_depth": 0}, "tournament_depth"),
        ({"rave_equivalence": -1}, "rave_equivalence"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MCTSSampler(**kwargs)
    with pytest.raises(TypeError, match="fallback"):
        MCTSSampler(fallback=object())


def test_without_feature_prioritization_levels_keep_the_ask_order():
    study = _run(MCTSSampler(seed=0, feature_prioritization=False), 25)
    for trial in study.trials[10:]:
        assert trial.user_attrs["mcts:order"] == ["tp", "sm", "mode", "mbs"]


@pytest.mark.parametrize("factory", [MCTSSampler, AutoScoutSampler, CoordinateDescentSampler])
def test_a_sampler_reused_on_a_new_study_of_the_same_name_starts_afresh(factory):
    # A notebook re-running ``create_study(study_name="demo", sampler=sampler)`` gets a new
    # in-memory storage, where the new study has the old one's name and id: the caches must
    # not hand it the old study's trials.
    def first(trial):
        layout = trial.suggest_categorical("layout", ["a", "b", "c"])
        return (layout == "a") * 10 + trial.suggest_int("k", 1, 8)

    def second(trial):
        layout = trial.suggest_categorical("layout", ["a", "b", "c"])
        return (layout != "a") * 10 - trial.suggest_int("k", 1, 8)

    def proposals(sampler):
        study = optuna.create_study(sampler=sampler, study_name="demo")
        study.optimize(second, n_trials=12)
        return [t.params for t in study.trials]

    reused = factory(seed=0)
    optuna.create_study(sampler=reused, study_name="demo").optimize(first, n_trials=12)
    assert proposals(reused) == proposals(factory(seed=0))


def test_a_structural_param_first_asked_after_a_failure_of_a_dense_only_history():
    # The history (a run and a failure) has no structural column yet when a conditional
    # categorical is first asked: the feasibility model then fits on rows of zero columns.
    def objective(trial):
        x = trial.suggest_float("x", 0.0, 1.0)
        if trial.number == 1:
            raise Infeasible("out of memory")
        if trial.number >= 2:
            x += {"a": 0.0, "b": 1.0}[trial.suggest_categorical("optimizer", ["a", "b"])]
        return x

    study = optuna.create_study(sampler=MCTSSampler(seed=0))
    study.optimize(objective, n_trials=6, catch=(Infeasible,))
    states = [t.state for t in study.trials]
    assert states[1] == TrialState.FAIL
    assert states[:1] + states[2:] == [TrialState.COMPLETE] * 5
    assert {t.params["optimizer"] for t in study.trials[2:]} == {"a", "b"}


@pytest.mark.parametrize("factory", [MCTSSampler, AutoScoutSampler, CoordinateDescentSampler])
def test_a_trial_asked_and_never_told_leaves_no_plan_for_a_new_study(factory):
    # Per-trial plans are kept until after_trial; one asked and abandoned in a study that is
    # then recreated under its name (a new in-memory storage: same name, study id, trial ids)
    # must not be served to the new study's trial of the same number.
    def objective(trial, bad):
        layout = trial.suggest_categorical("layout", ["a", "b", "c", "d"])
        return (layout == bad) * 10 + trial.suggest_int("k", 1, 8)

    def proposals(sampler):
        study = optuna.create_study(sampler=sampler, study_name="demo")
        study.optimize(lambda t: objective(t, "a"), n_trials=6)
        return [t.params for t in study.trials]

    reused = factory(seed=0)
    old = optuna.create_study(sampler=reused, study_name="demo")
    old.optimize(lambda t: objective(t, "b"), n_trials=5)
    abandoned = old.ask()
    abandoned.suggest_categorical("layout", ["a", "b", "c", "d"])
    assert proposals(reused) == proposals(factory(seed=0))
