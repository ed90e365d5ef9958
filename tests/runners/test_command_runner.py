"""CommandRunner: each failure class produced by a tiny script, recorded with the right reason."""

from __future__ import annotations

import re
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import Infeasible
from autoscout_optuna._keys import FAILURE_REASON
from autoscout_optuna.runners import AUTORESEARCH_METRICS, CommandRunner, RunFailed

METRICS = {"val_bpb": r"^val_bpb:\s*(\S+)", "tokens_per_s": r"^tokens_per_s:\s*(\S+)"}


def script_runner(tmp_path, body: str, **kwargs) -> CommandRunner:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    kwargs.setdefault("metrics", METRICS)
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("log_dir", tmp_path / "logs")
    kwargs.setdefault("lock", None)
    return CommandRunner([sys.executable, str(path), "{x}"], **kwargs)


def run_in_study(runner: CommandRunner, x: int = 3):
    """One trial of a study whose objective is the runner; returns the frozen trial."""
    study = optuna.create_study(direction="minimize")

    def objective(trial: optuna.Trial) -> float:
        return runner.run(trial, {"x": trial.suggest_int("x", 1, 10)})["val_bpb"]

    study.enqueue_trial({"x": x})
    study.optimize(objective, n_trials=1, catch=(Infeasible,))
    return study.trials[-1]


SUCCESS = """
    import sys
    print("step 1 | loss 3.0 | tok/s 900")
    print("val_bpb:", 1.0 / int(sys.argv[1]))
    print("tokens_per_s: 1234.5")
"""


def test_success_parses_metrics_and_records_them(tmp_path):
    trial = run_in_study(script_runner(tmp_path, SUCCESS), x=4)
    assert trial.state == TrialState.COMPLETE
    assert trial.value == pytest.approx(0.25)
    assert trial.user_attrs["tokens_per_s"] == pytest.approx(1234.5)
    assert trial.user_attrs["run:returncode"] == 0
    assert FAILURE_REASON not in trial.user_attrs
    log = trial.user_attrs["run:log"]
    assert "val_bpb: 0.25" in open(log).read()


def test_autoresearch_summary_line_works_out_of_the_box(tmp_path):
    runner = script_runner(tmp_path, 'print("---")\nprint("val_bpb:          0.997900")',
                           metrics=AUTORESEARCH_METRICS)
    assert runner.run(None, {"x": 1}) == {"val_bpb": pytest.approx(0.9979)}


