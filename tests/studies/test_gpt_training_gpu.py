"""The GPT-training study on a CUDA GPU: real trials, real failures, NVML telemetry.

Every test here is marked ``gpu`` and skipped without CUDA (CI has none). They run on a GPU
machine with ``pytest -m gpu`` (``scripts/gpu_session.sh`` does) and take about two minutes.
"""

from __future__ import annotations

import math

import optuna
import pytest
from autoscout_optuna.studies.gpt_training import default_params, probe_device
from optuna.trial import TrialState

from autoscout_optuna import Infeasible, studies

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_study(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    return studies.load("gpt_training", device="cuda", time_budget=4.0, timeout=150.0,
                        log_dir=str(log_dir))


def run_one(definition, params: dict):
    """One trial of ``definition`` at ``params`` (the rest drawn at random); the frozen trial."""
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(params)

    def objective(trial: optuna.Trial) -> float:
        return definition.measure_trial(trial, definition.suggest(trial))

    study.optimize(objective, n_trials=1, catch=(Infeasible,))
    return study.trials[-1]


def test_the_default_config_trains_and_records_speed_mfu_and_telemetry(gpu_study):
    trial = run_one(gpu_study, default_params(gpu_study))
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("failure_reason")
    attrs = trial.user_attrs
    assert math.isfinite(trial.value) and 0.0 < trial.value < 8.0  # bits per byte
    assert attrs["tokens_per_s"] > 0
    # MFU against the device's best (bf16) peak: a healthy eager run is a few to ~50 %
    assert 0.005 < attrs["mfu"] < 0.9
    assert attrs["peak_mem_mb"] > 100
    telemetry = attrs["run:telemetry"]
    assert telemetry["available"], telemetry
    assert telemetry["samples"] >= 2
    # NVML sees the trainer's memory (a second process): at least what torch reported
    assert telemetry["memory_used_mb_max"] >= 0.9 * attrs["peak_mem_mb"]
    assert telemetry["utilization_pct_max"] > 0
    assert attrs["run:lock_wait_s"] >= 0


def test_every_attention_backend_the_probe_offers_really_trains(tmp_path):
    offered = probe_device("cuda")["attention"]
    assert "flash" in offered  # any CUDA GPU since Ampere
    # the too_slow guard is off: this test is about each backend running, not its speed
    definition = studies.load("gpt_training", device="cuda", time_budget=3.0, timeout=150.0,
                              too_slow_fraction=0.0, log_dir=str(tmp_path))
    for backend in offered:
        params = dict(default_params(definition), attention=backend, dtype="bf16")
        trial = run_one(definition, params)
        assert trial.state == TrialState.COMPLETE, (backend, trial.user_attrs)
        assert trial.user_attrs["tokens_per_s"] > 0, backend


def test_a_real_cuda_out_of_memory_is_recorded_as_oom_and_the_study_goes_on(tmp_path):
    # a batch of 128 x 2048 tokens in fp32 through the math backend needs several times the
    # card's memory in attention scores alone; the simulator would refuse it, so the runner
    # is called directly
    definition = studies.load("gpt_training", device="cuda", time_budget=4.0, timeout=150.0,
                              log_dir=str(tmp_path))
    params = dict(default_params(definition), total_batch_log2=19, device_batch=128,
                  dtype="fp32", attention="math")
    trial = run_one(definition, params)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["failure_reason"] == "oom"
