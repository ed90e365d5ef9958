"""Security (issue 9): the dashboard stays local, storage holds JSON only, no shell, study files
are code.

- ``autoscout dashboard`` binds to 127.0.0.1 unless ``--host`` says otherwise (and then warns).
- Everything our samplers, pruner and CLI write to storage is plain JSON, and nothing in the
  package unpickles (or evals) data it reads.
- ``CommandRunner`` passes config values as argv elements, never through a shell, and refuses a
  value that does not fit its parameter before anything runs.
- ``studies.load("file.py")`` runs the file as code (documented); a bundled name cannot import
  an arbitrary module.
"""

from __future__ import annotations

import ast
import json
import math
import sqlite3
import sys
import textwrap
from pathlib import Path

import optuna
import pytest

import autoscout_optuna
from autoscout_optuna import CoordinateDescentSampler, MCTSSampler, cli, studies
from autoscout_optuna.runners import CommandRunner

PACKAGE_ROOT = Path(autoscout_optuna.__file__).parent
SOURCE_FILES = sorted(PACKAGE_ROOT.rglob("*.py")) + sorted(Path(studies.__file__).parent.glob(
    "*.py"))


# ---- dashboard ------------------------------------------------------------------------------


def test_dashboard_host_defaults_to_localhost():
    args = cli._parser().parse_args(["dashboard"])
    assert args.host == "127.0.0.1"


@pytest.mark.parametrize(("argv", "host", "warned"), [
    ([], "127.0.0.1", False),
    (["--host", "::1"], "::1", False),
    (["--host", "0.0.0.0"], "0.0.0.0", True),
])
def test_dashboard_host_reaches_the_server_and_a_public_one_warns(
    tmp_path, monkeypatch, capsys, argv, host, warned
):
    """The whole path down to optuna-dashboard's ``run_server``, which is replaced by a recorder
    (no server is started)."""
    import optuna_dashboard

    url = f"sqlite:///{tmp_path / 'd.db'}"
    optuna.create_study(storage=url, study_name="s")
    calls = []
    monkeypatch.setattr(optuna_dashboard, "run_server",
                        lambda storage, **kwargs: calls.append(kwargs))
    status = cli.main(["dashboard", "--storage", url, "--artifact-dir",
                       str(tmp_path / "art"), *argv])
    err = capsys.readouterr().err
    assert status == 0
    assert len(calls) == 1 and calls[0]["host"] == host
    assert ("reachable from the network" in err) == warned


# ---- JSON only in storage, nothing unpickled ------------------------------------------------

# The CLI tests' study file: a conditional knob, an infeasible corner, a biased simulator.
STUDY_WITH_SIMULATOR = (Path(__file__).parents[1] / "toy_study.py").read_text()

ATTR_TABLES = ("study_user_attributes", "study_system_attributes", "trial_user_attributes",
               "trial_system_attributes")


def _is_plain_json(value) -> bool:
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_plain_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain_json(v) for k, v in value.items())
    return False


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


@pytest.fixture(scope="module")
def finished_storage(tmp_path_factory):
    """One SQLite file: a CLI run (AutoScoutSampler, FidelityPruner, dashboard note and plot
    artifacts), and each sub-sampler run alone on a conditional space."""
    folder = tmp_path_factory.mktemp("json")
    (folder / "secure.py").write_text(STUDY_WITH_SIMULATOR)
    url = f"sqlite:///{folder / 'attrs.db'}"
    status = cli.main(["run", str(folder / "secure.py"), "--storage", url, "--seed", "0",
                       "--n-trials", "10", "--artifact-dir", str(folder / "art")])
    assert status == 0

    def conditional(trial):
        layout = trial.suggest_categorical("layout", ["flat", "tree"])
        x = trial.suggest_float("x", 0.0, 1.0)
        if layout == "tree":
            return x + trial.suggest_int("depth", 1, 3)
        return x

    for sampler in (MCTSSampler(seed=0), CoordinateDescentSampler(seed=0)):
        study = optuna.create_study(storage=url, study_name=type(sampler).__name__,
                                    direction="maximize", sampler=sampler)
        study.optimize(conditional, n_trials=6)
    return folder / "attrs.db"


