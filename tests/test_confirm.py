"""Confirming the winner: re-runs of the top configs, ranked by the mean of those runs."""

from __future__ import annotations

import math
import textwrap

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from autoscout_optuna import AutoScoutSampler, FidelityPruner, Infeasible, confirm_best
from autoscout_optuna._confirm import confirmation_targets, read_confirmation
from autoscout_optuna._dashboard import note_markdown, summarize
from autoscout_optuna._keys import (
    ARM,
    CONFIRM_SLOT,
    CONFIRMS,
    DEFAULT_CONFIG,
    FAILURE_REASON,
    FIDELITY,
)
from autoscout_optuna._progress import confirmation_rows, summary_text
from autoscout_optuna.fidelity import multi_fidelity_objective

DISTRIBUTIONS = {"x": FloatDistribution(0.0, 10.0)}


def _trial(number, x, value=None, state=TrialState.COMPLETE, **user_attrs):
    trial = create_trial(
        state=state, value=value if state == TrialState.COMPLETE else None,
        params={"x": x}, distributions=DISTRIBUTIONS, user_attrs=user_attrs,
    )
    trial.number = number
    return trial


def test_configs_rank_by_their_confirmation_runs_not_by_the_lucky_run_that_picked_them():
    trials = [
        _trial(0, 1.0, 5.0, **{DEFAULT_CONFIG: True}),
        _trial(1, 2.0, 10.0),  # the search's luckiest run ...
        _trial(2, 3.0, 8.0),
        _trial(3, 2.0, 6.0, **{CONFIRMS: 1}),  # ... and what its config really gives
        _trial(4, 2.0, 6.2, **{CONFIRMS: 1}),
        _trial(5, 3.0, 7.0, **{CONFIRMS: 2}),
        _trial(6, 3.0, 7.4, **{CONFIRMS: 2}),
        _trial(7, 1.0, 5.2, **{CONFIRMS: 0}),
    ]
    found = read_confirmation(trials, maximize=True)
    assert [c.number for c in found.candidates] == [2, 1, 0]
    assert found.best.mean == pytest.approx(7.2) and found.best.searched == (8.0,)
    assert found.candidates[1].values == (6.0, 6.2)  # the lucky 10.0 is left out
    assert found.default.number == 0 and found.default.values == (5.0, 5.2)  # all count
    assert found.single_best == 1 and found.changed_winner
    assert found.gain_over_default == pytest.approx(7.2 / 5.1)
    # relative errors of the two means in quadrature: 0.2 / 7.2 and 0.1 / 5.1
    expected = 7.2 / 5.1 * math.hypot(0.2 / 7.2, 0.1 / 5.1)
    assert found.gain_stderr == pytest.approx(expected)

    lower = read_confirmation(trials, maximize=False)  # minimize: the smallest mean leads
    assert [c.number for c in lower.candidates] == [0, 1, 2]
    assert lower.gain_over_default == pytest.approx(1.0) and lower.best.is_default


def test_a_config_that_failed_a_run_ranks_behind_every_config_that_never_did():
    trials = [
        _trial(0, 1.0, 9.0), _trial(1, 2.0, 8.0),
        _trial(2, 1.0, 9.5, **{CONFIRMS: 0}),
        _trial(3, 1.0, state=TrialState.FAIL, **{CONFIRMS: 0, FAILURE_REASON: "oom"}),
        _trial(4, 2.0, 7.0, **{CONFIRMS: 1}),
        # no run was spent on these: they say nothing about config 1
        _trial(5, 2.0, state=TrialState.FAIL, **{CONFIRMS: 1, FAILURE_REASON: "worker_died"}),
        _trial(6, 2.0, state=TrialState.FAIL,
               **{FAILURE_REASON: "oom", FIDELITY: "simulator"}),
    ]
    found = read_confirmation(trials, maximize=True)
    assert [c.number for c in found.candidates] == [1, 0]
    assert found.candidates[1].failures == ("oom",) and found.best.failures == ()
    text = "\n".join(f"{label} {row}" for label, row in confirmation_rows(found, ""))
    assert "failed to confirm config of trial #0: oom in 1 of 2 runs" in text


