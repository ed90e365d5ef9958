"""Bad input (issue 9): arguments, objective results, storage; clear errors, nothing stored lost.

- Every public constructor rejects a bad argument with an error that names the argument.
- An objective that returns None, a wrong type or NaN, or suggests conflicting distributions
  under one name ends its trial FAIL (Optuna's behaviour) or raises a clear error, with each of
  our samplers; the COMPLETE trials before it are intact and the study continues.
- ``autoscout run`` on a read-only or locked database, a bad URL, an unknown study or a study of
  the other direction prints one line naming the problem, exits 2 and writes nothing.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import sqlite3
import subprocess
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import (
    AutoScoutSampler,
    CoordinateDescentSampler,
    FidelityPruner,
    MCTSSampler,
    cli,
)
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.benchmark import Contender, Suite
from autoscout_optuna.fidelity import SimulatorEnsemble
from autoscout_optuna.runners import CommandRunner

NAN = math.nan


# ---- constructors ---------------------------------------------------------------------------


def _definition() -> StudyDefinition:
    return StudyDefinition(
        name="tiny", direction="maximize", metric="score",
        suggest=lambda trial: {"x": trial.suggest_float("x", 0.0, 1.0)},
        measure=lambda config, rng: config["x"],
    )


def _random_sampler(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def _command_runner(**kwargs):
    base = {"command": ["echo", "{x}"], "metrics": {"m": r"m: (\S+)"}, "timeout": 5.0,
            "lock": None, "log_dir": None}
    base.update(kwargs)
    return CommandRunner(base.pop("command"), **base)


def _contender(**kwargs):
    return Contender(**{"name": "random", "make_sampler": _random_sampler, **kwargs})


def _suite(**kwargs):
    base = {"name": "s", "definitions": [_definition()], "contenders": [_contender()],
            "n_trials": 5, "n_seeds": 1, "budgets": [5]}
    return Suite(**{**base, **kwargs})


FACTORIES = {
    "AutoScoutSampler": AutoScoutSampler,
    "MCTSSampler": MCTSSampler,
    "CoordinateDescentSampler": CoordinateDescentSampler,
    "FidelityPruner": FidelityPruner,
    "SimulatorEnsemble": SimulatorEnsemble,
    "CommandRunner": _command_runner,
    "Contender": _contender,
    "Suite": _suite,
}

# (constructor, argument, bad values). A wrong type must fail as clearly as a wrong range:
# `"0.3" > 0` would otherwise raise Python's own message, which names no argument, and a flag
# such as dense_optimizer="no" would silently read as True.
BAD_ARGUMENTS = {
    "AutoScoutSampler": {
        "seed": ["0", 1.5, [1]],
        "n_startup_trials": [-1, 2.5, "3", None],
        "startup": ["random", None, 1, ["mcts"]],
        "policy": ["ucb", None],
        "reward": ["diff", None],
        "estimate_weight": [1.5, -0.1, NAN, "0.5", None],
        "floor": [-0.1, 0.9, NAN, "x"],
        "discount": [0, 1.5, NAN, "x"],
        "dense_optimizer": ["no", None, 1],
        "feature_prioritization": ["no", None],
        "neighbour_arm": ["no"],
        "model_arm": ["yes", 1],
        "model_after": [-1, 2.5, "x", None],
        "explore_sampler": ["tpe", 5],
        "refine_sampler": ["tpe", _random_sampler],
        "memory_model": ["yes", 1, None],
        "memory_estimate": [0.5, "megatron"],
    },
    "MCTSSampler": {
        "seed": ["0", 1.5],
        "fallback": ["random", _random_sampler],
        "exploration": [-1, NAN, "a", None],
        "rave_equivalence": [-1, NAN, "a"],
        "max_backup": [-0.1, 1.5, NAN, "a"],
        "rave_visit_share": [-0.1, 1.5, NAN, "a"],
        "exploit_probability": [-0.1, 1.5, NAN, "a"],
        "failure_reward": [0, 1, NAN, "a"],
        "estimate_weight": [0, 1.5, NAN, "a"],
        "n_orderings": [0, 2.5, "3", None],
        "tournament_depth": [0, 1.5, "2"],
        "feature_prioritization": ["no", None],
        "structural": [5, "layout"],  # a str is a Container of characters: a classic slip
        "memory_model": ["yes", 1, None],
        "memory_estimate": [0.5, "megatron"],
    },
    "CoordinateDescentSampler": {
        "seed": ["0", 1.5],
        "fallback": ["random"],
        "rule": ["newton", None],
        "initial_step": [0, 0.6, NAN, "a"],
        "min_step": [0, 0.5, NAN, "a"],
        "confidence": [-1, NAN, "a"],
        "restart_radius": [0, 11, NAN, "a"],
        "headroom": ["no", None],
        "use_estimates": ["yes", 1],
        "max_structural_levels": [-1, 1.5, "2", None],
    },
    "FidelityPruner": {
        "error_threshold": [0, -1, NAN, "0.3", None],
        "rank_error_threshold": [0, 1.5, NAN, "a"],
        "rank_tolerance": [-0.1, 1, NAN, "a"],
        "top_fraction": [0, 1.5, NAN, "a"],
        "validation_top": [0, 1.5, NAN, "a"],
        "optimism": [-1, NAN, "a"],
        "validation_period": [0, True, 2.5, "a"],
        "n_warmup_real": [-1, 1.5, None, "a"],
        "window": [1, 2.5, None, "a"],
        "min_pairs": [1, 100, None, "a"],
        "trust_window": [1, 2.5, "a"],
        "trust_confidence": [0, 1, NAN, "a"],
        "selection_aware": ["no", None, 1],
        "new_structure_control": ["yes", 1],
        "real_for_measured_structures": ["yes", 1],
    },
    "SimulatorEnsemble": {
        "simulate": [5, "sim"],
        "window": [1, 2.5, None, "a"],
        "max_train": [1, 2.5, "a"],
        "ridge": [0, NAN, "a"],
        "min_real": [0, 1.5, "a"],
        "sharpness": [-1, NAN, "a"],
    },
    "CommandRunner": {
        "command": ["echo {x}", [], None],
        "metrics": [{}, {"m": "no group"}, {"m": "(a)(b)"}, {"m": "("}, None],
        "timeout": [0, -1, None, NAN, "10"],
        "too_slow_fraction": [1, -0.1, NAN, "a"],
        "warmup_readings": [-1, 1.5, "a"],
        "optional_metrics": [["not_a_metric"]],
        "throughput_pattern": ["tok/s", "("],
        "env": [["A=1"]],
        "lock": [0],
        "telemetry": ["no"],
        "expected_throughput": [1000.0],
    },
    "Contender": {
        "name": ["", 5],
        "make_sampler": ["tpe", None],
        "make_pruner": [5],
        "make_objective": ["objective"],
        "max_seeds": [0, 1.5, "a"],
        "start_from_default": ["yes", 1, None],
        "sampler_reads_study": ["yes", 1, None],
    },
    "Suite": {
        "name": ["", 5],
        "definitions": [[], ["llm_training"]],
        "contenders": [[], ["random"]],
        "n_trials": [0, 2.5, "a"],
        "n_seeds": [0, "a"],
        "first_seed": [-1, 2.5, "a"],
        "budgets": [[], [0], ["10"], 5],
        "extra_report": ["real_runs.md"],
        "rescore_report": ["paired.md"],
        "plot_groups": ["random", [("t", "random")], [("t",)], [("", ["random"])],
                        [("t", [])], [("t", ["tpe"])], [("t", ["random"]), ("t", ["random"])]],
    },
}

CASES = [
    pytest.param(ctor, arg, value, id=f"{ctor}-{arg}={value!r}")
    for ctor, table in BAD_ARGUMENTS.items()
    for arg, values in table.items()
    for value in values
]


def test_the_table_covers_every_public_constructor_and_argument():
    import inspect

    for ctor, table in BAD_ARGUMENTS.items():
        target = FACTORIES[ctor]
        if not inspect.isclass(target):
            target = {"CommandRunner": CommandRunner, "Contender": Contender,
                      "Suite": Suite}[ctor]
        params = set(inspect.signature(target).parameters) - {"self"}
        untested = params - set(table)
        # Free-form arguments: any str/path/object is a valid value for them.
        free_form = {"log_dir", "artifact_store", "throughput_attr", "lock_dir", "cwd",
                     "description", "labels"}
        assert untested <= free_form, (ctor, untested - free_form)


@pytest.mark.parametrize("ctor", sorted(FACTORIES))
def test_the_valid_baseline_constructs(ctor):
    FACTORIES[ctor]()  # so each bad case below fails on its bad value, not on the baseline


@pytest.mark.parametrize(("ctor", "arg", "value"), CASES)
def test_bad_constructor_argument_is_named(ctor, arg, value):
    with pytest.raises((ValueError, TypeError), match=arg):
        FACTORIES[ctor](**{arg: value})


# ---- objectives that return nonsense --------------------------------------------------------

SAMPLERS = {
    "autoscout": lambda: AutoScoutSampler(seed=0, n_startup_trials=3),
    "mcts": lambda: MCTSSampler(seed=0),
    "coordinate": lambda: CoordinateDescentSampler(seed=0),
}


def _good(trial: optuna.Trial) -> float:
    layout = trial.suggest_categorical("layout", ["flat", "tree"])
    x = trial.suggest_float("x", 0.0, 1.0)
    trial.report(x, 0)  # a step-0 estimate, as the multi-fidelity protocol reports
    return x + (layout == "tree")


def _returning(value):
    def objective(trial: optuna.Trial):
        _good(trial)
        return value

    return objective


def _conflict_in_one_trial(trial: optuna.Trial) -> float:
    trial.suggest_float("x", 0.0, 1.0)
    trial.suggest_int("x", 0, 5)  # same name, another distribution, same trial
    return 0.0


def _conflict_across_trials(trial: optuna.Trial) -> float:
    # "x" was a float in earlier trials; here it is categorical.
    return float(trial.suggest_categorical("x", ["a", "b"]) == "a")


def _bad_estimate(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", 0.0, 1.0)
    trial.report(math.nan, 0)  # a simulator that produced NaN
    if trial.should_prune():
        raise optuna.TrialPruned()
    return x


BAD_OBJECTIVES = {
    "none": (_returning(None), "fail"),
    "str": (_returning("fast"), "fail"),
    "list": (_returning([1.0, 2.0]), "fail"),
    "dict": (_returning({"value": 1.0}), "fail"),
    "object": (_returning(object()), "fail"),
    "nan": (_returning(math.nan), "fail"),
    "conflict_in_one_trial": (_conflict_in_one_trial, ValueError),
    "conflict_across_trials": (_conflict_across_trials, ValueError),
    "nan_estimate": (_bad_estimate, "real"),
}


def _snapshot(study: optuna.Study) -> list[tuple]:
    return [(t.number, t.state, t.values, t.params, t.user_attrs, t.intermediate_values)
            for t in study.get_trials(deepcopy=True) if t.state == TrialState.COMPLETE]


@pytest.mark.parametrize("bad", sorted(BAD_OBJECTIVES))
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_bad_objective_fails_its_trial_and_loses_nothing(sampler, bad):
    study = optuna.create_study(direction="maximize", sampler=SAMPLERS[sampler](),
                                pruner=FidelityPruner())
    study.optimize(_good, n_trials=5)
    before = _snapshot(study)
    objective, expected = BAD_OBJECTIVES[bad]
    if isinstance(expected, type):
        with pytest.raises(expected, match="distribution"):  # Optuna's clear error
            study.optimize(objective, n_trials=1)
    else:
        study.optimize(objective, n_trials=2)
    bad_trials = study.trials[5:]
    assert bad_trials and all(t.state.is_finished() for t in bad_trials)
    if expected == "real":  # a NaN estimate is no evidence: the pruner lets the real run go
        assert all(t.state == TrialState.COMPLETE for t in bad_trials)
        assert all(t.user_attrs["autoscout:fidelity"] == "real" for t in bad_trials)
    else:
        assert all(t.state == TrialState.FAIL for t in bad_trials)
    assert _snapshot(study)[: len(before)] == before

    study.optimize(_good, n_trials=3)  # the study carries on with the same sampler
    after = study.trials[-3:]
    assert [t.state for t in after] == [TrialState.COMPLETE] * 3
    assert all(0.0 <= t.params["x"] <= 1.0 for t in after)
    assert _snapshot(study)[: len(before)] == before


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_numeric_string_result_hits_an_optuna_bug_but_loses_nothing(sampler):
    """Optuna 5.0.0 crashes on a result such as ``"1.5"`` (float() accepts it, isnan does not)
    with ``AssertionError: Should not reach.`` and leaves the trial RUNNING. Not ours to fix;
    what we promise: nothing stored is lost, and our samplers carry on past the stale trial."""
    study = optuna.create_study(direction="maximize", sampler=SAMPLERS[sampler]())
    study.optimize(_good, n_trials=5)
    before = _snapshot(study)
    try:
        study.optimize(_returning("1.5"), n_trials=1)
    except AssertionError:
        assert study.trials[5].state == TrialState.RUNNING  # the upstream bug, as it stands
    else:
        assert study.trials[5].state in (TrialState.FAIL, TrialState.COMPLETE)  # fixed upstream
    assert _snapshot(study)[: len(before)] == before
    study.optimize(_good, n_trials=3)
    assert [t.state for t in study.trials[-3:]] == [TrialState.COMPLETE] * 3


def test_bad_objectives_lose_nothing_in_sqlite(tmp_path):
    """The same mix against a real database, re-read through a fresh connection."""
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    study = optuna.create_study(storage=url, study_name="bad", direction="maximize",
                                sampler=AutoScoutSampler(seed=1, n_startup_trials=3),
                                pruner=FidelityPruner())
    study.optimize(_good, n_trials=4)
    before = _snapshot(study)
    for name in ("none", "str", "nan", "nan_estimate"):
        study.optimize(BAD_OBJECTIVES[name][0], n_trials=1)
    with pytest.raises(ValueError):
        study.optimize(_conflict_in_one_trial, n_trials=1)
    reloaded = optuna.load_study(study_name="bad", storage=url)
    assert _snapshot(reloaded)[: len(before)] == before
    assert [t.state for t in reloaded.trials[4:7]] == [TrialState.FAIL] * 3
    assert reloaded.trials[8].state == TrialState.FAIL
    study.optimize(_good, n_trials=1)
    assert len(optuna.load_study(study_name="bad", storage=url).trials) == 10


# ---- the CLI on storage it cannot use -------------------------------------------------------

TOY_STUDY = textwrap.dedent('''
    from autoscout_optuna._study_definition import Knobs, StudyDefinition


    def definition(*, n_trials: int = 3, direction: str = "maximize"):
        def suggest(trial):
            knobs = Knobs(trial)
            return {"layout": knobs.categorical("layout", ["a", "b"], default="a"),
                    "x": knobs.float("x", 0.0, 1.0, default=0.5)}

        def measure(config, rng):
            return 1.0 + config["x"] + (config["layout"] == "b")

        return StudyDefinition(
            name="toy", direction=direction, metric="items/s", suggest=suggest,
            measure=measure, default_config={"layout": "a", "x": 0.5},
            options={"n_trials": n_trials},
        )
''')


@pytest.fixture(scope="module")
def template_db(tmp_path_factory):
    """A database holding 3 finished trials of the toy study, made once by ``autoscout run``."""
    folder = tmp_path_factory.mktemp("template")
    (folder / "toy.py").write_text(TOY_STUDY)
    url = f"sqlite:///{folder / 'toy.db'}"
    status = cli.main(["run", str(folder / "toy.py"), "--storage", url, "--n-trials", "3",
                       "--seed", "0", "--artifact-dir", str(folder / "art")])
    assert status == 0
    return folder / "toy.db"


@pytest.fixture
def stored(template_db, tmp_path, monkeypatch, capsys):
    """A fresh folder with the toy study file and a copy of the template database in db/.

    The URL sets SQLite's busy timeout to 0.5 s (pysqlite's default is 5 s): a locked database
    is reported after half a second instead of five.
    """
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy.py").write_text(TOY_STUDY)
    (tmp_path / "db").mkdir()
    shutil.copy(template_db, tmp_path / "db" / "toy.db")
    capsys.readouterr()
    return tmp_path, "sqlite:///db/toy.db?timeout=0.5"


def _digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _trials(url: str) -> list[tuple]:
    study = optuna.load_study(study_name="toy", storage=url)
    return [(t.number, t.state, t.values, t.params) for t in study.trials]


def _run_refused(capsys, url: str, *extra: str) -> str:
    status = cli.main(["run", "toy.py", "--storage", url, "--n-trials", "2", "--artifact-dir",
                       "art", *extra])
    out, err = capsys.readouterr()
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("autoscout run: error:"), err
    assert "Traceback" not in err and out == ""
    return err


def _make_read_only(folder) -> bool:
    """chmod 0444 the files and 0555 the folder; as root (which ignores modes) also try the
    immutable flag. True when writing is really refused."""
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "+i", *map(str, folder.iterdir()), str(folder)],
                       capture_output=True, check=False)
    try:
        (folder / "probe").touch()
    except OSError:
        return True
    (folder / "probe").unlink()
    return False


def _make_writable(folder) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(folder), *map(str, folder.iterdir())],
                       capture_output=True, check=False)
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def test_read_only_database_file_and_folder(stored, capsys):
    tmp_path, url = stored
    before, digest = _trials(url), _digest(tmp_path / "db")
    try:
        if not _make_read_only(tmp_path / "db"):
            pytest.skip("cannot make a folder read-only here (root without chattr +i)")
        err = _run_refused(capsys, url)
    finally:
        _make_writable(tmp_path / "db")
    assert "read-only" in err and "db/toy.db" in err
    assert _digest(tmp_path / "db") == digest  # not one byte written, no journal left behind
    assert _trials(url) == before
    assert not (tmp_path / "art").exists()


def test_read_only_connection(stored, capsys):
    """The same refusal through SQLite's own read-only mode (works for root too)."""
    tmp_path, url = stored
    before, digest = _trials(url), _digest(tmp_path / "db")
    err = _run_refused(capsys, "sqlite:///file:db/toy.db?mode=ro&uri=true&timeout=0.5")
    assert "read-only" in err and "attempt to write a readonly database" in err
    assert _digest(tmp_path / "db") == digest and _trials(url) == before
    assert not (tmp_path / "art").exists()


