import math

import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna._history import (
    MIN_RELIABILITY,
    decision_number,
    estimate_reliability,
    read_history,
    simulator_trusted,
)
from autoscout_optuna._keys import ORPHANED, SIM_ERROR_DETAIL


def _study(direction):
    study = optuna.create_study(direction=direction)

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        if trial.number == 1:
            trial.report(0.25, 0)
            raise optuna.TrialPruned()
        if trial.number == 2:
            raise ValueError("boom")
        if trial.number == 3:
            return math.nan
        if trial.number == 4:
            trial.report(math.nan, 0)
            raise optuna.TrialPruned()
        return x

    study.optimize(objective, n_trials=6, catch=(ValueError,))
    study.ask()  # a RUNNING trial: pending
    return study


@pytest.mark.parametrize("direction, sign", [("maximize", 1), ("minimize", -1)])
def test_every_trial_state_becomes_an_observation(direction, sign):
    study = _study(direction)
    obs = read_history(study)
    kinds = [o.kind for o in obs]
    assert kinds == ["real", "estimate", "failed", "failed", "failed", "real", "pending"]
    assert obs[0].score == pytest.approx(sign * study.trials[0].value)
    assert obs[1].score == pytest.approx(sign * 0.25)
    assert all(o.score is None for o in obs if o.kind in ("failed", "pending"))


def test_exclude_skips_the_trial_being_sampled():
    study = _study("maximize")
    running = [t for t in study.trials if t.state == TrialState.RUNNING][0]
    assert all(o.number != running.number for o in read_history(study, exclude=running))


def test_states_reads_only_those_trials_in_order():
    study = _study("maximize")
    complete = read_history(study, states=(TrialState.COMPLETE,))
    assert [(o.number, o.kind) for o in complete] == [(0, "real"), (5, "real")]
    assert [o.number for o in read_history(study, states=(TrialState.PRUNED,))] == [1, 4]
    assert [o.number for o in read_history(study, states=(TrialState.FAIL,))] == [2, 3]
    assert read_history(study, states=()) == []


def _study_with_rank_checks(discordances):
    """One trial per value; a float is recorded as the pruner records its rank check."""
    study = optuna.create_study()
    for d in discordances:
        trial = study.ask()
        if d is not None:
            trial.set_user_attr(SIM_ERROR_DETAIL, {"discordance": d, "kendall_tau": None})
        study.tell(trial, 1.0)
    return study


@pytest.mark.parametrize(
    ("discordances", "expected"),
    [
        ([], 1.0),  # nothing measured: estimates keep their configured weight
        ([None, None], 1.0),  # no pruner
        ([0.0], 1.0),
        ([0.2], 1.0),  # a usable ranking keeps the full weight
        ([0.2, 0.4], 0.4),  # the newest check counts, not the first: (0.5 - 0.4) / 0.25
        ([0.4, None], 0.4),  # a trial without a check (e.g. warm-up) does not reset it
        ([0.5], MIN_RELIABILITY),  # ranking no better than a coin: the floor
        ([0.8], MIN_RELIABILITY),
    ],
)
def test_estimate_reliability_follows_the_newest_rank_check(discordances, expected) -> None:
    study = _study_with_rank_checks(discordances)
    assert estimate_reliability(study) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("checks", "trusted"),
    [
        ([], False),  # nothing checked: an estimate has not earned a measurement's place
        ([None, None], False),  # no pruner
        ([(0.25, 0.05)], True),
        ([(0.1, 0.02), (0.3, 0.02)], False),  # the newest check counts: ranks too loose
        ([(0.1, 0.02), (0.1, 0.08)], False),  # ranks fine, values 8 % off: not a measurement
        ([(0.1, None)], False),  # no relative error measured
        ([(0.3, 0.02), (0.1, 0.05), None], True),  # a trial without a check keeps the last
    ],
)
def test_simulator_trusted_needs_a_close_newest_check(checks, trusted) -> None:
    study = optuna.create_study()
    for check in checks:
        trial = study.ask()
        if check is not None:
            detail = {"discordance": check[0], "relative_error": check[1]}
            trial.set_user_attr(SIM_ERROR_DETAIL, detail)
        study.tell(trial, 1.0)
    assert simulator_trusted(study) is trusted


def test_measurement_grade_needs_both_a_good_ranking_and_a_small_error():
    from autoscout_optuna._history import measurement_grade

    assert measurement_grade({"discordance": 0.1, "relative_error": 0.02})
    assert not measurement_grade({"discordance": 0.1, "relative_error": 0.12})
    assert not measurement_grade({"discordance": 0.4, "relative_error": 0.02})
    assert not measurement_grade({"discordance": None, "relative_error": 0.02})
    assert not measurement_grade(None)


def _plain_decision_number(study, number):
    orphans = sum(
        1 for t in study.get_trials(deepcopy=False)
        if t.number < number and t.state in (TrialState.FAIL, TrialState.RUNNING)
        and t.system_attrs.get(ORPHANED)
    )
    return number - orphans


