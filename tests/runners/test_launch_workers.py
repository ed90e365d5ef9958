"""launch_workers: one process per GPU, each pinned with CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import sys

import pytest

from autoscout_optuna.runners import launch_workers


def test_each_worker_sees_only_its_gpu(tmp_path):
    code = "import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'], 'arg', '{gpu}')"
    workers = launch_workers([sys.executable, "-c", code], gpus=[0, 3], log_dir=tmp_path)
    assert [w.wait() for w in workers] == [0, 0]
    assert (tmp_path / "worker-gpu0.log").read_text().strip() == "visible 0 arg 0"
    assert (tmp_path / "worker-gpu3.log").read_text().strip() == "visible 3 arg 3"


def test_gpu_list_is_validated():
    with pytest.raises(ValueError, match="twice"):
        launch_workers([sys.executable, "-c", "pass"], gpus=[1, 1])
    with pytest.raises(ValueError, match="gpus is empty"):
        launch_workers([sys.executable, "-c", "pass"], gpus=[])


def test_importing_the_runners_does_not_import_torch():
    import subprocess

    code = "import sys, autoscout_optuna.runners; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def test_bad_input_is_refused_before_any_worker_starts(monkeypatch):
    from autoscout_optuna.runners import _workers

    started = []
    monkeypatch.setattr(_workers.subprocess, "Popen", lambda *a, **k: started.append(a))
    # a string is a Sequence: "0,1" used to start three workers, one pinned to ","
    with pytest.raises(TypeError, match="not the string '0,1'"):
        launch_workers([sys.executable, "-c", "pass"], gpus="0,1")
    with pytest.raises(ValueError, match=r"placeholders \{seed\}.*only \{gpu\}"):
        launch_workers([sys.executable, "--seed", "{seed}", "{gpu}"], gpus=["0"])
    assert started == []


def test_literal_braces_are_written_doubled():
    code = "d = {{'a': {{'gpu': '{gpu}'}}}}; print(d)"
    (worker,) = launch_workers([sys.executable, "-c", code], gpus=["2"])
    assert worker.wait() == 0


def test_workers_already_started_are_stopped_when_a_later_one_cannot_start(tmp_path):
    (tmp_path / "worker-gpu1.log").mkdir()  # worker 1's log cannot be opened
    from autoscout_optuna.runners import _workers

    real_popen, started = _workers.subprocess.Popen, []

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    _workers.subprocess.Popen = popen
    try:
        with pytest.raises(IsADirectoryError):
            launch_workers([sys.executable, "-c", "import time; time.sleep(60)"],
                           gpus=["0", "1"], log_dir=tmp_path)
    finally:
        _workers.subprocess.Popen = real_popen
        alive = [p for p in started if p.poll() is None]
        for process in alive:
            process.kill()
            process.wait()
    assert len(started) == 1 and not alive, "worker 0 was left running with no handle"