def test_a_search_trial_stopped_unrun_for_an_emptied_queue_is_no_failure_of_its_config():
    # the search trial Optuna started where another worker took the last confirmation run is
    # failed before any run: on a space of few choices it can hold the best config's params,
    # and it ranked that config behind every other as "failed to confirm"
    from autoscout_optuna._confirm import QUEUE_EMPTIED

    trials = [
        _trial(0, 1.0, 5.0), _trial(1, 2.0, 4.0),
        _trial(2, 1.0, 5.1, **{CONFIRMS: 0}), _trial(3, 2.0, 4.1, **{CONFIRMS: 1}),
        _trial(4, 1.0, state=TrialState.FAIL, **{FAILURE_REASON: QUEUE_EMPTIED}),
    ]
    found = read_confirmation(trials, maximize=True)
    assert found.best.number == 0 and found.best.failures == ()


def test_targets_are_the_top_configs_and_the_default_less_what_they_have_asked_for():
    trials = [
        _trial(0, 1.0, 1.0, **{DEFAULT_CONFIG: True}),
        _trial(1, 2.0, 5.0), _trial(2, 3.0, 4.0), _trial(3, 4.0, 3.0), _trial(4, 2.0, 4.0),
        _trial(5, 2.0, 4.4, **{CONFIRMS: 1}),
        _trial(6, 3.0, state=TrialState.FAIL, **{CONFIRMS: 2, FAILURE_REASON: "crash"}),
        _trial(7, 3.0, state=TrialState.WAITING, **{CONFIRMS: 2}),
    ]
    targets = confirmation_targets(trials, maximize=True, top=2, repeats=2)
    # config 1's search mean is 4.5 (5.0 and 4.0), config 2's 4.0; config 3 is third
    assert [(c.number, missing) for c, missing in targets] == [(1, 1), (2, 0), (0, 2)]
    no_default = confirmation_targets(trials, maximize=True, top=3, repeats=2,
                                      include_default=False)
    assert [c.number for c, _ in no_default] == [1, 2, 3]
    # minimize: config 0 leads; configs 1 and 2, confirmed before, are topped up after it
    assert [c.number for c, _ in confirmation_targets(
        trials, maximize=False, top=1, repeats=1, include_default=False)] == [0, 1, 2]
    assert read_confirmation(trials[:5], maximize=True) is None  # nothing confirmed yet


def test_the_top_configs_do_not_move_as_the_defaults_confirmation_runs_come_in():
    # two workers confirming at once: one read the default's first confirmation run (low),
    # the default fell out of its top 3 and a fourth config was confirmed 3 times; the top
    # configs are picked on the runs the search made, whoever reads them when
    searched = [
        _trial(0, 1.0, 5.0, **{DEFAULT_CONFIG: True}), _trial(1, 2.0, 6.0), _trial(2, 3.0, 4.5),
    ]
    later = [*searched, _trial(3, 1.0, 3.0, **{CONFIRMS: 0, CONFIRM_SLOT: 1})]
    before = confirmation_targets(searched, maximize=True, top=2, repeats=2)
    after = confirmation_targets(later, maximize=True, top=2, repeats=2)
    assert [c.number for c, _ in before] == [c.number for c, _ in after] == [1, 0]
    assert [missing for _, missing in after] == [2, 1]


def _objective(trial):
    layout = trial.suggest_categorical("layout", ["a", "b"])
    x = trial.suggest_float("x", 0.0, 1.0)
    return (2.0 if layout == "b" else 1.0) + x + 0.05 * math.sin(1000 * x * (trial.number + 1))


def test_confirm_best_runs_the_missing_runs_once_and_the_search_goes_on_after_it():
    study = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=0))
    study.enqueue_trial({"layout": "a", "x": 0.5}, user_attrs={DEFAULT_CONFIG: True})
    study.optimize(_objective, n_trials=20)
    found = confirm_best(study, _objective, top=2, repeats=2)
    confirming = [t for t in study.trials if CONFIRMS in t.user_attrs]
    assert len(study.trials) == 26 and len(confirming) == 6
    assert {t.user_attrs[ARM] for t in confirming} == {"confirm"}
    assert all(t.state == TrialState.COMPLETE for t in confirming)
    assert [c.runs for c in found.candidates if not c.is_default] == [2, 2]
    assert found.default is not None and found.default.runs == 3
    # every run a config has counts: asking again adds nothing
    again = confirm_best(study, _objective, top=2, repeats=2)
    assert len(study.trials) == 26 and again == found
    # and the search goes on as one study: confirmation trials take no arm's credit
    study.optimize(_objective, n_trials=10)
    later = [t.user_attrs[ARM] for t in study.trials[26:]]
    assert len(later) == 10 and "confirm" not in later
    stats = [t.user_attrs.get("autoscout:bandit") or {} for t in study.trials[26:]]
    assert all("confirm" not in s for s in stats)


