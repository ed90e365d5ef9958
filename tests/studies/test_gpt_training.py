"""The GPT-training study on a CPU: its space, its simulator, one real trial end to end."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna import Infeasible, studies
from autoscout_optuna._objective import reference_objective
from autoscout_optuna.runners._template import render

REPO = Path(__file__).resolve().parents[2]
GPU_ONLY_KNOBS = {"compile", "tf32"}
GPU_ONLY_ATTENTION = {"flash", "cudnn", "efficient"}


@pytest.fixture(scope="module")
def cpu_study(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    return studies.load("gpt_training", device="cpu", time_budget=2.0, log_dir=str(log_dir))


def sample_space(definition, n: int = 30):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    configs = []
    for _ in range(n):
        trial = study.ask()
        configs.append(definition.suggest(trial))
        study.tell(trial, 0.0)
    return study, configs


def test_cpu_space_offers_no_gpu_only_knobs(cpu_study):
    study, configs = sample_space(cpu_study)
    params = {name for t in study.trials for name in t.params}
    assert not params & GPU_ONLY_KNOBS
    attention = study.trials[0].distributions["attention"].choices
    assert not set(attention) & GPU_ONLY_ATTENTION
    assert set(study.trials[0].distributions["dtype"].choices) == {"fp32", "bf16", "fp16"}
    for config in configs:
        assert config["compile"] == "off" and config["tf32"] is False
        # the device batch always divides the total batch; accumulation is derived
        micro = config["device_batch_effective"] * config["seq_len"]
        assert config["total_batch"] == micro * config["grad_accum"]


def test_every_total_batch_holds_a_sequence_whatever_the_model_size():
    # size="gpu" on a CPU: seq 2048 under the CPU's batch range (from 2^10) gave configs with
    # grad_accum 0 that every run of the trainer refused
    from autoscout_optuna.studies.gpt_training import SIZES, suggest_config

    from autoscout_optuna.runners.gpt import TrainConfig, validate

    info = {"kind": "cpu", "dtypes": ["fp32"], "attention": ["auto"]}
    trial = optuna.create_study().ask()
    config = suggest_config(trial, info=info, size=SIZES["gpu"], time_budget=6.0)
    assert trial.distributions["total_batch_log2"].low == 11
    for log2 in range(11, 15):
        config = suggest_config(optuna.create_study().ask(), info=info, size=SIZES["gpu"],
                                time_budget=6.0, fixed={"total_batch_log2": log2})
        assert config["grad_accum"] >= 1
        validate(TrainConfig(n_layer=config["n_layer"], n_head=config["n_head"],
                             n_embd=config["n_embd"], seq_len=config["seq_len"],
                             total_batch=config["total_batch"],
                             device_batch=config["device_batch_effective"]))


def test_a_gpu_that_only_emulates_bf16_is_not_offered_it(monkeypatch):
    # torch.cuda.is_bf16_supported() is True on a V100 (bf16 tensors can be made, emulated):
    # the study offered bf16 first, so its default config ran emulated bf16
    import torch
    from autoscout_optuna.studies import gpt_training
    from autoscout_optuna.studies._device_probe import CudaProbe

    def gpu(major, hip=False):  # what the device probe's subprocess reports
        found = CudaProbe(device="cuda", name=f"GPU sm{major}0", memory_bytes=16 * 2**30,
                          major=major, hip=hip, attention=["math"])
        return lambda device, timeout: found

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(gpt_training, "probe_cuda", gpu(7))
    assert gpt_training.probe_device("cuda")["dtypes"] == ["fp16", "fp32"]
    monkeypatch.setattr(gpt_training, "probe_cuda", gpu(8))
    assert gpt_training.probe_device("cuda")["dtypes"] == ["bf16", "fp16", "fp32"]
    monkeypatch.setattr(gpt_training, "probe_cuda", gpu(7, hip=True))  # ROCm: native bf16
    assert gpt_training.probe_device("cuda")["dtypes"] == ["bf16", "fp16", "fp32"]


def test_trainer_command_renders_from_every_config(cpu_study):
    from autoscout_optuna.studies.gpt_training import trainer_command

    study, configs = sample_space(cpu_study, n=5)
    for trial, config in zip(study.trials, configs, strict=True):
        args = render(trainer_command(), config, trial.distributions)
        assert args[args.index("--device_batch") + 1] == str(config["device_batch_effective"])
        assert args[args.index("--dtype") + 1] == config["dtype"]


def test_simulator_is_finite_and_prefers_sane_learning_rates(cpu_study):
    base = dict(cpu_study.default_config)
    value = cpu_study.simulate(base)
    assert 0 < value < 8.5
    assert cpu_study.simulate(dict(base, lr_mult=4.0)) > value
    # with the same throughput, a batch that leaves a handful of steps learns less
    huge_batch = dict(base, total_batch=2**14, total_batch_log2=14)
    assert cpu_study.simulate(huge_batch) > value


def test_simulator_predicts_oom_on_a_small_gpu():
    from autoscout_optuna.studies.gpt_training import SIZES, simulate_run

    info = {"kind": "gpu", "memory_bytes": 8 * 2**30}
    config = dict(SIZES["gpu"], time_budget=300.0, total_batch=2**19, total_batch_log2=19,
                  device_batch=128, device_batch_effective=128, dtype="bf16", tf32=False,
                  compile="off", attention="math", lr_mult=1.0, warmup_frac=0.05)
    with pytest.raises(Infeasible) as error:
        simulate_run(config, info=info, peak_flops=989e12)
    assert error.value.reason == "oom"
    fitted = simulate_run(dict(config, device_batch_effective=1, attention="flash"),
                          info=info, peak_flops=989e12)
    assert fitted["tokens_per_s"] > 0
    with pytest.raises(Infeasible, match="unsupported"):
        simulate_run(dict(config, device_batch_effective=1, attention="flash", dtype="fp32"),
                     info=info, peak_flops=67e12)


def test_simulator_predicts_a_compile_longer_than_the_timeout_allows():
    # on an H200, max-autotune compilation outlasted a 150 s slack (benchmarks/gpu/)
    from autoscout_optuna.studies.gpt_training import SIZES, simulate_run

    info = {"kind": "gpu", "memory_bytes": 140 * 2**30}
    config = dict(SIZES["gpu"], time_budget=30.0, total_batch=2**17, total_batch_log2=17,
                  device_batch=32, device_batch_effective=32, dtype="bf16", tf32=False,
                  compile="max-autotune-no-cudagraphs", attention="flash", lr_mult=1.0,
                  warmup_frac=0.05)
    with pytest.raises(Infeasible) as error:
        simulate_run(config, info=info, peak_flops=989e12, start_up_limit_s=112.5)
    assert error.value.reason == "timeout"
    # the same compile fits a longer slack, and eager mode fits the short one
    assert simulate_run(config, info=info, peak_flops=989e12,
                        start_up_limit_s=450.0)["first_step_s"] > 112.5
    eager = simulate_run(dict(config, compile="off"), info=info, peak_flops=989e12,
                         start_up_limit_s=112.5)
    assert eager["first_step_s"] < 112.5


def test_options_are_validated():
    with pytest.raises(ValueError, match="size"):
        studies.load("gpt_training", device="cpu", size="huge")
    with pytest.raises(ValueError, match="time_budget"):
        studies.load("gpt_training", device="cpu", time_budget=0)
    # a timeout no longer than the budget would kill every run; 0 is not "the default"
    for timeout in (0, 6.0):
        with pytest.raises(ValueError, match="timeout must be more than time_budget"):
            studies.load("gpt_training", device="cpu", time_budget=6.0, timeout=timeout)


def test_a_data_file_every_run_would_refuse_is_refused_at_definition(tmp_path):
    # the trainer refused it at start: every trial crashed alike until the run gave up
    with pytest.raises(ValueError, match="data file '/nonexistent/text.txt' does not exist"):
        studies.load("gpt_training", device="cpu", data="/nonexistent/text.txt")
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="has 100 bytes; need at least 4096"):
        studies.load("gpt_training", device="cpu", data=str(small))
    text = tmp_path / "text.txt"
    text.write_bytes(b"hello world " * 400)
    assert studies.load("gpt_training", device="cpu", data=str(text)).options["data"] == str(text)


@pytest.mark.slow
def test_one_real_trial_end_to_end(cpu_study):
    study = optuna.create_study(direction=cpu_study.direction)
    study.enqueue_trial({"total_batch_log2": 10, "device_batch": 4, "dtype": "fp32",
                         "optimizer": "foreach", "attention": "auto", "lr_mult": 1.0,
                         "warmup_frac": 0.05})
    study.optimize(reference_objective(cpu_study), n_trials=1, catch=(Infeasible,))
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.user_attrs
    assert 0 < trial.value < 8.5
    for key in ("tokens_per_s", "mfu", "peak_mem_mb", "first_step_s", "run:log"):
        assert key in trial.user_attrs
    # the run's peak over the device's memory, for the samplers' memory model
    assert 0 < trial.user_attrs["memory_use"] < 1
    attrs = trial.user_attrs  # the batch split the run used, derived from the params
    assert attrs["total_batch"] == 2**10 and 1 <= attrs["device_batch_effective"] <= 4
    assert 2**10 % (attrs["device_batch_effective"] * attrs["grad_accum"]) == 0


@pytest.mark.slow
def test_gpu_check_script_dry_run_writes_its_tables(tmp_path):
    out = tmp_path / "gpu"
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--minutes", "0.6",
         "--time-budget", "1", "--out", str(out), "--log-dir", str(tmp_path / "logs")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    for column in ("state", "failure_reason", "val_bpb", "tokens_per_s", "mfu", "dtype"):
        assert column in header
    assert "(dry run)" in (out / "results.md").read_text()


@pytest.mark.slow
def test_gpu_session_script_rehearses_two_workers_on_cpu(tmp_path):
    out = tmp_path / "session"
    env = dict(os.environ, PYTHON=sys.executable, DRY_RUN="1", WORKER_S="20", BUDGET_S="1",
               RUN_TIMEOUT_S="40")
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_session.sh"), str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    logs = [(out / f"worker{i}.log").read_text() for i in (1, 2)]
    # one worker queues the default config as a trial (trial 0, or the next one where the other
    # began its first trial meanwhile; a real study: that trial is its measurement, no run of
    # its own), the other skips it
    assert sum(bool(re.search(r"trial \d+ runs the default config", log))
               for log in logs) == 1, logs
    assert not any("measuring the default config" in log for log in logs), logs
    # ... while it claims it, or, when it starts later (a loaded machine), once it is queued
    skipped = ("being measured by worker", "runs as a trial of the study")
    assert sum(any(line in log for line in skipped) for log in logs) == 1, logs
    rows = (out / "results.csv").read_text().splitlines()
    header = rows[0].split(",")
    pids = {row.split(",")[header.index("worker_pid")] for row in rows[1:]}
    assert len(rows) > 2 and len(pids - {""}) == 2  # trials from both workers
    table = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    # the derived batch split of every real run is in the table, not just the params
    assert all(r["grad_accum"] and r["device_batch_effective"]
               for r in table if r["state"] == "COMPLETE")


@pytest.mark.parametrize(("fixed", "message"), [
    ({"dtpye": "fp32"}, "unknown knob(s) ['dtpye']"),
    # compile is not searched on a CPU: pinning it there asked for something the run never does.
    # It is a knob of the study, though: "unknown" sent the user looking for a typo
    ({"compile": "default"}, "fixed: compile is not searched on cpu (a GPU knob); knobs here are"),
    ({"tf32": True}, "fixed: tf32 is not searched on cpu (a knob of GPUs with TF32"),
    ({"lr_mult": 100.0}, "lr_mult must be in [0.25, 4.0]"),
    ({"device_batch": 3}, "device_batch must be one of [1, 2, 4, 8, 16]"),
    ({"dtype": "fp8"}, "dtype must be one of"),
])
def test_fixed_knobs_are_checked_against_the_device_space(tmp_path, fixed, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        studies.load("gpt_training", device="cpu", log_dir=str(tmp_path), fixed=fixed)


def test_the_space_asks_for_exactly_its_knob_domains_on_a_cpu(tmp_path):
    from _sampling import check_fixed_domains
    from autoscout_optuna.studies.gpt_training import SIZES, knob_domains, probe_device

    definition = studies.load("gpt_training", device="cpu", log_dir=str(tmp_path))
    check_fixed_domains("gpt_training", definition.suggest,
                        knob_domains(probe_device("cpu"), SIZES["cpu"]),
                        device="cpu", log_dir=str(tmp_path))


@pytest.mark.parametrize("device, visible, lock", [
    ("cuda:1", None, "1"),
    ("cuda:1", "4,5", "5"),
    ("cuda", "4,5", "4"),
    ("cpu", "0", None),
])
def test_the_runner_locks_the_gpu_the_study_trains_on(monkeypatch, device, visible, lock):
    # the runner locked the first visible GPU whatever the study's device: a worker with
    # device=cuda:1 and one pinned to GPU 1 both trained on GPU 1 under different locks, two
    # workers with cuda:0 and cuda:1 queued for one lock, and a CPU study waited for GPU 0
    from autoscout_optuna.studies import gpt_training

    from autoscout_optuna import runners

    made = {}

    class Recorder:
        def __init__(self, command, **kwargs):
            made.update(kwargs)

    info = {"kind": "gpu" if device.startswith("cuda") else "cpu", "device": device,
            "name": "GPU", "memory_bytes": 16 * 2**30, "dtypes": ["bf16"],
            "attention": ["flash"], "tf32": True}
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(gpt_training, "probe_device", lambda device: info)
    monkeypatch.setattr(runners, "CommandRunner", Recorder)
    gpt_training.definition(device=device)
    assert made["lock"] == lock


def test_each_trial_records_the_mfu_denominator_it_was_read_against():
    # a trial held its MFU but not the peak it divided by: whether 0.43 was of the right GPU's
    # bf16 dense peak was in the log only
    from autoscout_optuna.studies.gpt_training import METRICS

    from autoscout_optuna.runners.gpt import TrainResult, summary

    result = TrainResult(val_bpb=2.5, tokens_per_s=1e5, mfu=0.426, peak_mem_mb=900.0,
                         first_step_s=0.4, training_s=300.0, steps=100, tokens=10**7,
                         n_params=25 * 10**6, flops_per_token=8.9e8, peak_flops=209.5e12,
                         peak_source="table", device="cuda", diverged=False)
    block = summary(result)
    parsed = {name: float(re.search(pattern, block, re.MULTILINE).group(1))
              for name, pattern in METRICS.items()}
    assert parsed["peak_flops"] == pytest.approx(209.5e12, rel=1e-3)
    assert parsed["mfu"] == pytest.approx(0.426)


def test_the_gpu_space_can_compile_the_optimizer_step_alone():
    # the practitioner's win: an eager model with only the (fused) optimizer step compiled;
    # model compilation and the compiled step are separate knobs, and the simulator does not
    # charge the eager model a compilation
    from autoscout_optuna.studies.gpt_training import SIZES, simulate_run, suggest_config

    info = {"kind": "gpu", "dtypes": ["bf16", "fp16", "fp32"], "attention": ["flash", "math"],
            "tf32": True, "memory_bytes": 80 * 2**30}
    trial = optuna.create_study().ask()
    suggest_config(trial, info=info, size=SIZES["gpu"], time_budget=300.0)
    assert "off" in trial.distributions["compile"].choices
    assert "compiled" in trial.distributions["optimizer"].choices
    config = suggest_config(optuna.create_study().ask(), info=info, size=SIZES["gpu"],
                            time_budget=300.0, fixed={"compile": "off", "optimizer": "compiled",
                                                      # fp32 with flash is Infeasible: not random
                                                      "dtype": "bf16", "attention": "flash"})
    assert (config["compile"], config["optimizer"]) == ("off", "compiled")
    assert simulate_run(config, info=info, peak_flops=989e12,
                        start_up_limit_s=450.0)["first_step_s"] < 1.0


def test_the_default_config_carries_the_pinned_knobs(tmp_path):
    # trial 0 runs the default config with the pins (a pinned knob is never suggested): the
    # default config said fp32 while the trial ran bf16, and the gain was read against it
    plain = studies.load("gpt_training", device="cpu", log_dir=str(tmp_path))
    pinned = studies.load("gpt_training", device="cpu", log_dir=str(tmp_path),
                          fixed={"dtype": "bf16", "total_batch_log2": 12})
    assert plain.default_config["dtype"] == "fp32"
    assert pinned.default_config["dtype"] == "bf16"
    assert pinned.default_config["total_batch"] == 2**12
    assert pinned.default_config["grad_accum"] == 2**12 // (8 * 256)
    unpinned = {k: v for k, v in plain.default_config.items()
                if k not in ("dtype", "total_batch_log2", "total_batch", "grad_accum")}
    assert {k: pinned.default_config[k] for k in unpinned} == unpinned
