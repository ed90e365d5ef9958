"""Train a small GPT for a fixed time on the local device and minimize validation bits per byte.

The practitioner's autoresearch campaign as one study: total and per-device batch, compilation,
fused/compiled optimizer, attention backend, precision and TF32, LR multiplier and warmup.

Why val_bpb at a fixed time budget (minimize) and not tokens/s: within a fixed wall-clock budget
every speed knob matters only through what it buys in learning, and some fast settings learn
badly (a batch too large for the budget takes too few optimizer steps; the report found 2^17
tokens best and larger batches much worse). val_bpb ranks those correctly, tokens/s would not.
tokens/s, MFU (and the peak FLOP/s it is a share of), peak memory and time to first step are
recorded per trial as user attrs.

Each real trial is a subprocess (``python -m autoscout_optuna.runners.gpt``) run by
:class:`CommandRunner`, so an OOM, crash or hang fails that trial (with ``failure_reason``)
and never the study. The simulator is an analytic throughput and memory model: it predicts
OOM before a run is spent on it, and its tokens/s estimate arms the runner's ``too_slow`` guard.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from autoscout_optuna._failure import Infeasible
from autoscout_optuna._keys import MEMORY_USE
from autoscout_optuna._study_definition import Knobs, StudyDefinition, check_fixed

from ._device_probe import DEFAULT_TIMEOUT_S, DeviceProbeWarning, native_bf16, probe_cuda

NAME = "gpt_training"
VOCAB = 256
# Model sizes: tiny on CPU (seconds per trial), autoresearch's depth-8 model on a GPU.
SIZES = {
    "cpu": {"n_layer": 2, "n_head": 4, "n_embd": 128, "seq_len": 256, "eval_tokens": 2**14},
    "gpu": {"n_layer": 8, "n_head": 4, "n_embd": 512, "seq_len": 2048, "eval_tokens": 2**21},
}
DEFAULT_BUDGET_S = {"cpu": 6.0, "gpu": 300.0}
BATCH_LOG2 = {"cpu": (10, 14), "gpu": (13, 19)}
DEFAULT_BATCH_LOG2 = {"cpu": 11, "gpu": 17}  # gpu: the practitioner's best, 2^17 tokens
#: Derived from the params and recorded as user attrs of each real run.
DERIVED_BATCH_KEYS = ("total_batch", "device_batch_effective", "grad_accum")
DEFAULT_DEVICE_BATCH = {"cpu": 8, "gpu": 32}
DEVICE_BATCHES = {"cpu": [1, 2, 4, 8, 16], "gpu": [1, 2, 4, 8, 16, 32, 64, 128]}
# Share of peak FLOP/s a healthy run reaches (the device-efficiency prior). It assumes half
# precision is never slower than fp32, as on any GPU: a CPU that emulates fp16 is then
# "alive but stupid", and the runner's too_slow guard stops it.
# GPU figures as measured on one H200 (2026-11-30, benchmarks/gpu/): eager bf16 at batch 32 x
# 2048 ran at 32.4% MFU; default-mode compile with fp32 + TF32 at batch 4 x 2048 at 16.3%.
EFFICIENCY = {"cpu": 0.2, "gpu_compiled": 0.25, "gpu_eager": 0.32}
# Seconds the first step spends compiling. On the H200: default mode 33 s; max-autotune was
# still autotuning GEMMs when killed at 170 s and 180 s, so its figure is a lower bound's guess.
COMPILE_S = {"off": 0.5, "default": 35.0, "max-autotune-no-cudagraphs": 300.0}
ATTENTION_NEEDS_HALF = ("flash", "cudnn")


def probe_device(device: str = "auto", *, probe_timeout: float = DEFAULT_TIMEOUT_S,
                 ) -> dict[str, Any]:
    """What the device is and supports: kind, name, memory, dtypes, attention backends.

    A GPU is probed in a short-lived subprocess (``_device_probe``): a backend that crashes or
    hangs there is not offered, with a warning naming it and how it failed, and the study
    process keeps no CUDA context. ``attention`` is never empty: ``math`` when nothing ran.

    Raises:
        ValueError: ``device`` is none of the accepted forms, or the GPU cannot be probed
            (no CUDA device, no such index: ``DeviceProbeError`` says why).
    """
    if device != "auto" and not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        # "gpu" or "mps" silently trained on the CPU
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device == "auto":
        import torch  # is_available() starts no CUDA context

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return {"kind": "cpu", "device": "cpu", "name": "cpu", "memory_bytes": float(pages),
                "dtypes": ["fp32", "bf16", "fp16"], "attention": ["auto", "math"]}
    found = probe_cuda(device, timeout=probe_timeout)
    for name, why in found.failed.items():
        warnings.warn(f"{name} attention is not offered on {device}: {why}",
                      DeviceProbeWarning, stacklevel=2)
    attention = found.attention
    if not attention:
        # plain PyTorch ops: if it fails too, each trial fails with its reason, and the study
        # does not die here (an empty list stopped definition() with an IndexError)
        warnings.warn(f"no attention backend ran in the device probe on {device}; offering "
                      "'math' alone", DeviceProbeWarning, stacklevel=2)
        attention = ["math"]
    native = native_bf16({"major": found.major, "hip": found.hip})
    dtypes = ["bf16", "fp16", "fp32"] if native else ["fp16", "fp32"]
    return {"kind": "gpu", "device": device, "name": found.name,
            "memory_bytes": found.memory_bytes, "dtypes": dtypes,
            "attention": attention, "tf32": found.major >= 8}


def knob_domains(info: Mapping[str, Any], size: Mapping[str, int]) -> dict[str, Any]:
    """Every knob :func:`suggest_config` may suggest on ``info``'s device for a model of
    ``size``, and its domain: what ``fixed=`` is checked against, and what it suggests from."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    kind = info["kind"]
    low, high = BATCH_LOG2[kind]
    # a total batch below one sequence leaves no device batch to run (grad_accum 0), which the
    # trainer refuses: the GPU model size on a CPU (seq 2048) starts the CPU range at 2^11
    low = min(max(low, math.ceil(math.log2(size["seq_len"]))), high)
    space: dict[str, Any] = dict(
        total_batch_log2=IntDistribution(low, high),
        device_batch=CategoricalDistribution(DEVICE_BATCHES[kind]),
        dtype=CategoricalDistribution(list(info["dtypes"])),
    )
    if kind == "gpu":
        space["compile"] = CategoricalDistribution(["off", "default", "max-autotune-no-cudagraphs"])
        space["optimizer"] = CategoricalDistribution(["foreach", "fused", "compiled"])
        if info.get("tf32"):
            space["tf32"] = CategoricalDistribution([False, True])
    else:  # compiling costs more than a CPU trial's whole budget
        space["optimizer"] = CategoricalDistribution(["foreach", "fused"])
    space["attention"] = CategoricalDistribution(list(info["attention"]))
    space["lr_mult"] = FloatDistribution(0.25, 4.0, log=True)
    space["warmup_frac"] = FloatDistribution(0.0, 0.3)
    return space