@pytest.mark.parametrize(
    "reason, body, kwargs",
    [
        ("timeout", "import time\nprint('started', flush=True)\ntime.sleep(60)", {"timeout": 1}),
        ("oom", "raise MemoryError('cannot allocate')", {}),
        ("oom", "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB')\n"
                "raise SystemExit(1)", {}),
        ("oom", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", {}),
        ("nan", "import time\nprint('step 3 | loss nan | tok/s 100', flush=True)\n"
                "time.sleep(60)", {}),
        ("nan", "print('val_bpb: nan')\nprint('tokens_per_s: 5')", {}),
        ("crash", "raise ValueError('bad config')", {}),
        ("no_metric", "print('finished without a summary')", {}),
        ("too_slow", "import time\nfor r in (5000, 40, 30, 20):\n"
                     "    print(f'step | loss 3.0 | tok/s {r}', flush=True)\ntime.sleep(60)",
         {"expected_throughput": lambda config: 5000.0}),
    ],
)
def test_each_failure_class_is_recorded_and_the_study_goes_on(tmp_path, reason, body, kwargs):
    trial = run_in_study(script_runner(tmp_path, body, **kwargs))
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs[FAILURE_REASON] == reason
    assert "run:log" in trial.user_attrs


def test_autoresearch_progress_lines_arm_the_too_slow_guard(tmp_path):
    # autoresearch rewrites one line with \r and prints "tok/sec: 12,345": the guard read
    # only "tok/s 12345", so such a run at a fraction of its expected speed went unjudged
    body = ("import time\nfor r in ('9,000', '40', '30', '20'):\n"
            "    print(f'\\rstep 00001 (1.0%) | loss: 3.000000 | tok/sec: {r} | epoch: 1',"
            " end='', flush=True)\n")
    trial = run_in_study(script_runner(tmp_path, body,
                                       expected_throughput=lambda config: 5000.0))
    assert trial.user_attrs[FAILURE_REASON] == "too_slow"
    assert trial.user_attrs["failure_detail"].startswith("40 tok/s after warm-up")


def test_a_progress_reading_that_is_no_number_is_ignored(tmp_path):
    runner = script_runner(tmp_path, "print('tok/s n/a')\n" + textwrap.dedent(SUCCESS),
                           throughput_pattern=r"tok/s (\S+)")
    assert runner.run(None, {"x": 2})["val_bpb"] == pytest.approx(0.5)


def test_progress_a_python_job_prints_without_flushing_reaches_the_guards(tmp_path,
                                                                          monkeypatch):
    # print() to a pipe is block-buffered: a script that does not flush (nanoGPT's train.py)
    # showed its progress 8 KB at a time, so a slow run met the too_slow guard only after
    # hundreds of steps, or met the timeout first
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    body = ("import time\nfor r in (5000, 40, 30, 20):\n"
            "    print(f'iter | loss 3.0 | tok/s {r}')\ntime.sleep(60)")
    trial = run_in_study(script_runner(tmp_path, body, timeout=5,
                                       expected_throughput=lambda config: 5000.0))
    assert trial.user_attrs[FAILURE_REASON] == "too_slow"


def test_a_crash_records_how_the_job_ended_and_its_last_words_through_the_objective(tmp_path):
    # the objectives record the failure again: they kept the first 500 characters of the
    # detail ("exit 1", then the job's first lines), so the error a job printed last, the one
    # line that says what went wrong, was lost (a missing -o data file read as a bare
    # "Traceback (most recent call last): File "<frozen ")
    from autoscout_optuna._objective import call_recording_failure

    runner = script_runner(tmp_path, """
        for step in range(100):
            print(f"step {step} | loss 3.0 | a progress line of some length")
        raise SystemExit("ValueError: data file '/nonexistent' does not exist")
    """)
    study = optuna.create_study(direction="minimize")
    study.optimize(lambda trial: call_recording_failure(trial, lambda: runner.run(
        trial, {"x": trial.suggest_int("x", 1, 10)})["val_bpb"]), n_trials=1, catch=(Infeasible,))
    detail = study.trials[0].user_attrs["failure_detail"]
    assert detail.startswith("exit 1\n") and len(detail) <= 500
    assert detail.endswith("ValueError: data file '/nonexistent' does not exist")


def test_run_failed_is_infeasible_with_reason(tmp_path):
    runner = script_runner(tmp_path, "raise SystemExit(2)")
    with pytest.raises(RunFailed) as info:
        runner.run(None, {"x": 1})
    assert isinstance(info.value, Infeasible)
    assert info.value.reason == "crash"
    assert "exit 2" in info.value.detail


def test_too_slow_uses_the_incumbents_throughput(tmp_path):
    slow = script_runner(tmp_path, "import time\nfor r in (900, 9, 8, 7):\n"
                                   "    print(f'tok/s {r}', flush=True)\ntime.sleep(60)")
    study = optuna.create_study(direction="minimize")
    study.add_trial(optuna.trial.create_trial(
        params={"x": 2}, distributions={"x": optuna.distributions.IntDistribution(1, 10)},
        value=1.0, user_attrs={"tokens_per_s": 1000.0}))

    def objective(trial: optuna.Trial) -> float:
        return slow.run(trial, {"x": trial.suggest_int("x", 1, 10)})["val_bpb"]

    study.optimize(objective, n_trials=1, catch=(Infeasible,))
    trial = study.trials[-1]
    assert trial.user_attrs[FAILURE_REASON] == "too_slow"
    assert trial.user_attrs["run:expected_throughput"] == pytest.approx(1000.0)


def test_warmup_reading_is_not_judged(tmp_path):
    # the first reading (compilation) is 100x slow; the rest are healthy
    body = "for r in (10, 900, 950):\n    print(f'tok/s {r}')\n" + textwrap.dedent(SUCCESS)
    runner = script_runner(tmp_path, body, expected_throughput=lambda config: 1000.0)
    assert runner.run(None, {"x": 2})["val_bpb"] == pytest.approx(0.5)


def test_placeholders_are_validated_against_the_params_type(tmp_path):
    runner = script_runner(tmp_path, SUCCESS)
    study = optuna.create_study()
    trial = study.ask()
    trial.suggest_int("x", 1, 10)
    with pytest.raises(TypeError, match="'x' is an int parameter"):
        runner.run(trial, {"x": "3"})
    with pytest.raises(ValueError, match="outside"):
        runner.run(trial, {"x": 11})
    with pytest.raises(KeyError, match=r"\{x\}"):
        runner.run(None, {"y": 1})
    with pytest.raises(TypeError, match="must be a str, int, float or bool"):
        runner.run(None, {"x": [1, 2]})
    trial.suggest_categorical("mode", ["a", "b"])
    with pytest.raises(ValueError, match="not one of"):
        runner.run(trial, {"x": 3, "mode": "c"})


def test_arguments_are_passed_without_a_shell(tmp_path):
    body = "import sys\nprint('val_bpb: 1')\nprint('tokens_per_s: 1')\nprint('ARGS', sys.argv[1:])"
    path = tmp_path / "echo.py"
    path.write_text(body)
    runner = CommandRunner([sys.executable, str(path), "--name={x}", "{{literal}}"],
                           metrics=METRICS, timeout=30, log_dir=tmp_path, lock=None)
    study = optuna.create_study()
    trial = study.ask()
    runner.run(trial, {"x": "a b; echo pwned"})
    log = open(study.trials[0].user_attrs["run:log"]).read()
    assert "ARGS ['--name=a b; echo pwned', '{literal}']" in log


def test_constructor_arguments_are_validated():
    with pytest.raises(TypeError, match="command"):
        CommandRunner("python train.py", metrics=METRICS, timeout=1)
    with pytest.raises(ValueError, match="exactly one group"):
        CommandRunner(["x"], metrics={"m": r"m: \S+"}, timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        CommandRunner(["x"], metrics=METRICS, timeout=0)
    with pytest.raises(ValueError, match="too_slow_fraction"):
        CommandRunner(["x"], metrics=METRICS, timeout=1, too_slow_fraction=1.5)


def test_env_template_and_artifact_upload(tmp_path):
    from optuna.artifacts import FileSystemArtifactStore

    body = "import os\nprint('val_bpb:', os.environ['JOB_X'])\nprint('tokens_per_s: 1')"
    store_dir = tmp_path / "artifacts"
    store_dir.mkdir()
    runner = script_runner(tmp_path, body, env={"JOB_X": "{x}"},
                           artifact_store=FileSystemArtifactStore(str(store_dir)))
    trial = run_in_study(runner, x=7)
    assert trial.value == 7.0
    artifact_id = trial.user_attrs["run:log_artifact_id"]
    assert (store_dir / artifact_id).read_text().startswith("val_bpb: 7")


def test_time_queued_for_the_device_lock_is_recorded(tmp_path):
    locks = tmp_path / "locks"
    trial = run_in_study(script_runner(tmp_path, SUCCESS, lock="3", lock_dir=locks,
                                       telemetry=False))
    assert trial.state == TrialState.COMPLETE
    assert trial.user_attrs["run:lock_wait_s"] >= 0.0
    assert not list(locks.glob("*.lock"))  # released after the run
    unlocked = run_in_study(script_runner(tmp_path, SUCCESS))
    assert "run:lock_wait_s" not in unlocked.user_attrs


def test_the_device_lock_names_the_job_while_it_runs(tmp_path):
    # so that the next worker ends this job should this worker die (tests/runners/test_gpu_lock)
    locks = tmp_path / "locks"
    body = (f"import os\nprint('lock:', open({str(locks / 'gpu-3.lock')!r}).read().split())\n"
            f"print('pid:', os.getpid())\n" + textwrap.dedent(SUCCESS))
    trial = run_in_study(script_runner(tmp_path, body, lock="3", lock_dir=locks,
                                       telemetry=False))
    log = Path(trial.user_attrs["run:log"]).read_text()
    pid = re.search(r"^pid: (\d+)", log, re.MULTILINE).group(1)
    assert f"'job', '{pid}'" in log


def test_a_job_that_will_not_die_fails_its_trial_instead_of_hanging_the_worker(tmp_path,
                                                                            monkeypatch):
    # a job stuck in the GPU driver (D state) outlives SIGKILL: the runner waited for it without
    # a limit, and the worker hung with its trial RUNNING, no reason recorded. A job whose kill
    # is a no-op stands in for it
    import threading

    from autoscout_optuna.runners import _command

    pid_file = tmp_path / "job.pid"
    body = (f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "print('started', flush=True)\ntime.sleep(30)")
    monkeypatch.setattr(_command, "kill_group", lambda process: None)
    monkeypatch.setattr(_command, "UNKILLABLE_WAIT_S", 0.2)
    runner = script_runner(tmp_path, body, timeout=0.5)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(run_in_study(runner)), daemon=True)
    worker.start()
    worker.join(timeout=15)
    try:
        assert not worker.is_alive(), "the worker is still waiting for the job"
        (trial,) = outcome
        assert trial.state == TrialState.FAIL
        assert trial.user_attrs[FAILURE_REASON] == "timeout"
        assert "did not exit" in trial.user_attrs["failure_detail"]
    finally:
        import os
        import signal

        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        worker.join(timeout=15)


def test_a_finished_job_whose_helper_keeps_its_output_open_is_not_a_timeout(tmp_path):
    # a compile worker or logging daemon inherits stdout and outlives the job: the run is over
    # when the job exits, not when every helper closed the pipe (that ran into the timeout)
    helper = tmp_path / "helper.pid"
    body = (f"import subprocess, sys\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(helper)!r}, 'w').write(str(p.pid))\n" + textwrap.dedent(SUCCESS))
    runner = script_runner(tmp_path, body, timeout=20)
    # the run is not a timeout: it returns the job's metric
    assert runner.run(None, {"x": 2})["val_bpb"] == pytest.approx(0.5)
    stat = Path(f"/proc/{helper.read_text()}/stat")
    for _ in range(50):  # the helper went with the job's process group (gone, or a zombie)
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the finished job's helper is still running")


def test_a_helper_that_ignores_sigterm_is_killed_with_the_job(tmp_path):
    # kill_group sent SIGKILL only while the job itself was alive: a helper of a job that had
    # exited (or exited on SIGTERM) and that ignores SIGTERM ran on, holding the GPU
    helper = tmp_path / "helper.pid"
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(60)")
    body = (f"import subprocess, sys\n"
            f"p = subprocess.Popen([sys.executable, '-c', {code!r}])\n"
            f"open({str(helper)!r}, 'w').write(str(p.pid))\n" + textwrap.dedent(SUCCESS))
    runner = script_runner(tmp_path, body, timeout=30)
    assert runner.run(None, {"x": 2})["val_bpb"] == pytest.approx(0.5)
    pid = int(helper.read_text())
    stat = Path(f"/proc/{pid}/stat")
    try:
        for _ in range(50):
            if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.1)
        else:
            pytest.fail("the helper that ignores SIGTERM outlived the job")
    finally:
        if stat.exists():
            import os
            import signal

            os.kill(pid, signal.SIGKILL)
