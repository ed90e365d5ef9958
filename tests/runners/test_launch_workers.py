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