def default_knobs(info: Mapping[str, Any]) -> dict[str, Any]:
    """Each knob's default on ``info``'s device: the default config's values (the first dtype
    and attention backend the device offers; ``tf32``, asked only with fp32, on)."""
    kind = info["kind"]
    knobs = dict(total_batch_log2=DEFAULT_BATCH_LOG2[kind], device_batch=DEFAULT_DEVICE_BATCH[kind],
                 dtype=info["dtypes"][0], optimizer="fused" if kind == "gpu" else "foreach",
                 attention=info["attention"][0], lr_mult=1.0, warmup_frac=0.05)
    if kind == "gpu":
        knobs.update(compile="off", tf32=True)
    return knobs


def suggest_config(trial: Any, *, info: Mapping[str, Any], size: Mapping[str, int],
                   time_budget: float, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The define-by-run space for ``info``'s device; returns params plus derived values."""
    kind, defaults = info["kind"], default_knobs(info)
    knobs = Knobs(trial, space=knob_domains(info, size), fixed=fixed)
    total_log2 = knobs.suggest("total_batch_log2", default=defaults["total_batch_log2"])
    device_batch = knobs.suggest("device_batch", default=defaults["device_batch"])
    total_batch = 2**total_log2
    # device_batch sequences must divide the total batch; both are powers of two, so the
    # largest valid value is total / seq_len: clamp there (the run records what it used)
    effective = max(1, min(device_batch, total_batch // size["seq_len"]))
    config = dict(size, time_budget=float(time_budget), total_batch_log2=total_log2,
                  total_batch=total_batch, device_batch=device_batch,
                  device_batch_effective=effective,
                  grad_accum=total_batch // (effective * size["seq_len"]))
    config["dtype"] = knobs.suggest("dtype", default=defaults["dtype"])
    config["tf32"] = False
    if kind == "gpu":
        config["compile"] = knobs.suggest("compile", default=defaults["compile"])
        config["optimizer"] = knobs.suggest("optimizer", default=defaults["optimizer"])
        if config["dtype"] == "fp32" and info.get("tf32"):
            config["tf32"] = knobs.suggest("tf32", default=defaults["tf32"])
    else:
        config["compile"] = "off"
        config["optimizer"] = knobs.suggest("optimizer", default=defaults["optimizer"])
    config["attention"] = knobs.suggest("attention", default=defaults["attention"])
    config["lr_mult"] = knobs.suggest("lr_mult", default=defaults["lr_mult"])
    config["warmup_frac"] = knobs.suggest("warmup_frac", default=defaults["warmup_frac"])
    return config


def simulate_run(config: Mapping[str, Any], *, info: Mapping[str, Any],
                 peak_flops: float, start_up_limit_s: float | None = None) -> dict[str, float]:
    """Analytic tokens/s, memory and val_bpb of ``config``; raises ``Infeasible`` on OOM.

    ``peak_flops`` is the device's peak in the run's dtype (fp32 on a CPU: see EFFICIENCY).
    ``start_up_limit_s``: seconds a run may spend before training (its timeout less the
    budget); a compile predicted to take longer is infeasible as ``timeout``.
    """
    compile_s = COMPILE_S.get(config.get("compile", "off"), 0.0)
    if start_up_limit_s is not None and compile_s > start_up_limit_s:
        raise Infeasible("timeout", f"compile {config['compile']!r} predicted to take "
                                    f"~{compile_s:g} s, over the {start_up_limit_s:g} s allowed")
    from autoscout_optuna.runners._mfu import flops_per_token

    n_layer, d, seq = config["n_layer"], config["n_embd"], config["seq_len"]
    matmul_params = 12 * n_layer * d * d + d * VOCAB
    flops_tok = flops_per_token(matmul_params, n_layer, d, seq)
    if info["kind"] == "cpu":
        efficiency = EFFICIENCY["cpu"]
    else:
        efficiency = EFFICIENCY["gpu_compiled" if config["compile"] != "off" else "gpu_eager"]
        if config["attention"] in ATTENTION_NEEDS_HALF and config["dtype"] == "fp32":
            raise Infeasible("unsupported", f"{config['attention']} attention needs bf16/fp16")
    micro_tokens = config["device_batch_effective"] * seq
    efficiency *= min(1.0, micro_tokens / (16 * seq if info["kind"] == "gpu" else 1024)) ** 0.3
    tokens_per_s = peak_flops * efficiency / flops_tok
    # memory: fp32 weights, grads and two Adam moments (16 bytes/param) plus saved activations
    act_bytes = 2 if config["dtype"] in ("bf16", "fp16") else 4
    per_token = n_layer * 16 * d * act_bytes + 3 * VOCAB * 4
    if config["attention"] == "math":  # the full score matrix is kept for the backward pass
        per_token += n_layer * config["n_head"] * seq * act_bytes * 2
    all_params = matmul_params + (VOCAB + seq) * d
    memory = 16 * all_params + micro_tokens * per_token
    if memory > 0.9 * info["memory_bytes"]:
        raise Infeasible("oom", f"predicted {memory / 2**30:.1f} GiB of "
                                f"{info['memory_bytes'] / 2**30:.1f} GiB")
    # learning, fitted coarsely to CPU runs: from 8 bits (uniform) towards a size-dependent
    # floor; the first few optimizer steps learn the byte frequencies, then progress is a slow
    # power law in tokens seen. A batch too large for the budget leaves too few steps.
    tokens = tokens_per_s * config["time_budget"]
    steps = tokens / config["total_batch"]
    floor = 1.0 + 0.5 * (1e7 / max(all_params, 1.0)) ** 0.25
    # beyond a critical batch a token buys less (McCandlish et al. 2018): 2^17 on the GPU size
    critical = 2.0**17 if seq >= 1024 else 2.0**12
    useful = tokens / (1.0 + config["total_batch"] / critical)
    remaining = 0.35 * max(useful / 1e5, 1e-3) ** -0.12
    remaining = min(1.0, remaining + (1.0 - remaining) * math.exp(-steps / 6.0))
    bpb = (floor + (8.0 - floor) * remaining
           + 0.3 * math.log(config["lr_mult"]) ** 2 + 0.5 * config["warmup_frac"] ** 2)
    return {"tokens_per_s": tokens_per_s, "memory_bytes": float(memory), "val_bpb": bpb,
            "first_step_s": compile_s}


# The knobs ``suggest_config`` asks for, in the default config's keys (``tf32`` is asked only
# for fp32: a default config pinned to fp32 queues its TF32 too).
SEARCHED_KNOBS = ("total_batch_log2", "device_batch", "dtype", "compile", "optimizer",
                  "tf32", "attention", "lr_mult", "warmup_frac")


def default_params(study_def: StudyDefinition) -> dict[str, Any]:
    """The default config as trial params, for ``study.enqueue_trial`` (the rest of the config
    is derived or fixed). A knob the trial never asks, like ``compile`` on a CPU or ``tf32``
    with bf16, may be among them: Optuna ignores a queued param nothing suggests."""
    config = study_def.default_config or {}
    return {name: config[name] for name in SEARCHED_KNOBS if name in config}


# Knobs some devices do not search, and which devices do.
_DEVICE_KNOBS = {"compile": "a GPU knob", "tf32": "a knob of GPUs with TF32, Ampere and newer"}


def _check_pins_this_device_searches(
    fixed: Mapping[str, Any] | None, domains: Mapping[str, Any], kind: str
) -> None:
    """Raise a ValueError naming a pinned knob of the study that ``domains`` (this device's
    space) lacks: ``check_fixed`` would call it unknown, and send the user looking for a typo."""
    pinned = set(fixed) if isinstance(fixed, Mapping) else set()
    absent = sorted(k for k in pinned - set(domains) if k in _DEVICE_KNOBS)
    if absent:
        why = "; ".join(f"{k} is not searched on {kind} ({_DEVICE_KNOBS[k]})" for k in absent)
        raise ValueError(f"fixed: {why}; knobs here are {sorted(domains)}")


def trainer_command(python: str = sys.executable, data: str | None = None) -> list[str]:
    """The trainer's argument list with ``{placeholders}`` for :class:`CommandRunner`."""
    keys = {"time_budget": "time_budget", "n_layer": "n_layer", "n_head": "n_head",
            "n_embd": "n_embd", "seq_len": "seq_len", "total_batch": "total_batch",
            "device_batch": "device_batch_effective", "dtype": "dtype", "tf32": "tf32",
            "attention": "attention", "compile": "compile", "optimizer": "optimizer",
            "lr_mult": "lr_mult", "warmup_frac": "warmup_frac", "device": "device",
            "eval_tokens": "eval_tokens"}
    command = [python, "-m", "autoscout_optuna.runners.gpt"]
    for flag, key in keys.items():
        command += [f"--{flag}", f"{{{key}}}"]
    if data is not None:
        command += ["--data", data]
    return command


# peak_flops: MFU's denominator (picked by GPU model, dtype, MIG slice), so a trial shows what
# its MFU is a share of
METRICS = {name: rf"^{name}:\s*([-+0-9.eE]+|nan|inf)" for name in
           ("val_bpb", "tokens_per_s", "mfu", "peak_mem_mb", "first_step_s", "peak_flops")}


def definition(*, device: str = "auto", time_budget: float | None = None,
               size: str | None = None, data: str | None = None, timeout: float | None = None,
               too_slow_fraction: float = 0.1, log_dir: str = "autoscout-logs",
               fixed: Mapping[str, Any] | None = None, n_trials: int | None = None,
               ) -> StudyDefinition:
    """The GPT-training study on the local device.

    Example:
        >>> import optuna
        >>> from autoscout_optuna import Infeasible, studies
        >>> from autoscout_optuna._objective import reference_objective
        >>> study_def = studies.load("gpt_training", device="cpu", time_budget=3.0)
        >>> study = optuna.create_study(direction=study_def.direction)
        >>> study.optimize(reference_objective(study_def), n_trials=2, catch=(Infeasible,))
        >>> study.best_trial.user_attrs["tokens_per_s"] > 0
        True

    Args:
        device: ``"auto"`` (the GPU if torch sees one), ``"cpu"`` or ``"cuda[:i]"``.
        time_budget: Seconds of training per trial (default 6 on CPU, 300 on GPU).
        size: ``"cpu"`` (2 layers, width 128, seq 256) or ``"gpu"`` (8 x 512, seq 2048);
            default: the device's kind.
        data: A text file to train on instead of the Python standard library's source.
        timeout: Seconds before a run is killed (default: budget x 3 + 90 s on CPU, budget +
            600 s on GPU, where compilation can take minutes).
        too_slow_fraction: The runner's too_slow threshold (0 disables it).
        log_dir: Where per-trial logs go.
        fixed: Knobs pinned to values (not searched).
        n_trials: Default number of trials for ``autoscout run``.
    """
    from autoscout_optuna.runners import CommandRunner
    from autoscout_optuna.runners._data import check_data_file
    from autoscout_optuna.runners._mfu import default_cpu_threads, device_peak
    from autoscout_optuna.runners._process import resolve_lock_name

    if data is not None:  # the trainer refuses it at start: every trial would crash alike
        check_data_file(data)
    info = probe_device(device)
    kind = info["kind"]
    if size is not None and size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    model = SIZES[size or kind]
    # a typo (dtpye=...) was ignored and the knob searched; a value off its domain, or a knob
    # this device does not search (compile on a CPU), ran something else than was asked
    domains = knob_domains(info, model)
    _check_pins_this_device_searches(fixed, domains, kind)
    fixed_copy = check_fixed(fixed, domains)
    budget = float(time_budget if time_budget is not None else DEFAULT_BUDGET_S[kind])
    if budget <= 0:
        raise ValueError(f"time_budget must be > 0, got {time_budget}")
    if timeout is not None and not timeout > budget:
        # every run would be killed before its budget is spent: each trial a timeout
        raise ValueError(f"timeout must be more than time_budget ({budget:g} s), got {timeout}")
    run_timeout = timeout if timeout is not None else (
        3 * budget + 90 if kind == "cpu" else budget + 600)
    peaks: dict[str, float] = {}

    def peak(dtype: str) -> float:  # measured once per process on CPU and unknown GPUs
        key = "fp32" if kind == "cpu" else dtype
        if key not in peaks:
            if kind == "cpu":  # measure with the thread count the trainer will use
                import torch

                torch.set_num_threads(default_cpu_threads())
            peaks[key] = device_peak(info["device"], key).flops
        return peaks[key]

    def suggest(trial: Any) -> dict[str, Any]:
        config = suggest_config(trial, info=info, size=model, time_budget=budget,
                                fixed=fixed_copy)
        config["device"] = info["device"]
        return config

    def simulate_all(config: Mapping[str, Any]) -> dict[str, float]:
        dtype = "tf32" if config.get("tf32") else config["dtype"]
        # evaluation and process start-up need some of the slack too: a quarter of it
        return simulate_run(config, info=info, peak_flops=peak(dtype),
                            start_up_limit_s=0.75 * (run_timeout - budget))

    def expected_tokens_per_s(config: Mapping[str, Any]) -> float | None:
        try:
            return simulate_all(config)["tokens_per_s"]
        except Infeasible:
            return None

    runner = CommandRunner(
        trainer_command(data=data), metrics=METRICS, timeout=run_timeout, log_dir=log_dir,
        expected_throughput=expected_tokens_per_s, too_slow_fraction=too_slow_fraction,
        warmup_readings=1 if kind == "cpu" else 2,
        # the GPU this study trains on (cuda:1 is the second visible one), none on a CPU
        lock=resolve_lock_name(info["device"]),
    )

    def measure(config: Mapping[str, Any], rng: Any = None) -> float:
        return runner.run(None, config)["val_bpb"]

    def measure_trial(trial: Any, config: Mapping[str, Any]) -> float:
        # The batch split the run uses is derived (a device batch too large for the total is
        # clamped); params alone do not show it, the dashboard and session tables should.
        for key in DERIVED_BATCH_KEYS:
            trial.set_user_attr(key, config[key])
        metrics = runner.run(trial, config)
        # the peak over the device's memory: the samplers learn from it what will not fit
        peak_bytes = metrics.get("peak_mem_mb", math.nan) * 2**20
        if math.isfinite(peak_bytes) and peak_bytes > 0:
            trial.set_user_attr(MEMORY_USE, peak_bytes / info["memory_bytes"])
        return metrics["val_bpb"]

    # The default config with the user's pins: what trial 0 runs (a pinned knob is not
    # suggested, so the queued default's own value of it would never run) and the gain's base.
    default = suggest_config(None, info=info, size=model, time_budget=budget,
                             fixed=dict(default_knobs(info), **fixed_copy))
    default["device"] = info["device"]
    return StudyDefinition(
        name=NAME,
        direction="minimize",
        metric="val bits/byte",
        suggest=suggest,
        measure=measure,
        measure_trial=measure_trial,
        simulate=lambda config: simulate_all(config)["val_bpb"],
        default_config=default,
        is_real=True,
        description=f"small GPT on {info['name']}: val bits/byte after {budget:g} s of training",
        options={"device": info["device"], "device_name": info["name"], "time_budget": budget,
                 "size": size or kind, "data": data, "timeout": run_timeout,
                 "n_trials": n_trials or (12 if kind == "cpu" else 20),
                 **({"fixed": dict(fixed_copy)} if fixed_copy else {})},
    )