def test_confirmation_runs_are_real_even_where_the_simulator_would_prune_or_refuse_them():
    refuse = {"on": False}

    def estimate(config):
        if refuse["on"]:
            raise Infeasible("oom", "the simulator says it does not fit")
        return 0.1 * config["x"]  # ranks right, far too low: prunes once trusted

    objective = multi_fidelity_objective(
        suggest=lambda trial: {"x": trial.suggest_float("x", 0.0, 1.0)},
        estimate=estimate, measure=lambda config: config["x"],
    )
    study = optuna.create_study(direction="maximize", pruner=FidelityPruner(),
                                sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=30, catch=(Infeasible,))
    refuse["on"] = True
    found = confirm_best(study, objective, top=3, repeats=2)
    confirming = [t for t in study.trials if CONFIRMS in t.user_attrs]
    assert len(confirming) == 6 and all(t.state == TrialState.COMPLETE for t in confirming)
    assert {t.user_attrs["autoscout:fidelity_reason"] for t in confirming} == {"confirmation"}
    assert [c.runs for c in found.candidates] == [2, 2, 2]


def test_the_pruner_lets_a_confirmation_run_through_whatever_its_estimate():
    space = {"x": FloatDistribution(0.0, 1.0)}
    pruner = FidelityPruner(n_warmup_real=2, min_pairs=2, trust_window=None,
                            validation_period=None)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for x in (0.9, 0.8, 0.7):  # the estimate tracks reality: trusted from here on
        trial = study.ask(space)
        trial.report(x, 0)
        trial.should_prune()
        study.tell(trial, x)
    hopeless = study.ask(space)
    hopeless.report(0.01, 0)
    assert hopeless.should_prune() is True  # any other trial with this estimate is pruned
    study.tell(hopeless, state=TrialState.PRUNED)
    study.enqueue_trial({"x": 0.1}, user_attrs={CONFIRMS: 0})
    trial = study.ask(space)
    trial.report(0.01, 0)
    assert trial.should_prune() is False
    assert study.trials[-1].user_attrs["autoscout:fidelity_reason"] == "confirmation"


def test_a_confirmation_run_that_fails_is_recorded_and_the_others_run():
    calls = {"n": 0}

    def objective(trial):
        x = trial.suggest_float("x", 0.0, 1.0)
        if CONFIRMS in trial.user_attrs:
            calls["n"] += 1
            if calls["n"] == 1:
                trial.set_user_attr(FAILURE_REASON, "nan")
                raise Infeasible("nan", "loss went NaN")
        return x

    study = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=2))
    study.optimize(objective, n_trials=12)
    found = confirm_best(study, objective, top=2, repeats=2)
    failed = [t for t in study.trials if CONFIRMS in t.user_attrs and t.state == TrialState.FAIL]
    assert len(failed) == 1 and calls["n"] == 4
    assert found.candidates[-1].failures == ("nan",) and not found.best.failures