def _exclusive_lock(path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_database_locked_before_opening(stored, capsys):
    tmp_path, url = stored
    before = _trials(url)
    holder = _exclusive_lock(tmp_path / "db" / "toy.db")
    try:
        digest = _digest(tmp_path / "db")
        err = _run_refused(capsys, url)
        assert _digest(tmp_path / "db") == digest
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "database is locked" in err and url in err
    assert _trials(url) == before


def test_database_locked_after_opening(stored, capsys, monkeypatch):
    """Locked between opening and the first write: the refusal comes from deep inside Optuna,
    and the CLI still names it in one line."""
    tmp_path, url = stored
    before = _trials(url)
    holders = []
    opened = cli.open_storage

    def open_then_lock(*args, **kwargs):
        storage = opened(*args, **kwargs)
        holders.append(_exclusive_lock(tmp_path / "db" / "toy.db"))
        return storage

    monkeypatch.setattr(cli, "open_storage", open_then_lock)
    try:
        err = _run_refused(capsys, url)
    finally:
        for holder in holders:
            holder.execute("ROLLBACK")
            holder.close()
    assert holders and "locked" in err
    assert _trials(url) == before


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///db", "cannot open storage"),  # a folder, not a file
        ("postgresql://nobody@127.0.0.1:1/none", "cannot open storage"),  # nothing listens
        ("mysql+nosuchdriver://x/y", "cannot open storage"),
        ("", "cannot open storage"),
    ],
)
def test_bad_storage_urls(stored, capsys, url, expected):
    tmp_path, good_url = stored
    before, digest = _trials(good_url), _digest(tmp_path / "db")
    err = _run_refused(capsys, url)
    assert expected in err
    assert _digest(tmp_path / "db") == digest and _trials(good_url) == before


def test_study_file_without_a_definition(stored, capsys):
    tmp_path, url = stored
    (tmp_path / "empty.py").write_text("x = 1\n")
    status = cli.main(["run", "empty.py", "--storage", url])
    _, err = capsys.readouterr()
    assert status == 2 and "no definition" in err and err.count("\n") == 1


def test_wrong_direction_writes_nothing(stored, capsys):
    tmp_path, url = stored
    before, digest = _trials(url), _digest(tmp_path / "db")
    err = _run_refused(capsys, url, "-o", "direction=minimize")
    assert "goes maximize" in err and "goes minimize" in err
    assert _digest(tmp_path / "db") == digest and _trials(url) == before


def test_multi_objective_study_of_the_same_name_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy.py").write_text(TOY_STUDY)
    url = f"sqlite:///{tmp_path / 'multi.db'}"
    optuna.create_study(storage=url, study_name="toy", directions=["maximize", "minimize"])
    err = _run_refused(capsys, url)
    assert "maximize, minimize" in err
    status = cli.main(["show", "--storage", url])
    _, err = capsys.readouterr()
    assert status == 2 and "multi-objective" in err
