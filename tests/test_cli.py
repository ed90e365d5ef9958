"""The ``autoscout`` command: parsing, usage errors (exit 2, one line), run, resume, show."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from optuna_dashboard import get_note

from autoscout_optuna import Infeasible, cli, studies
from autoscout_optuna._progress import ProgressReporter
from autoscout_optuna._study_definition import check_fixed

# A study file as a user would write one (shared with the security tests).
TOY_STUDY = (Path(__file__).parent / "toy_study.py").read_text()


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Work in a fresh folder (autoscout.db and artifacts/ land there) with the toy study."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "CLAIM_SETTLE_S", 0.0)  # no other worker starts with these runs
    (tmp_path / "toy_study.py").write_text(TOY_STUDY)
    return tmp_path


def _run_cli(capsys, *argv):
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _study(tmp_path, name="toy"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'autoscout.db'}")


def _default_trials(study):
    from autoscout_optuna._keys import DEFAULT_CONFIG

    return [t.number for t in study.trials if t.user_attrs.get(DEFAULT_CONFIG)]


def test_parse_options_types():
    parsed = cli.parse_options(["gpus=128", "lr=3e-4", "fast=true", "eager=off", "model=70b",
                                "max-seqs=8"])
    assert parsed == {"gpus": 128, "lr": 3e-4, "fast": True, "eager": False, "model": "70b",
                      "max_seqs": 8}
    assert type(parsed["gpus"]) is int and type(parsed["lr"]) is float


def test_fix_values_read_on_off_as_strings_and_true_false_as_booleans():
    # gpt_training's compile knob has the choice "off": read as False, no --fix could pin it
    # ("compile must be one of ['off', ...], got False")
    fixed = cli._study_options([], ["compile=off", "tf32=false", "cuda_graphs=TRUE",
                                    "tp=04", "dtype=bf16", "prefix=no"])["fixed"]
    assert fixed == {"compile": "off", "tf32": False, "cuda_graphs": True, "tp": 4,
                     "dtype": "bf16", "prefix": "no"}
    assert check_fixed({"compile": fixed["compile"]}, {
        "compile": CategoricalDistribution(["off", "default", "max-autotune-no-cudagraphs"])})


@pytest.mark.parametrize("item", ["gpus", "=3", "1x=2"])
def test_parse_options_rejects_malformed_items(item):
    with pytest.raises(cli.UsageError, match="KEY=VALUE"):
        cli.parse_options([item])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "no_such_study"], "unknown study 'no_such_study'; known studies: "),
        (["run", "missing.py"], "study file 'missing.py' does not exist"),
        (["run", "toy_study.py", "-o", "scale=-1"], "scale=-1"),
        (["run", "toy_study.py", "-o", "scale=nan"], "scale='nan'"),
        (["run", "toy_study.py", "-o", "scale=inf"], "scale='inf'"),
        (["run", "toy_study.py", "-o", "warp=9"], "warp"),
        (["run", "toy_study.py", "-o", "scale"], "--option 'scale'"),
        (["run", "llm_serving", "--fix", "tp"], "--fix 'tp': expected KNOB=VALUE"),
        (["run", "llm_serving", "--fix", "tpp=2"], "unknown knob(s) ['tpp']"),
        (["run", "llm_serving", "--fix", "tp=3"], "tp must be one of [1, 2, 4, 8]"),
        (["run", "llm_serving", "-o", "fixed=tp"], "pin knobs with --fix KNOB=VALUE"),
        # a study file whose definition() takes no fixed=: "unexpected keyword argument" said
        # nothing of --fix, and made the user hunt for a typo
        (["run", "toy_study.py", "--fix", "x=1"],
         "--fix: study 'toy_study.py' cannot pin knobs (its definition() takes no fixed=)"),
        (["run", "toy_study.py", "--storage", "nosuchdb://x"], "cannot open storage"),
        (["run", "toy_study.py", "--storage", "sqlite:////no/such/dir/x.db"],
         "cannot open storage"),
        (["show"], "no database at autoscout.db"),
        (["dashboard", "--port", "0"], "--port must be in 1..65535"),
    ],
)
def test_usage_errors_exit_2_with_one_line(toy, capsys, argv, expected):
    status, out, err = _run_cli(capsys, *argv)
    assert status == 2
    assert expected in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unknown_study_lists_the_bundled_ones(toy, capsys):
    _, _, err = _run_cli(capsys, "run", "no_such_study")
    assert all(name in err for name in studies.names())


def test_argparse_errors_are_exit_2(toy, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "toy_study.py", "--n-trials", "-1"])
    assert exc.value.code == 2
    assert "--n-trials" in capsys.readouterr().err


def test_run_then_resume_then_show(toy, capsys):
    status, out, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "5", "--seed", "3")
    assert status == 0, err
    study = _study(toy)
    assert len(study.trials) == 5
    counts = {s: len(study.get_trials(states=(s,))) for s in TrialState}
    assert f"real runs          {counts[TrialState.COMPLETE]} " in out
    assert f"simulated          {counts[TrialState.PRUNED]} " in out
    assert f"failed             {counts[TrialState.FAIL]} " in out
    assert "default config     1.5 items/s" in out  # measured once, noiselessly
    assert "gain over default" in out and "Best configuration:" in out
    # ... and run as trial 0, so the sampler starts from it
    assert study.trials[0].params == {"layout": "flat", "x": 0.5}
    assert _default_trials(study) == [0] and "trial 0 runs the default config" in err
    assert "[5/5]" in err  # plain progress lines: stderr is not a terminal here
    note = get_note(study)
    assert "## AutoScout: toy" in note and "/artifacts/" in note
    assert (toy / "artifacts").is_dir()

    # Same study name: resumed, trials added to the same study, default not measured again.
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "2", "--seed", "3")
    assert status == 0 and "resuming study 'toy': 5 trials" in err
    assert "measuring the default" not in err
    assert optuna.get_all_study_names(f"sqlite:///{toy / 'autoscout.db'}") == ["toy"]
    assert len(_study(toy).trials) == 7
    assert _default_trials(_study(toy)) == [0]  # not queued again on resume

    status, out, _ = _run_cli(capsys, "show", "--last", "0")
    assert status == 0
    assert "autoscout:arm" in out and "state" in out
    assert len([line for line in out.splitlines() if line.split()[:1] == ["6"]]) == 1
    assert "Best configuration:" in out and "7 trials" in out


def test_run_confirms_the_top_configs_and_ships_the_confirmed_one(toy, capsys):
    from autoscout_optuna._keys import CONFIRMS

    status, out, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "8", "--seed", "1",
                                "--confirm", "2", "--confirm-top", "2")
    assert status == 0, err
    study = _study(toy)
    confirming = [t for t in study.trials if CONFIRMS in t.user_attrs]
    # the top 2 configs and the default, 2 runs each (the default may be among the top 2)
    assert len(study.trials) == 8 + len(confirming) and len(confirming) in (4, 6)
    assert all(t.state == TrialState.COMPLETE for t in confirming)
    assert "confirming the top 2 configs, any confirmed before and the default config" in err
    assert "confirmed best" in out and "confirmed gain" in out
    assert "Best configuration (confirmed):" in out
    assert "### Confirmation" in get_note(study)
    # resumed with the same flag: the configs confirmed already are not run again
    status, _, _ = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "1", "--seed", "1",
                            "--confirm", "2", "--confirm-top", "2")
    added = [t for t in _study(toy).trials[len(study.trials):] if CONFIRMS in t.user_attrs]
    assert status == 0 and len(added) <= 2  # at most the one new trial's config, twice


def test_show_json_gives_scripts_the_config_to_ship(toy, capsys):
    import json

    _run_cli(capsys, "run", "toy_study.py", "--n-trials", "6", "--seed", "2")
    status, out, _ = _run_cli(capsys, "show", "--json")
    record = json.loads(out)  # nothing but the JSON on stdout
    study = _study(toy)
    best = study.best_trial
    assert status == 0 and record["study"] == "toy" and record["direction"] == "maximize"
    assert record["ship"] == {"source": "best_run", "trial": best.number, "params": best.params}
    assert record["best_run"]["value"] == best.value and record["confirmation"] is None
    assert record["trials"]["finished"] == len(study.trials)
    # after confirmation runs the confirmed config is the one to ship, with its evidence
    _run_cli(capsys, "run", "toy_study.py", "--n-trials", "0", "--confirm", "2",
             "--confirm-top", "2")
    status, out, _ = _run_cli(capsys, "show", "--json")
    record = json.loads(out)
    top = record["confirmation"]["candidates"][0]
    assert status == 0 and record["ship"]["source"] == "confirmed"
    assert record["ship"]["params"] == top["params"] and top["runs"] >= 2
    assert record["ship"]["params"] == _study(toy).trials[top["trial"]].params


def test_show_json_of_a_study_without_a_real_run(toy, capsys):
    import json

    optuna.create_study(storage=f"sqlite:///{toy / 'autoscout.db'}", study_name="empty")
    status, out, _ = _run_cli(capsys, "show", "--json")
    record = json.loads(out)
    assert status == 0 and record["ship"] is None and record["best_run"] is None
    assert record["trials"]["finished"] == 0 and record["gain_over_default"] is None


def test_confirm_stays_within_the_timeout_of_the_whole_run(toy, capsys):
    from autoscout_optuna._keys import CONFIRMS

    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--timeout", "1e-9", "--confirm",
                              "2", "--seed", "1")
    assert status == 0 and "--confirm: the --timeout is spent, nothing confirmed" in err
    assert not [t for t in _study(toy).trials if CONFIRMS in t.user_attrs]


def test_confirm_takes_a_count_of_runs(toy, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "toy_study.py", "--confirm", "-1"])
    assert exc.value.code == 2 and "--confirm" in capsys.readouterr().err
    assert not (toy / "autoscout.db").exists()


def test_study_options_reach_the_study_and_its_default_budget(toy, capsys):
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "-o", "n_trials=2",
                              "--study-name", "small")
    assert status == 0, err
    assert len(_study(toy, "small").trials) == 2


def test_direction_conflict_is_refused_and_loses_nothing(toy, capsys):
    storage = f"sqlite:///{toy / 'autoscout.db'}"
    taken = optuna.create_study(storage=storage, study_name="toy", direction="minimize")
    taken.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "1")
    assert status == 2 and "goes minimize" in err and "goes maximize" in err
    assert len(_study(toy).trials) == 2


def test_show_needs_a_name_when_the_storage_has_several_studies(toy, capsys):
    storage = f"sqlite:///{toy / 'autoscout.db'}"
    for name in ("a", "b"):
        optuna.create_study(storage=storage, study_name=name)
    status, _, err = _run_cli(capsys, "show")
    assert status == 2 and "--study-name is needed" in err and "a, b" in err
    status, _, err = _run_cli(capsys, "show", "--study-name", "c")
    assert status == 2 and "no study 'c'" in err


def test_dashboard_binds_to_localhost_with_an_artifact_store(toy, capsys, monkeypatch):
    optuna.create_study(storage=f"sqlite:///{toy / 'autoscout.db'}")
    calls = []
    monkeypatch.setattr("autoscout_optuna._dashboard.serve",
                        lambda storage, **kwargs: calls.append(kwargs))
    status, _, _ = _run_cli(capsys, "dashboard", "--port", "8123")
    assert status == 0
    assert calls == [{"host": "127.0.0.1", "port": 8123, "artifact_dir": "artifacts"}]


def test_bench_is_delegated_untouched(monkeypatch):
    seen = []
    monkeypatch.setattr("autoscout_optuna.benchmark.main", lambda argv: seen.append(argv) or 7)
    assert cli.main(["bench", "--suite", "baselines", "--quick"]) == 7
    assert seen == [["--suite", "baselines", "--quick"]]


def test_console_entry_reports_usage_errors_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "autoscout_optuna.cli", "run", "no_such_study"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("autoscout run: error: unknown study 'no_such_study'")
    assert "Traceback" not in result.stderr


def test_progress_lines_plain_and_redrawn():
    study = optuna.create_study(direction="maximize")
    plain = io.StringIO()
    reporter = ProgressReporter(n_trials=3, metric="tok/s", stream=plain, is_tty=False)

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        trial.report(x, 0)
        if trial.number == 1:
            raise optuna.TrialPruned()
        return 10.0 + trial.number

    study.optimize(objective, n_trials=3, callbacks=[reporter])
    lines = plain.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[1/3] trial 0 real") and "best 10 tok/s" in lines[0]
    assert "simulated" in lines[1] and "real 1 simulated 1 failed 0" in lines[1]
    assert "best 12 tok/s" in lines[2]

    tty = io.StringIO()
    redraw = ProgressReporter(n_trials=None, stream=tty, is_tty=True)
    study.optimize(lambda t: 1.0, n_trials=2, callbacks=[redraw])
    redraw.close()
    text = tty.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "[2/?]" in text


BUSY_STUDY = TOY_STUDY.replace(
    "        measure=measure, simulate=lambda config: 1.1 * measure(config, None),",
    "        measure=measure, simulate=lambda config: busy_simulate(config, measure),",
) + '''

def busy_simulate(config, measure):
    """A second worker adds a trial to the same study while this one runs (once)."""
    import optuna
    from optuna.distributions import FloatDistribution

    study = optuna.load_study(study_name="toy", storage="sqlite:///autoscout.db")
    if not any(t.user_attrs.get("foreign") for t in study.trials):
        study.add_trial(optuna.trial.create_trial(
            params={"x": 0.1}, distributions={"x": FloatDistribution(0.0, 1.0)}, value=1.1,
            user_attrs={"foreign": True},
            system_attrs={"autoscout:worker": {"host": "elsewhere", "pid": 1, "start": 1}}))
    return 1.1 * measure(config, None)
'''


def test_a_second_worker_skips_the_claimed_default_and_counts_only_its_own_trials(toy, capsys):
    from autoscout_optuna._recovery import worker_identity

    (toy / "busy_study.py").write_text(BUSY_STUDY)
    study = optuna.create_study(storage=f"sqlite:///{toy / 'autoscout.db'}", study_name="toy",
                                direction="maximize")
    # the first worker (our parent process: alive) is measuring the default config
    study.set_user_attr(cli.DEFAULT_CLAIM_KEY, worker_identity(os.getppid()))
    status, out, err = _run_cli(capsys, "run", "busy_study.py", "--n-trials", "3", "--seed", "1")
    assert status == 0, err
    assert "measuring the default" not in err and "being measured by worker" in err
    assert len(_study(toy).trials) == 4  # 3 of ours and the other worker's
    assert _default_trials(_study(toy)) == []  # the measuring worker's to queue
    assert "4 trials, 3 added by this run" in out


def test_workers_starting_together_measure_the_default_once(toy, capsys, monkeypatch):
    from autoscout_optuna._dashboard import DEFAULT_VALUE_KEY
    from autoscout_optuna._recovery import worker_identity

    study = optuna.create_study(storage=f"sqlite:///{toy / 'autoscout.db'}", study_name="toy",
                                direction="maximize")
    settled = []

    def another_worker_claims_meanwhile(seconds):
        # Both saw no claim; the other worker (our live parent process) writes last.
        settled.append(seconds)
        study.set_user_attr(cli.DEFAULT_CLAIM_KEY, worker_identity(os.getppid()))

    monkeypatch.setattr(cli.time, "sleep", another_worker_claims_meanwhile)
    status, out, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "2")
    assert status == 0, err
    assert settled == [cli.CLAIM_SETTLE_S]
    assert "measuring the default" not in err and "being measured by worker" in err
    assert DEFAULT_VALUE_KEY not in _study(toy).user_attrs  # the other worker's to measure
    assert _default_trials(_study(toy)) == []  # and to queue


def test_a_default_claim_left_by_a_dead_worker_is_taken_over(toy, capsys):
    from autoscout_optuna._dashboard import DEFAULT_VALUE_KEY
    from autoscout_optuna._recovery import worker_identity

    waiting = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)
    dead = worker_identity(waiting.pid)  # taken while it lives, as a worker records it
    waiting.communicate(b"")  # now it has exited
    study = optuna.create_study(storage=f"sqlite:///{toy / 'autoscout.db'}", study_name="toy",
                                direction="maximize")
    study.set_user_attr(cli.DEFAULT_CLAIM_KEY, dead)
    status, out, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "1")
    assert status == 0, err
    assert "measuring the default" in err
    assert _study(toy).user_attrs[DEFAULT_VALUE_KEY] == pytest.approx(1.5)
    assert "default config     1.5 items/s" in out
    assert _default_trials(_study(toy)) == [0]  # the study was still empty


def test_the_default_s_trial_number_is_the_one_it_was_queued_as(toy, capsys, monkeypatch):
    # another worker began a trial between the read and the queueing: the default became
    # trial 1, and the line said "trial 0 runs the default config"
    from autoscout_optuna._study_definition import StudyDefinition

    queue = StudyDefinition.enqueue_default

    def another_worker_starts_first(self, study):
        study.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING))
        queue(self, study)

    monkeypatch.setattr(StudyDefinition, "enqueue_default", another_worker_starts_first)
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "1")
    assert status == 0, err
    assert _default_trials(_study(toy)) == [1] and "trial 1 runs the default config" in err


def test_a_study_with_trials_but_none_of_the_default_runs_it_next(toy, capsys):
    # a trial another worker began while this one waited out its claim on the default (or
    # that the study ran before the CLI): the default still runs, as the next trial
    study = optuna.create_study(storage=f"sqlite:///{toy / 'autoscout.db'}", study_name="toy",
                                direction="maximize")
    study.enqueue_trial({"layout": "tree", "x": 0.1, "depth": 3})
    study.optimize(lambda trial: 1.0, n_trials=1)
    status, out, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "2")
    assert status == 0, err
    assert "measuring the default" in err and "default config     1.5 items/s" in out
    assert _default_trials(_study(toy)) == [1] and "trial 1 runs the default config" in err
    assert _study(toy).trials[1].params == {"layout": "flat", "x": 0.5}


REAL_STUDY = TOY_STUDY.replace("default_config={", "is_real=True, default_config={")


def test_a_real_study_reads_its_default_from_trial_0_without_a_run_of_its_own(toy, capsys):
    from autoscout_optuna._progress import format_value

    (toy / "real_study.py").write_text(REAL_STUDY)
    status, out, err = _run_cli(capsys, "run", "real_study.py", "--n-trials", "3", "--seed", "2")
    assert status == 0, err
    assert "trial 0 runs the default config" in err and "measuring the default" not in err
    first = _study(toy).trials[0]
    assert _default_trials(_study(toy)) == [0] and first.state == TrialState.COMPLETE
    assert f"default config     {format_value(first.value)} items/s" in out
    assert "gain over default" in out
    # Resumed: the default already runs as a trial, so it is neither measured nor queued again.
    status, out, err = _run_cli(capsys, "run", "real_study.py", "--n-trials", "1", "--seed", "2")
    assert status == 0, err
    assert "runs as a trial of the study" in err and "measuring the default" not in err
    assert _default_trials(_study(toy)) == [0]
    assert f"default config     {format_value(first.value)} items/s" in out


def test_a_simulator_refused_trial_reads_as_predicted_not_as_a_hung_run():
    from autoscout_optuna import Infeasible
    from autoscout_optuna._progress import summary_text
    from autoscout_optuna.fidelity import multi_fidelity_objective

    def estimate(config):
        if config["x"] > 0.5:
            raise Infeasible("timeout", "first step alone exceeds the time limit")
        return config["x"]

    objective = multi_fidelity_objective(
        lambda trial: {"x": trial.suggest_float("x", 0, 1)}, estimate, lambda c: c["x"]
    )
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    stream = io.StringIO()
    reporter = ProgressReporter(n_trials=20, stream=stream, is_tty=False)
    study.optimize(objective, n_trials=20, callbacks=[reporter], catch=(Infeasible,))
    refused = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert refused and all(t.params["x"] > 0.5 for t in refused)
    lines = stream.getvalue().splitlines()
    for trial in refused:
        assert f"trial {trial.number} failed (timeout, predicted)" in lines[trial.number]
    text = summary_text(study)
    assert f"{len(refused)} of them predicted by the simulator, no run spent" in text


def test_run_hands_a_memory_formula_to_a_sampler_without_simulator(toy, capsys, monkeypatch):
    import autoscout_optuna

    seen = []

    class Spy(autoscout_optuna.AutoScoutSampler):
        def __init__(self, **options):
            seen.append(options.get("memory_estimate"))
            super().__init__(**options)

    monkeypatch.setattr(autoscout_optuna, "AutoScoutSampler", Spy)
    with_formula = TOY_STUDY.replace(
        "default_config={", "memory_estimate=lambda params: 0.5, default_config={")
    simulator = "simulate=lambda config: 1.1 * measure(config, None),"
    assert simulator in with_formula
    (toy / "toy_study.py").write_text(with_formula.replace(simulator, "simulate=None,"))
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "2")
    assert status == 0, err
    assert len(seen) == 1 and seen[0]({"layout": "flat"}) == 0.5
    # behind the fidelity pruner (the study has a simulator) it measured worse: not passed
    for name, text in (("simulated", with_formula), ("plain", TOY_STUDY)):
        seen.clear()
        (toy / "toy_study.py").write_text(text)
        status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "1",
                                  "--study-name", name)
        assert status == 0, err
        assert seen == [None]


def test_a_storage_with_heartbeats_opens_without_optuna_s_experimental_warnings(tmp_path):
    # Optuna flags the heartbeat API experimental; `autoscout run` users cannot act on it.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        storage = cli.open_storage(f"sqlite:///{tmp_path / 'a.db'}", heartbeat=True)
    assert storage.get_heartbeat_interval() == cli.HEARTBEAT_INTERVAL_S
    assert not [w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]


def test_two_workers_on_one_sqlite_file_never_both_pop_one_queued_trial(tmp_path):
    # Optuna pops its queue by reading a WAITING trial and writing it RUNNING "FOR UPDATE",
    # which SQLite ignores: two `autoscout run --confirm` workers both popped one confirmation
    # run, both made it, and the second to finish crashed ("Cannot tell a COMPLETE trial")
    import sqlalchemy

    url = f"sqlite:///{tmp_path / 'q.db'}?timeout=0.2"
    first, second = (cli.open_storage(url, heartbeat=True) for _ in range(2))
    study = optuna.create_study(storage=first, study_name="q")
    study.enqueue_trial({"x": 1.0})
    queued = study.get_trials()[0]._trial_id
    second_popped = []

    def second_pops_between_the_read_and_the_write(conn, cursor, statement, *args):
        # the first has read the trial WAITING and is about to write it RUNNING
        if not second_popped and statement.lstrip().upper().startswith("UPDATE"):
            try:
                second_popped.append(second.set_trial_state_values(queued, TrialState.RUNNING))
            except optuna.exceptions.StorageInternalError:  # locked: waits its turn
                second_popped.append(False)

    sqlalchemy.event.listen(first.engine, "before_cursor_execute",
                            second_pops_between_the_read_and_the_write)
    first_popped = first.set_trial_state_values(queued, TrialState.RUNNING)
    assert second_popped and [first_popped, *second_popped].count(True) == 1
    assert second.set_trial_state_values(queued, TrialState.RUNNING) is False  # taken


def test_the_summary_says_how_the_measured_peaks_read_the_memory_formula():
    from autoscout_optuna import AutoScoutSampler, Infeasible, MegatronMemoryEstimate
    from autoscout_optuna._objective import reference_objective
    from autoscout_optuna._progress import summary_text

    definition = studies.load("llm_training", preset="70b-512")
    formula = MegatronMemoryEstimate(
        layers=80, hidden=8192, ffn_hidden=28672, vocab=128256, heads=64, kv_heads=8,
        seq_len=8192, global_batch=1024, num_gpus=512, gpu_memory_gb=80)
    study = optuna.create_study(direction="maximize",
                                sampler=AutoScoutSampler(seed=0, memory_estimate=formula))
    study.optimize(reference_objective(definition), n_trials=30, catch=(Infeasible,))
    line = next(line for line in summary_text(study).splitlines() if "memory formula" in line)
    assert "x formula +" in line and "of capacity" in line and "error" in line
    plain = optuna.create_study(direction="maximize", sampler=AutoScoutSampler(seed=0))
    plain.optimize(reference_objective(definition), n_trials=10, catch=(Infeasible,))
    assert "memory formula" not in summary_text(plain)


INTERRUPTED_STUDY = '''
from autoscout_optuna._study_definition import Knobs, StudyDefinition


def definition(*, stop_at: int = 0, crash_above: int = 100, n_trials: int = 4):
    """Ctrl-C arrives during the ``stop_at``-th real run of this process (0: never); a run of
    x above ``crash_above`` raises, as subprocess.run(check=True) does for a crashed job."""
    runs = []

    def suggest(trial):
        return {"x": Knobs(trial).int("x", 0, 50, default=1)}

    def measure(config, rng):
        if config["x"] > crash_above:
            raise RuntimeError("job exited with status 139")
        if rng is not None:  # a trial's run, not the default's noiseless measurement
            runs.append(config)
            if len(runs) == stop_at:
                raise KeyboardInterrupt
        return 1.0 + config["x"]

    return StudyDefinition(
        name="stop", direction="maximize", metric="it/s", suggest=suggest, measure=measure,
        default_config={"x": 1}, options={"n_trials": n_trials},
    )
'''


def test_a_trial_stopped_by_ctrl_c_runs_again_on_resume_as_the_uninterrupted_study(toy, capsys):
    (toy / "stop.py").write_text(INTERRUPTED_STUDY)
    status, _, err = _run_cli(capsys, "run", "stop.py", "-o", "stop_at=2", "--seed", "0")
    assert status == 130 and "interrupted" in err
    stopped = _study(toy, "stop").trials[1]
    assert stopped.state == TrialState.FAIL
    assert stopped.user_attrs["failure_reason"] == "interrupted"
    status, _, err = _run_cli(capsys, "run", "stop.py", "--n-trials", "3", "--seed", "0")
    assert status == 0, err
    status, _, err = _run_cli(capsys, "run", "stop.py", "--study-name", "whole", "--seed", "0")
    assert status == 0, err
    resumed = [t.params for t in _study(toy, "stop").trials if t.number != 1]
    assert resumed == [t.params for t in _study(toy, "whole").trials]


def test_a_confirmation_run_stopped_by_ctrl_c_is_made_again_not_failed(toy, capsys):
    from autoscout_optuna._dashboard import summarize

    (toy / "stop.py").write_text(INTERRUPTED_STUDY)
    confirm = ("--confirm", "2", "--confirm-top", "1", "--seed", "0")
    # the 5th run is the first confirmation run (4 search trials, the default among them)
    status, _, _ = _run_cli(capsys, "run", "stop.py", "-o", "stop_at=5", *confirm)
    assert status == 130
    status, _, err = _run_cli(capsys, "run", "stop.py", "--n-trials", "0", *confirm)
    assert status == 0, err
    confirmation = summarize(_study(toy, "stop")).confirmation
    single_best = confirmation.single_best
    assert confirmation.best.number == single_best
    assert confirmation.best.runs == 2 and confirmation.best.failures == ()


def test_a_study_resumed_with_other_options_is_refused_and_loses_nothing(toy, capsys):
    status, _, err = _run_cli(capsys, "run", "llm_training", "-o", "preset=70b-512",
                              "--n-trials", "2", "--seed", "0")
    assert status == 0, err
    # another workload under the same name: its tokens/s would not compare with the stored
    status, _, err = _run_cli(capsys, "run", "llm_training", "--n-trials", "2")
    assert status == 2 and err.count("\n") == 1
    assert "model='llama3-70b'" in err and "model='llama3-8b'" in err and "num_gpus" in err
    study = _study(toy, "llm_training")
    assert len(study.trials) == 2 and study.user_attrs["autoscout:options"]["num_gpus"] == 512
    # the same workload resumes
    status, _, err = _run_cli(capsys, "run", "llm_training", "-o", "preset=70b-512",
                              "--n-trials", "1", "--seed", "0")
    assert status == 0, err
    assert len(_study(toy, "llm_training").trials) == 3


def test_fix_pins_knobs_for_the_search_and_the_default_and_resume_keeps_them(toy, capsys):
    status, _, err = _run_cli(capsys, "run", "llm_serving", "--fix", "tp=4", "--fix",
                              "cuda_graphs=false", "--n-trials", "4", "--seed", "0")
    assert status == 0, err
    study = _study(toy, "llm_serving")
    assert study.user_attrs["autoscout:options"]["fixed"] == {"tp": 4, "cuda_graphs": False}
    # pinned knobs are not searched: no trial has them as params, and trial 0, the default
    # config, is the recipe with the pins
    assert not any({"tp", "cuda_graphs"} & set(t.params) for t in study.trials)
    assert study.trials[0].user_attrs["autoscout:default_config"] is True
    # the config to ship is whole: the pins are no trial's params, but part of what ran
    status, out, _ = _run_cli(capsys, "show", "--json")
    record = json.loads(out)
    assert record["pinned"] == {"tp": 4, "cuda_graphs": False}
    assert {"tp": 4, "cuda_graphs": False}.items() <= record["ship"]["params"].items()
    status, out, _ = _run_cli(capsys, "show")
    assert re.search(r"tp\s+4 \(pinned\)", out)
    # other pins under the same name would mix measurements: refused, nothing lost
    status, _, err = _run_cli(capsys, "run", "llm_serving", "--fix", "tp=8", "--n-trials", "1")
    assert status == 2 and "fixed" in err
    assert len(_study(toy, "llm_serving").trials) == 4


def test_a_run_that_raises_is_recorded_as_a_crash_and_the_study_goes_on(toy, capsys):
    (toy / "stop.py").write_text(INTERRUPTED_STUDY)
    status, out, err = _run_cli(capsys, "run", "stop.py", "-o", "crash_above=40",
                                "--seed", "0", "--n-trials", "12")
    study = _study(toy, "stop")
    crashed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert status == 0, err
    assert len(study.trials) == 12 and crashed and len(crashed) < 12
    assert {t.user_attrs["failure_reason"] for t in crashed} == {"crash"}
    assert {t.user_attrs["failure_detail"] for t in crashed} == {
        "RuntimeError: job exited with status 139"}
    assert all(t.params["x"] > 40 for t in crashed) and "Best configuration:" in out


def test_the_same_crash_three_times_in_a_row_stops_the_run(toy, capsys):
    (toy / "stop.py").write_text(INTERRUPTED_STUDY)
    status, out, err = _run_cli(capsys, "run", "stop.py", "-o", "crash_above=-1",
                                "--seed", "0", "--n-trials", "10")
    study = _study(toy, "stop")
    assert status == 1 and "trials #0, #1, #2 crashed alike" in err
    assert "RuntimeError: job exited with status 139" in err and "Traceback" not in err
    assert len(study.trials) == 3 and "Study 'stop'" in out  # the summary still prints
    assert all(t.user_attrs["failure_reason"] == "crash" for t in study.trials)


def test_once_a_run_went_through_only_a_long_streak_of_one_crash_stops():
    outcomes = iter([1.0, "boom", "boom", "other", "boom", "boom", "boom", "boom"])

    def objective(trial):
        outcome = next(outcomes)
        if isinstance(outcome, str):
            raise OSError(outcome)
        return outcome

    guarded = cli._GuardedObjective(objective, stop_at_start=2, stop_later=4)
    study = optuna.create_study()
    with pytest.raises(cli.SameCrashes, match=r"trials #4, #5, #6, #7 crashed alike \(OSError"):
        study.optimize(guarded, n_trials=8, catch=(Infeasible,))
    assert [t.user_attrs.get("failure_detail") for t in study.trials[1:4]] == [
        "OSError: boom", "OSError: boom", "OSError: other"]


def test_a_name_taken_by_another_study_is_refused_and_loses_nothing(toy, capsys):
    (toy / "stop.py").write_text(INTERRUPTED_STUDY)  # maximizes too, with other knobs
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "2")
    assert status == 0, err
    status, _, err = _run_cli(capsys, "run", "stop.py", "--study-name", "toy")
    assert status == 2 and err.count("\n") == 1
    assert "taken by a study of 'toy'" in err and "this study is 'stop'" in err
    study = _study(toy)
    assert len(study.trials) == 2 and study.user_attrs["autoscout:metric"] == "items/s"


@pytest.mark.parametrize("simulate", [None, lambda config: 1.0], ids=["reference", "fidelity"])
def test_a_run_that_measures_nan_or_inf_fails_with_reason_nan(simulate):
    from autoscout_optuna import FidelityPruner, Infeasible
    from autoscout_optuna._dashboard import summarize
    from autoscout_optuna._study_definition import Knobs, StudyDefinition

    measured = {0: 1.0, 1: math.nan, 2: math.inf}
    definition = StudyDefinition(
        name="nonfinite", direction="maximize", metric="it/s",
        suggest=lambda trial: {"x": Knobs(trial).int("x", 0, 2, default=0)},
        measure=lambda config, rng: measured[config["x"]], simulate=simulate,
    )
    study = optuna.create_study(direction="maximize", pruner=FidelityPruner())
    for x in (0, 1, 2):
        study.enqueue_trial({"x": x})
    reporter = ProgressReporter(n_trials=3, metric="it/s", stream=io.StringIO(), is_tty=False)
    study.optimize(cli._objective(definition, seed=0), n_trials=3, catch=(Infeasible,),
                   callbacks=[reporter])
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] + [TrialState.FAIL] * 2
    assert [t.user_attrs.get("failure_reason") for t in study.trials[1:]] == ["nan", "nan"]
    summary = summarize(study)
    assert (reporter.real, reporter.failed) == (summary.real, summary.failed) == (1, 2)
    assert "best 1 it/s" in reporter.stream.getvalue().splitlines()[-1]


def test_show_opens_a_sqlite_url_with_driver_options(toy, capsys):
    status, _, err = _run_cli(capsys, "run", "toy_study.py", "--n-trials", "2")
    assert status == 0, err
    status, out, err = _run_cli(capsys, "show", "--storage", "sqlite:///autoscout.db?timeout=30")
    assert status == 0, err
    assert "Study 'toy' (maximize): 2 trials" in out


def test_a_worker_that_loses_the_race_to_create_the_tables_connects_again(tmp_path,
                                                                       monkeypatch):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    real = optuna.storages.RDBStorage
    tries = []

    def other_worker_made_the_tables_first(*args, **kwargs):
        tries.append(args)
        if len(tries) == 1:
            real(url)  # the other worker's tables
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: "
                               "alembic_version.version_num")
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", other_worker_made_the_tables_first)
    monkeypatch.setattr(cli, "SCHEMA_RACE_RETRY_S", 0.0, raising=False)
    assert isinstance(cli.open_storage(url, heartbeat=True), real) and len(tries) == 2


SLEEPY_STUDY = '''
import sys

from autoscout_optuna._study_definition import Knobs, StudyDefinition
from autoscout_optuna.runners import CommandRunner

JOB = ("import os, time; open('job.pid', 'w').write(str(os.getpid())); "
       "time.sleep(120); print('v=1')")
RUNNER = CommandRunner([sys.executable, "-c", JOB], metrics={"v": r"v=(.+)"}, timeout=300,
                       lock=None, telemetry=False, log_dir=None)


def definition(*, n_trials: int = 2):
    def suggest(trial):
        return {"x": Knobs(trial).float("x", 0.0, 1.0, default=0.5)}

    return StudyDefinition(
        name="sleepy", direction="minimize", metric="v", suggest=suggest,
        measure=lambda config, rng: RUNNER.run(None, config)["v"],
        default_config={"x": 0.5}, options={"n_trials": n_trials},
    )
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_sigterm_stops_the_running_job_instead_of_orphaning_it(tmp_path):
    # The job runs in its own session: a worker ended by SIGTERM (kill, timeout, preemption)
    # must kill it like Ctrl-C does, or it runs on, holding the GPU, after its worker is gone.
    import signal
    import time

    (tmp_path / "sleepy.py").write_text(SLEEPY_STUDY)
    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        repo, os.environ.get("PYTHONPATH")]))}
    worker = subprocess.Popen(
        [sys.executable, "-m", "autoscout_optuna.cli", "run", "sleepy.py", "--storage",
         f"sqlite:///{tmp_path / 's.db'}"], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid_file = tmp_path / "job.pid"
    job = None
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()
            time.sleep(0.2)
        job = int(pid_file.read_text())
        time.sleep(0.5)  # the runner is in its read loop
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        assert not _alive(job), "the job outlived its worker"
        assert worker.returncode == 130 and "interrupted" in err, err
    finally:
        if worker.poll() is None:
            worker.kill()
        if job is not None and _alive(job):
            os.kill(job, signal.SIGKILL)