def test_the_summary_and_the_note_ship_the_confirmed_config():
    trials = [
        _trial(0, 1.0, 5.0, **{DEFAULT_CONFIG: True}),
        _trial(1, 2.0, 10.0), _trial(2, 3.0, 8.0),
        _trial(3, 2.0, 6.0, **{CONFIRMS: 1}), _trial(4, 3.0, 7.0, **{CONFIRMS: 2}),
        _trial(5, 3.0, 7.4, **{CONFIRMS: 2}), _trial(6, 1.0, 5.2, **{CONFIRMS: 0}),
    ]
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    text = summary_text(study)
    assert "best               10 (trial #1)" in text
    assert "confirmed best     7.2 +- 0.2, mean of 2 runs, config of trial #2" in text
    assert "the best single run's config, trial #1: 6, mean of 1 runs" in text
    assert "confirmed default  5.1 +- 0.1, mean of 2 runs" in text
    assert "confirmed gain     1.41x +- 0.05" in text
    assert text.split("Best configuration (confirmed):")[1].split() == ["x", "3"]
    note = note_markdown(summarize(study))
    assert "Confirmed: **7.2**, mean of 2 runs of the config of trial #2" in note
    assert "| #2 | 2 | 7.2 | 0.2 | 8 | - |" in note
    assert "**1.41x** +- 0.05 (standard error)" in note


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"top": 0}, "top must be an int >= 1"),
    ({"repeats": 0}, "repeats must be an int >= 1"),
    ({"top": True}, "top must be an int >= 1"),
])
def test_bad_arguments_are_named_and_nothing_runs(kwargs, message):
    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    with pytest.raises(ValueError, match=message):
        confirm_best(study, lambda t: 0.0, **kwargs)
    assert len(study.trials) == 3


def test_a_study_without_real_runs_has_nothing_to_confirm():
    study = optuna.create_study()
    found = confirm_best(study, lambda t: 1.0)
    assert found.best is None and found.candidates == () and len(study.trials) == 0
    assert found.gain_over_default is None and not found.changed_winner


def test_structural_params_are_confirmed_as_stored():
    space = {"layout": CategoricalDistribution(["a", "b"]), "x": FloatDistribution(0, 1)}
    study = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=4))
    study.optimize(lambda t: _objective(t), n_trials=15)
    best = study.best_trial
    confirm_best(study, _objective, top=1, repeats=1, include_default=False)
    last = study.trials[-1]
    assert last.params == best.params and set(last.distributions) == set(space)


def test_the_docstring_example_runs():
    doc = confirm_best.__doc__.split(".. testcode::")[1].split("    Args:")[0]
    code = textwrap.dedent(doc.strip("\n"))
    namespace: dict = {}
    exec(compile(code, "confirm_best example", "exec"), namespace)  # noqa: S102 - our own text
    assert len(namespace["study"].trials) == 24  # 20 trials and 2 configs confirmed twice


def test_a_timeout_leaves_the_runs_not_made_queued_for_a_later_call():
    study = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=5))
    study.optimize(_objective, n_trials=10)
    confirm_best(study, _objective, top=2, repeats=2, include_default=False, timeout=1e-9)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 4 and all(CONFIRMS in t.user_attrs for t in waiting)
    found = confirm_best(study, _objective, top=2, repeats=2, include_default=False)
    assert len(study.trials) == 14 and [c.runs for c in found.candidates] == [2, 2]