def test_every_stored_attr_is_plain_json(finished_storage):
    """Read the attr tables straight from the file: each value parses as strict JSON (no NaN
    or Infinity tokens, no pickled bytes) and holds only JSON-native types."""
    connection = sqlite3.connect(finished_storage)
    try:
        rows = {table: connection.execute(f"SELECT key, value_json FROM {table}").fetchall()
                for table in ATTR_TABLES}
    finally:
        connection.close()
    ours = [key for table_rows in rows.values() for key, _ in table_rows
            if key.split(":")[0] in ("autoscout", "mcts", "cd", "run")]
    assert len(ours) > 50  # the samplers and the pruner did write their decisions here
    assert {"autoscout:arm", "autoscout:fidelity"} <= set(ours)
    for table, table_rows in rows.items():
        for key, text in table_rows:
            assert isinstance(text, str), (table, key, type(text))
            value = json.loads(text, parse_constant=_reject_constant)
            assert _is_plain_json(value), (table, key, text[:200])


def test_stored_distributions_and_values_are_json_too(finished_storage):
    connection = sqlite3.connect(finished_storage)
    try:
        distributions = connection.execute(
            "SELECT distribution_json FROM trial_params").fetchall()
    finally:
        connection.close()
    assert distributions
    for (text,) in distributions:
        optuna.distributions.json_to_distribution(text)  # JSON, never a pickle


_UNPICKLING = {
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
    ("cloudpickle", "load"), ("cloudpickle", "loads"), ("dill", "load"), ("dill", "loads"),
    ("marshal", "load"), ("marshal", "loads"), ("shelve", "open"), ("joblib", "load"),
    ("yaml", "load"), ("yaml", "unsafe_load"), ("numpy", "load"), ("np", "load"),
    ("pandas", "read_pickle"), ("pd", "read_pickle"),
}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def test_nothing_in_the_package_unpickles_or_evals():
    """A static scan of every module of the package and of the bundled studies."""
    assert len(SOURCE_FILES) > 30
    found = []
    for path in SOURCE_FILES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in ("dill", "cloudpickle", "shelve", "marshal")
                       for n in names):
                    found.append(f"{path.name}:{node.lineno} imports {names}")
                if isinstance(node, ast.ImportFrom) and node.module == "pickle" and any(
                    a.name in ("load", "loads", "Unpickler") for a in node.names
                ):
                    found.append(f"{path.name}:{node.lineno} from pickle import load")
        for call in _calls(tree):
            func = call.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id, func.attr) in _UNPICKLING:
                    found.append(f"{path.name}:{call.lineno} {func.value.id}.{func.attr}")
                if func.value.id == "torch" and func.attr == "load" and not any(
                    k.arg == "weights_only" and getattr(k.value, "value", None) is True
                    for k in call.keywords
                ):
                    found.append(f"{path.name}:{call.lineno} torch.load without weights_only")
            if isinstance(func, ast.Name) and func.id in ("eval", "exec", "__import__"):
                found.append(f"{path.name}:{call.lineno} {func.id}()")
    assert found == []


def test_no_shell_anywhere_in_the_package():
    found = []
    for path in SOURCE_FILES:
        for call in _calls(ast.parse(path.read_text(), filename=str(path))):
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(getattr(func, "value", None), "id", "")
            if (owner, name) in (("os", "system"), ("os", "popen"), ("subprocess", "getoutput"),
                                 ("subprocess", "getstatusoutput")):
                found.append(f"{path.name}:{call.lineno} {owner}.{name}")
            for keyword in call.keywords:
                if keyword.arg == "shell" and getattr(keyword.value, "value", False) is not False:
                    found.append(f"{path.name}:{call.lineno} shell={ast.unparse(keyword.value)}")
    assert found == []


# ---- CommandRunner: no shell, typed values --------------------------------------------------

# The child records its argv and one environment variable, then prints the metric.
_CHILD = ("import json, os, sys; open(os.environ['OUT_FILE'], 'w').write(json.dumps("
          "{'argv': sys.argv[1:], 'env': os.environ['PAYLOAD_ENV']})); print('m: 1')")


def _payloads(marker: Path) -> list[str]:
    return [
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"x && touch {marker}",
        f"x | touch {marker}",
        f"x\ntouch {marker}",
        f"'; touch {marker}; '",
        "*",
        "{other}",  # a value is never expanded as a template a second time
        "--flag=value with spaces",
    ]