def _check_decision_numbers(study):
    for trial in reversed(study.get_trials(deepcopy=False)):  # an older trial's call comes last
        assert decision_number(study, trial) == _plain_decision_number(study, trial.number)


def test_decision_number_matches_a_full_count_as_orphans_come_and_go():
    """The settled-prefix count gives what a scan of every trial gives: trials finishing out
    of order, orphans marked while running (before and after the prefix), calls for older
    trials after newer ones."""
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    running = [study.ask() for _ in range(6)]
    frozen = study.get_trials(deepcopy=False)
    storage.set_trial_system_attr(running[2]._trial_id, ORPHANED, True)
    _check_decision_numbers(study)
    study.tell(running[0], 1.0)
    study.tell(running[1], 2.0)
    _check_decision_numbers(study)  # prefix 0..1 settled
    study.tell(running[2], state=TrialState.FAIL)  # the orphan joins the prefix
    study.tell(running[3], 3.0)
    _check_decision_numbers(study)
    storage.set_trial_system_attr(running[5]._trial_id, ORPHANED, True)  # past the prefix
    study.tell(running[4], 4.0)
    _check_decision_numbers(study)
    later = [study.ask() for _ in range(3)]
    storage.set_trial_system_attr(later[0]._trial_id, ORPHANED, True)
    study.tell(running[5], state=TrialState.FAIL)
    _check_decision_numbers(study)
    assert decision_number(study, frozen[5]) == 4
    assert decision_number(study, study.get_trials(deepcopy=False)[-1]) == 5  # 2, 5, 6


def test_decision_number_forgets_a_deleted_study_whose_id_is_reused(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'reuse.db'}")
    study = optuna.create_study(storage=storage, study_name="a")
    orphan, finished, last = study.ask(), study.ask(), study.ask()
    storage.set_trial_system_attr(orphan._trial_id, ORPHANED, True)
    study.tell(orphan, state=TrialState.FAIL)
    study.tell(finished, 1.0)
    assert decision_number(study, study.get_trials(deepcopy=False)[last.number]) == 1
    first = study._storage, study._study_id
    optuna.delete_study(study_name="a", storage=storage)
    # the same storage object (as after a garbage-collected one's id is reused) and study id
    study = optuna.create_study(storage=first[0], study_name="a")
    assert (study._storage, study._study_id) == first  # SQLite hands the freed id out again
    for _ in range(4):
        study.tell(study.ask(), 0.0)
    _check_decision_numbers(study)
    assert decision_number(study, study.get_trials(deepcopy=False)[-1]) == 3


def test_decision_number_cache_stays_bounded_over_many_studies():
    # A process that opens study after study (each load wraps its storage in a new object)
    # keeps a bounded cache, and a study whose entry was dropped is counted afresh.
    from autoscout_optuna import _history

    study = optuna.create_study()
    study.tell(study.ask(), 1.0)
    last = study.ask()
    assert decision_number(study, study.get_trials(deepcopy=False)[last.number]) == 1
    for _ in range(2 * _history._MAX_STUDIES):
        other = optuna.create_study()
        other.tell(other.ask(), 0.0)
        ask = other.ask()
        assert decision_number(other, other.get_trials(deepcopy=False)[ask.number]) == 1
    assert len(_history._ORPHANS._prefixes) <= _history._MAX_STUDIES
    assert decision_number(study, study.get_trials(deepcopy=False)[last.number]) == 1


def test_a_violated_constraint_is_read_as_a_failure():
    study = optuna.create_study()

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        trial.set_constraint("memory", [-1.0, 0.0, 2.0][trial.number])
        return x

    study.optimize(objective, n_trials=3)
    assert [o.kind for o in read_history(study)] == ["real", "real", "failed"]


@pytest.mark.parametrize("name", ["AutoScoutSampler", "MCTSSampler", "CoordinateDescentSampler"])
def test_samplers_avoid_constraint_violations_as_they_avoid_failures(name):
    # DESIGN section 1: an infeasible config ends as FAIL or with ``trial.set_constraint``, and
    # the samplers learn to avoid it. Ignored, the constraint left the samplers refining the
    # infeasible optimum (AutoScout: 57 of 60 trials infeasible).
    import autoscout_optuna

    def objective(trial, constrained):
        x = trial.suggest_float("x", 0.0, 10.0)
        tp = trial.suggest_categorical("tp", [1, 2, 4, 8])
        if constrained:
            trial.set_constraint("memory", x * tp - 10)
        elif x * tp > 10:
            raise autoscout_optuna.Infeasible("out of memory")
        return (x - 8) ** 2 + (8 - tp)

    def proposals(constrained):
        study = optuna.create_study(sampler=getattr(autoscout_optuna, name)(seed=0))
        study.optimize(lambda t: objective(t, constrained), n_trials=30,
                       catch=(autoscout_optuna.Infeasible,))
        return [t.params for t in study.trials]

    assert proposals(constrained=True) == proposals(constrained=False)