def test_trials_queued_before_run_first_and_every_confirmation_run_is_still_made():
    study = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=5))
    study.optimize(_objective, n_trials=10)
    study.enqueue_trial({"layout": "b", "x": 0.25})
    study.enqueue_trial({"layout": "a", "x": 0.75})
    found = confirm_best(study, _objective, top=2, repeats=2, include_default=False)
    # the two user-queued trials and four confirmation runs; no search trial of its own
    assert len(study.trials) == 16
    assert [t.params for t in study.trials[10:12]] == [
        {"layout": "b", "x": 0.25}, {"layout": "a", "x": 0.75}]
    assert all(CONFIRMS in t.user_attrs for t in study.trials[12:])
    assert [c.runs for c in found.candidates] == [2, 2]
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_a_run_a_dead_worker_left_is_asked_for_again():
    import socket

    from autoscout_optuna._keys import WORKER
    from autoscout_optuna._recovery import recover_orphaned_trials

    study = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=5))
    study.optimize(_objective, n_trials=10)
    confirm_best(study, _objective, top=1, repeats=2, include_default=False, timeout=1e-9)
    # a worker takes a confirmation run and dies with it (a pid no process has)
    taken = study.ask()
    assert CONFIRMS in taken.user_attrs
    dead = {"host": socket.gethostname(), "pid": 2**22 + 1, "start": 0}
    study._storage.set_trial_system_attr(taken._trial_id, WORKER, dead)
    assert recover_orphaned_trials(study, retry=True) == [taken.number]
    found = confirm_best(study, _objective, top=1, repeats=2, include_default=False)
    confirming = [t for t in study.trials if CONFIRMS in t.user_attrs]
    assert [t.state for t in confirming] == [
        TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert found.best.runs == 2 and found.best.failures == ()


def test_nothing_is_confirmed_before_a_confirmation_run_is_made():
    # --timeout spent or Ctrl-C right after the runs were queued: the default's search run
    # must not pass for a confirmed config, shipped over a far better best run
    trials = [
        _trial(0, 1.0, 1.0, **{DEFAULT_CONFIG: True}),
        _trial(1, 2.0, 5.0),
        _trial(2, 2.0, state=TrialState.WAITING, **{CONFIRMS: 1}),
        _trial(3, 1.0, state=TrialState.WAITING, **{CONFIRMS: 0}),
        _trial(4, 2.0, state=TrialState.FAIL, **{CONFIRMS: 1, FAILURE_REASON: "worker_died"}),
    ]
    assert read_confirmation(trials, maximize=True) is None
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    ship = summarize(study).to_record()["ship"]
    assert ship == {"source": "best_run", "trial": 1, "params": {"x": 2.0}}
    assert "confirmed" not in summary_text(study)


def test_a_config_confirmed_before_the_search_went_on_is_topped_up_with_the_new_top():
    # --confirm 1, then more search and --confirm 3 (or a second worker that searched on):
    # config x=2's one lucky confirmation run (9) outranked x=3's three runs (6 each), and the
    # config shipped as "confirmed" was judged on one run where three were asked for
    runs = {1.0: [1.0] * 5, 2.0: [5.0, 9.0, 4.0, 4.0], 3.0: [6.0] * 4}
    made = {x: 0 for x in runs}

    def objective(trial):
        x = trial.suggest_float("x", 0.0, 10.0)
        made[x] += 1
        return runs[x][made[x] - 1]

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"x": 1.0}, user_attrs={DEFAULT_CONFIG: True})
    study.enqueue_trial({"x": 2.0})
    study.optimize(objective, n_trials=2)
    confirm_best(study, objective, top=1, repeats=1)
    study.enqueue_trial({"x": 3.0})
    study.optimize(objective, n_trials=1)
    found = confirm_best(study, objective, top=1, repeats=3)
    assert {c.params["x"]: c.runs for c in found.candidates} == {3.0: 3, 2.0: 3, 1.0: 4}
    assert found.best.params == {"x": 3.0} and found.candidates[1].mean == pytest.approx(17 / 3)