def test_config_values_reach_the_child_as_literal_argv_elements(tmp_path):
    marker, out_file = tmp_path / "pwned", tmp_path / "seen.json"
    payloads = _payloads(marker)
    names = [f"p{i}" for i in range(len(payloads))]
    runner = CommandRunner(
        [sys.executable, "-c", _CHILD, *[f"{{{n}}}" for n in names]],
        metrics={"m": r"^m: (\S+)"}, timeout=60, log_dir=None, lock=None, telemetry=False,
        env={"OUT_FILE": str(out_file), "PAYLOAD_ENV": "{p0}"}, cwd=tmp_path,
    )
    study = optuna.create_study()
    trial = study.ask()
    config = {n: trial.suggest_categorical(n, [p]) for n, p in zip(names, payloads, strict=True)}
    config["other"] = "EXPANDED"
    assert runner.run(trial, config) == {"m": 1.0}
    seen = json.loads(out_file.read_text())
    assert seen["argv"] == payloads
    assert seen["env"] == payloads[0]
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seen.json"]  # "*" expanded nothing


@pytest.mark.parametrize(("config", "error", "name"), [
    ({"n": "3; touch pwned"}, TypeError, "n"),
    ({"n": 2.5}, TypeError, "n"),
    ({"n": True}, TypeError, "n"),
    ({"n": 99}, ValueError, "n"),
    ({"lr": "0.1"}, TypeError, "lr"),
    ({"lr": math.nan}, ValueError, "lr"),
    ({"lr": 5.0}, ValueError, "lr"),
    ({"mode": "fast; touch pwned"}, ValueError, "mode"),
    ({"mode": 1}, ValueError, "mode"),
    ({"tag": ["a", "b"]}, TypeError, "tag"),
    ({"tag": None}, TypeError, "tag"),
    ({"tag": "a\0b"}, ValueError, "tag"),
])
def test_values_that_do_not_fit_their_param_are_refused_before_running(
    tmp_path, config, error, name
):
    marker = tmp_path / "ran"
    runner = CommandRunner(
        [sys.executable, "-c", f"open({str(marker)!r}, 'w'); print('m: 1')",
         "{n}", "{lr}", "{mode}", "{tag}"],
        metrics={"m": r"^m: (\S+)"}, timeout=60, log_dir=None, lock=None, telemetry=False,
    )
    study = optuna.create_study()
    trial = study.ask()
    good = {"n": trial.suggest_int("n", 1, 8), "lr": trial.suggest_float("lr", 1e-4, 1.0),
            "mode": trial.suggest_categorical("mode", ["fast", "safe"]), "tag": "plain"}
    with pytest.raises(error, match=repr(name)):
        runner.run(trial, {**good, **config})
    assert not marker.exists()


def test_command_must_be_an_argument_list_not_a_shell_string():
    with pytest.raises(TypeError, match="command"):
        CommandRunner("python train.py --lr {lr}", metrics={"m": "(.)"}, timeout=1)


# ---- study files are code -------------------------------------------------------------------


def test_loading_a_study_file_runs_it_as_code_and_says_so(tmp_path):
    marker = tmp_path / "executed"
    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent(f'''
        from pathlib import Path

        Path({str(marker)!r}).write_text("ran at import")

        from autoscout_optuna._study_definition import StudyDefinition


        def definition():
            return StudyDefinition(name="mine", direction="minimize", metric="s",
                                   suggest=lambda t: {{}}, measure=lambda c, rng: 0.0)
    '''))
    assert studies.load(str(path)).name == "mine"
    assert marker.read_text() == "ran at import"  # the file is code, with our privileges
    doc = " ".join((studies.__doc__ or "").split())
    assert "is code" in doc and "privileges" in doc
    run_help = " ".join(cli._parser()._subparsers._group_actions[0].choices["run"]
                        .format_help().split())
    assert "runs as Python code" in run_help


@pytest.mark.parametrize("name", ["os", "subprocess", "../cli", "autoscout_optuna.cli",
                                  "_hardware", "llm_training.py"])
def test_a_bundled_name_cannot_import_anything_else(name, monkeypatch):
    imported = []
    import importlib

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda module, *a: imported.append(module) or real(module, *a))
    with pytest.raises(ValueError, match="study"):
        studies.load(name)
    assert imported == []