def _two_workers(tmp_path, *, seed=0):
    """Two workers' Study objects on one SQLite file (each its own storage connection, as two
    processes have), after a 20-trial search with the default config queued first."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize",
                                sampler=AutoScoutSampler(seed=seed))
    study.enqueue_trial({"layout": "a", "x": 0.5}, user_attrs={DEFAULT_CONFIG: True})
    study.optimize(_objective, n_trials=20)
    return [optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url),
                              sampler=AutoScoutSampler(seed=seed)) for _ in range(2)]


def _one_worker(tmp_path):
    """What one worker confirms of the same search: the answer two workers must agree on."""
    (tmp_path / "one").mkdir()
    study, _ = _two_workers(tmp_path / "one")
    return confirm_best(study, _objective, top=2, repeats=2), study


def _confirmation_runs(study):
    return [t for t in study.get_trials() if CONFIRMS in t.user_attrs
            and t.user_attrs.get(FAILURE_REASON) != "duplicate_confirmation"]


@pytest.mark.parametrize("b_runs", [True, False], ids=["b-runs-all", "b-only-queues"])
def test_two_workers_confirming_at_once_queue_each_missing_run_once(tmp_path, monkeypatch, b_runs):
    import autoscout_optuna._confirm as confirm_module

    expected, single = _one_worker(tmp_path)
    a, b = _two_workers(tmp_path)
    decide = confirm_module.confirmation_targets
    answers = {}

    def a_decides_then_b_goes(trials, **kwargs):
        # worker A has read what is missing and not queued it yet when worker B confirms
        targets = decide(trials, **kwargs)
        monkeypatch.setattr(confirm_module, "confirmation_targets", decide)
        # B either runs every confirmation run itself, or has only queued them (its timeout
        # spent) when A queues the same runs
        answers["b"] = confirm_best(b, _objective, top=2, repeats=2,
                                    timeout=None if b_runs else 1e-9)
        return targets

    monkeypatch.setattr(confirm_module, "confirmation_targets", a_decides_then_b_goes)
    answers["a"] = confirm_best(a, _objective, top=2, repeats=2)
    if not b_runs:
        answers["b"] = confirm_best(b, _objective, top=2, repeats=2)
    # each missing run made once, the same as one worker makes: 2 x 2 runs and the default's 2
    runs = _confirmation_runs(a)
    assert len(runs) == 6 and all(t.state == TrialState.COMPLETE for t in runs)
    assert [t.params for t in runs] == [t.params for t in _confirmation_runs(single)]
    assert answers["a"] == answers["b"] == expected
    # the duplicates A queued are retired with a reason, never run, and neither a
    # confirmation run nor a lost one: asking again adds nothing
    retired = [t for t in a.get_trials() if t not in runs and CONFIRMS in t.user_attrs]
    assert len(retired) == 6 and all(t.state == TrialState.FAIL and not t.params
                                     for t in retired)
    assert confirm_best(a, _objective, top=2, repeats=2) == expected
    assert not a.get_trials(states=(TrialState.WAITING, TrialState.RUNNING))


def test_a_worker_that_finds_the_queue_emptied_by_another_starts_no_search_run(
        tmp_path, monkeypatch):
    import autoscout_optuna._confirm as confirm_module

    a, b = _two_workers(tmp_path)
    confirm_best(a, _objective, top=1, repeats=1, include_default=False, timeout=1e-9)
    queued = confirm_module._queued_confirmation_runs
    calls = {"n": 0}

    def b_takes_the_last_run(study):
        # A has seen a queued run; B pops and runs it before A's optimize pops the queue
        found = queued(study)
        calls["n"] += 1
        if calls["n"] == 1:
            taken = b.ask()
            assert CONFIRMS in taken.user_attrs
            b.tell(taken, _objective(taken))
        return found

    monkeypatch.setattr(confirm_module, "_queued_confirmation_runs", b_takes_the_last_run)
    spent = []
    found = confirm_best(a, lambda trial: spent.append(trial.number) or _objective(trial),
                         top=1, repeats=1, include_default=False)
    assert spent == []  # no real run of a search config
    started = a.get_trials()[-1]
    assert started.state == TrialState.FAIL and CONFIRMS not in started.user_attrs
    assert started.user_attrs[FAILURE_REASON] == "confirmation_queue_empty"
    assert started.system_attrs["autoscout:orphaned"] is True
    assert found.best.runs == 1 and len(a.get_trials()) == 22  # 20 searched, 1 run, 1 stopped


def test_only_a_waiting_duplicate_is_retired_never_a_run_started_or_a_retry():
    from autoscout_optuna._confirm import _retire_duplicates
    from autoscout_optuna._storage import claim_waiting_trial

    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2)
    best = study.best_trial
    slot = {CONFIRMS: best.number, CONFIRM_SLOT: 1}
    for _ in range(3):  # three workers queued the same run
        study.enqueue_trial(best.params, user_attrs=slot)
    # a fourth trial of the slot is Optuna's retry of a run whose worker went silent
    study.add_trial(create_trial(state=TrialState.WAITING, user_attrs=slot,
                                 system_attrs={"failed_trial": 2}))
    # another worker started the third one (popped in a race) before anyone retired it
    assert claim_waiting_trial(study, study.trials[4])
    assert _retire_duplicates(study) == [3]
    states = [t.state for t in study.trials[2:]]
    assert states == [TrialState.WAITING, TrialState.FAIL, TrialState.RUNNING,
                      TrialState.WAITING]
    assert study.trials[3].user_attrs[FAILURE_REASON] == "duplicate_confirmation"
    assert _retire_duplicates(study) == []  # the rule settles: nothing more to retire
    targets = confirmation_targets(study.trials, maximize=True, top=1, repeats=2,
                                   include_default=False)
    # slot 1 is asked for once, by the first trial, the one started and the retry alike
    assert [(c.number, missing) for c, missing in targets] == [(best.number, 1)]
