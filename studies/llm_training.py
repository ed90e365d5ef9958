"""3D-parallel LLM pre-training on a GPU cluster (Megatron-LM style): maximize tokens/s.

The space (define-by-run, conditional):

- structural: ``tp`` (tensor parallel), ``pp`` (pipeline parallel), ``micro_batch``, ``vpp``
  (virtual pipeline stages, only when ``pp > 1``), ``recompute`` (none/selective/full),
  ``sequence_parallel`` (only when ``tp > 1``), ``zero_stage`` and ``overlap_grad_reduce`` (only
  when the derived data-parallel size ``dp > 1``), ``cuda_graphs``;
- dense: ``recompute_layers`` (layers per stage recomputed, only under selective/full),
  ``bucket_size_mb`` (log, only with ``overlap_grad_reduce``), ``comm_sms`` (SMs given to NCCL).

Indivisible layouts raise ``Infeasible("invalid_layout")`` as soon as the offending choice is
made (so an enumeration prunes the whole subtree); memory overflow raises ``Infeasible("oom")``.

Two evaluators, written here (see ``_training_model``): ``measure`` is the reference playing the
real run (GEMM efficiency vs shape, flash-attention cost, exposed vs overlapped TP/PP/DP
communication, bucketed gradient reduction, SM sharing between NCCL and compute, 1F1B bubbles
with interleaving and stage imbalance from the LM head, ZeRO/recompute/SP-aware memory with
logits and fragmentation, kernel-launch overhead without CUDA graphs), with seeded multiplicative
noise; ``simulate`` is the coarse estimate (6*N*D FLOPs at a flat efficiency, exposed comm at
nominal bandwidth, crude bubble, a textbook activation formula). ``memory_estimate`` is what a
practitioner's memory formula says of a structure before it runs (Megatron-LM's theoretical
memory, ``_training_model.theoretical_memory_gb``), for the samplers' ``memory_estimate``. We
checked published models first: ``llm-analysis`` has a good memory model but its step time
ignores TP/PP/micro-batch/ZeRO communication, and it pins ``transformers<5``/
``huggingface-hub<0.15``; GenZ (``genz-llm``) is inference-only and pulls plotting stacks with
per-call pandas work; Vidur needs profiled kernel tables and simulates events (seconds per
call). None fits a reference called 10^5-10^6 times, so the reference is ours, built from the
published formulas (Narayanan et al. 2021 for the interleaved 1F1B schedule, Korthikanti et al.
2022 for activation memory, Rajbhandari et al. 2020 for ZeRO volumes).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import optuna

from autoscout_optuna import _validate
from autoscout_optuna._enumerate import enumerate_configs
from autoscout_optuna._failure import Infeasible
from autoscout_optuna._study_definition import (
    Knobs,
    StudyDefinition,
    check_fixed,
    expert_default,
)

from . import _training_model
from ._hardware import GPUS_PER_NODE, gpu_spec
from ._models import model_shape
from ._optima import stored_optimum

NAME = "llm_training"

#: Named cluster/model combinations; ``definition(preset=...)`` starts from one.
PRESETS: dict[str, dict[str, Any]] = {
    "8b-64": dict(model="llama3-8b", gpu="H100", num_gpus=64, global_batch=512, seq_len=8192),
    # 1024 x 8192 = 8M tokens per step, inside Llama 3's 4M-16M token batch schedule.
    "70b-512": dict(model="llama3-70b", gpu="H100", num_gpus=512, global_batch=1024, seq_len=8192),
    "14b-a100-128": dict(
        model="qwen2.5-14b", gpu="A100", num_gpus=128, global_batch=512, seq_len=4096
    ),
}
DEFAULT_PRESET = "8b-64"

TP_CHOICES = [1, 2, 4, 8]
PP_CHOICES = [1, 2, 4, 8, 16]
MICRO_BATCH_CHOICES = [1, 2, 4, 8]
VPP_CHOICES = [1, 2, 4, 5]
RECOMPUTE_CHOICES = ["none", "selective", "full"]
ZERO_CHOICES = [0, 1, 2, 3]
BUCKET_MB_DEFAULT = 160.0  # Megatron-LM DDP default: 40M fp32 gradient elements per bucket
COMM_SMS_DEFAULT = 16  # NCCL's usual channel count on an NVSwitch node


def knob_domains(model: str) -> dict[str, optuna.distributions.BaseDistribution]:
    """Every knob :func:`suggest_config` may suggest and its domain (``fixed`` is checked
    against these)."""
    return dict(_space(model_shape(model).layers))


@functools.cache
def _space(layers: int) -> Mapping[str, optuna.distributions.BaseDistribution]:
    """The one declaration of the knobs: :func:`suggest_config` suggests each from here (built
    once per model depth: ``suggest_config`` runs 10^5 times in an enumeration)."""
    categorical = optuna.distributions.CategoricalDistribution
    return MappingProxyType(dict(
        tp=categorical(TP_CHOICES), pp=categorical(PP_CHOICES),
        micro_batch=categorical(MICRO_BATCH_CHOICES), vpp=categorical(VPP_CHOICES),
        recompute=categorical(RECOMPUTE_CHOICES),
        recompute_layers=optuna.distributions.IntDistribution(1, layers),
        sequence_parallel=categorical([True, False]), zero_stage=categorical(ZERO_CHOICES),
        overlap_grad_reduce=categorical([True, False]),
        bucket_size_mb=optuna.distributions.FloatDistribution(4.0, 1024.0, log=True),
        comm_sms=optuna.distributions.IntDistribution(1, 64),
        cuda_graphs=categorical([False, True]),
    ))


def suggest_config(
    trial: Any,
    *,
    model: str,
    gpu: str,
    num_gpus: int,
    global_batch: int,
    seq_len: int,
    fixed: dict[str, Any] | None = None,
    dense_at_defaults: bool = False,
) -> dict[str, Any]:
    """Suggest one training configuration; returns params plus derived values (``dp`` ...)."""
    shape = model_shape(model)
    knobs = Knobs(trial, space=_space(shape.layers), fixed=fixed,
                  dense_at_defaults=dense_at_defaults)
    tp = knobs.suggest("tp")
    if shape.heads % tp or shape.kv_heads % tp:
        raise Infeasible("invalid_layout", f"{shape.kv_heads} KV heads do not split over tp={tp}")
    pp = knobs.suggest("pp")
    if num_gpus % (tp * pp):
        raise Infeasible("invalid_layout", f"tp*pp={tp * pp} does not divide {num_gpus} GPUs")
    if shape.layers % pp:
        raise Infeasible("invalid_layout", f"{shape.layers} layers do not split over pp={pp}")
    dp = num_gpus // (tp * pp)
    micro_batch = knobs.suggest("micro_batch")
    if global_batch % (micro_batch * dp):
        raise Infeasible(
            "invalid_layout", f"global batch {global_batch}, micro_batch*dp={micro_batch * dp}"
        )
    num_microbatches = global_batch // (micro_batch * dp)
    vpp = 1
    if pp > 1:
        vpp = knobs.suggest("vpp")
        if shape.layers % (pp * vpp):
            raise Infeasible("invalid_layout", f"{shape.layers} layers != k * pp*vpp={pp * vpp}")
        if vpp > 1 and num_microbatches % pp:
            # Megatron's interleaved schedule needs the microbatch count divisible by pp.
            raise Infeasible("invalid_layout", f"{num_microbatches} microbatches, pp={pp}")
    recompute = knobs.suggest("recompute")
    recompute_layers = 0
    if recompute != "none":
        recompute_layers = knobs.suggest("recompute_layers", default=shape.layers)
    sequence_parallel = False
    if tp > 1:
        sequence_parallel = knobs.suggest("sequence_parallel")
    zero_stage, overlap_grad_reduce, bucket_size_mb = 0, False, BUCKET_MB_DEFAULT
    if dp > 1:
        zero_stage = knobs.suggest("zero_stage")
        overlap_grad_reduce = knobs.suggest("overlap_grad_reduce")
        if overlap_grad_reduce:
            bucket_size_mb = knobs.suggest("bucket_size_mb", default=BUCKET_MB_DEFAULT)
    comm_sms = knobs.suggest("comm_sms", default=COMM_SMS_DEFAULT)
    cuda_graphs = knobs.suggest("cuda_graphs")
    return dict(
        model=model, gpu=gpu, num_gpus=num_gpus, global_batch=global_batch, seq_len=seq_len,
        tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, num_microbatches=num_microbatches,
        vpp=vpp, recompute=recompute, recompute_layers=recompute_layers,
        sequence_parallel=sequence_parallel, zero_stage=zero_stage,
        overlap_grad_reduce=overlap_grad_reduce, bucket_size_mb=float(bucket_size_mb),
        comm_sms=int(comm_sms), cuda_graphs=cuda_graphs,
    )


def expert_config(
    *, model: str, gpu: str, num_gpus: int, global_batch: int, seq_len: int,
    pins: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The configuration an expert would start from, as a full config.

    Recipe: NeMo 2.0 / Megatron-LM Llama-3 pre-training recipes (``llama3_8b``: TP1 PP1 CP2
    MBS1; ``llama3_70b``: TP4 PP4 VPP5 CP2 with SP; both with the distributed optimizer and
    overlapped gradient reduction, no recomputation). Our space has no context parallelism, so the
    CP=2 memory share moves to TP, keeping TP inside a node as the Megatron-LM docs advise. Other
    sizes follow the same rule of thumb: TP 2 / 4 / 8 at <12B / <30B / larger, PP only when
    weights do not fit, and VPP giving 4 layers per virtual stage.

    ``pins`` (a study's ``fixed``) override the recipe: the config a trial with those pins runs
    from it. The recipe's sequence parallelism and VPP follow a pinned TP and PP; a knob the
    pins make the structure ask that the recipe has no value for takes its default.
    """
    pins = dict(pins or {})
    shape = model_shape(model)
    params_b = shape.params / 1e9
    tp = pins.get("tp", 2 if params_b < 12 else (4 if params_b < 30 else 8))
    pp = pins.get("pp", 1 if params_b < 30 else 4)
    vpp = 1
    if pp > 1:
        vpp = max(
            (v for v in VPP_CHOICES
             if shape.layers % (pp * v) == 0 and shape.layers // (pp * v) >= 4), default=1
        )
    fixed = dict(
        tp=tp, pp=pp, micro_batch=1, recompute="none", sequence_parallel=tp > 1,
        zero_stage=1, overlap_grad_reduce=True, bucket_size_mb=BUCKET_MB_DEFAULT,
        comm_sms=COMM_SMS_DEFAULT, cuda_graphs=False,
    )
    if pp > 1:
        fixed["vpp"] = vpp
    return suggest_config(
        None, model=model, gpu=gpu, num_gpus=num_gpus, global_batch=global_batch,
        seq_len=seq_len, fixed=dict(fixed, **pins),
    )


def measure(config: dict[str, Any], rng: Any = None) -> float:
    """Reference tokens/s: noiseless when ``rng`` is None, else ~2.5% lognormal noise."""
    value = _training_model.reference_tokens_per_s(config)
    if rng is not None:
        value *= float(rng.lognormal(0.0, _training_model.NOISE_SIGMA))
    return value


def memory_use(config: dict[str, Any]) -> float:
    """Peak memory over the GPU's capacity (what a real run's peak allocation would report)."""
    return _training_model.reference_memory_gb(config) / gpu_spec(config["gpu"]).memory_gb


def memory_estimate(params: dict[str, Any], **options: Any) -> float | None:
    """The theoretical peak memory over capacity of a structure (``params``: its structural
    params, dense knobs at their defaults); infinity where the layout is invalid (Megatron-LM
    refuses it at launch), None where a param it needs is missing. ``options`` are
    :func:`suggest_config`'s study options."""
    try:
        config = suggest_config(optuna.trial.FixedTrial(dict(params)), **options,
                                dense_at_defaults=True)
    except Infeasible:
        return math.inf
    except ValueError:  # FixedTrial: a param the structure asks is not in ``params``
        return None
    return _training_model.theoretical_memory_gb(config) / gpu_spec(config["gpu"]).memory_gb


def simulate(config: dict[str, Any]) -> float:
    """Coarse simulator estimate of tokens/s."""
    return _training_model.simulated_tokens_per_s(config)


def _resolve(preset: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
    if preset is None:
        preset = DEFAULT_PRESET
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    options = dict(PRESETS[preset])
    options.update({k: v for k, v in overrides.items() if v is not None})
    model_shape(options["model"])
    gpu_spec(options["gpu"])
    for key in ("num_gpus", "global_batch", "seq_len"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {options[key]!r}")
    if options["num_gpus"] % GPUS_PER_NODE and options["num_gpus"] > GPUS_PER_NODE:
        raise ValueError(f"num_gpus must fill whole {GPUS_PER_NODE}-GPU nodes")
    return options


def _check_any_runs(base: dict[str, Any], suggest: Any) -> None:
    """Raise a ValueError naming why where no config of the space can run on this cluster."""
    # Dense knobs at their defaults are exact for that: recompute_layers defaults to every
    # layer (the least memory), comm_sms changes no memory, and overlap_grad_reduce off has no
    # buckets; where overlap is fixed on, ``suggest`` pins bucket_size_mb at the smallest
    # bucket the space offers (definition).
    failures: dict[str, int] = {}
    for config in enumerate_configs(
        functools.partial(suggest, dense_at_defaults=True), dense_points=1
    ):
        try:
            measure(config)
        except Infeasible as error:
            failures[error.reason] = failures.get(error.reason, 0) + 1
            continue
        return
    where = (f"{base['model']} on {base['num_gpus']}x {base['gpu']} (global batch "
             f"{base['global_batch']}, seq_len {base['seq_len']})")
    if not failures:
        raise ValueError(
            f"no tp/pp/micro_batch layout of {where} is valid: tp*pp must divide num_gpus "
            f"and micro_batch*dp the global batch (tp, pp, micro_batch are powers of two)")
    counts = ", ".join(f"{n} {reason}" for reason, n in sorted(failures.items()))
    raise ValueError(f"no configuration of {where} can run ({counts}): e.g. more GPUs, a "
                     f"smaller model, seq_len or other fixed knobs")


def definition(
    *,
    preset: str | None = None,
    model: str | None = None,
    gpu: str | None = None,
    num_gpus: int | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    fixed: dict[str, Any] | None = None,
    dense_at_defaults: bool = False,
) -> StudyDefinition:
    """The training study; ``preset`` picks a row of :data:`PRESETS`, other options override it.

    Example:
        >>> import optuna
        >>> from autoscout_optuna import Infeasible
        >>> from autoscout_optuna._objective import reference_objective
        >>> study_def = definition(preset="8b-64")
        >>> study = optuna.create_study(direction=study_def.direction)
        >>> study.optimize(reference_objective(study_def), n_trials=5, catch=(Infeasible,))
    """
    base = _resolve(preset, dict(model=model, gpu=gpu, num_gpus=num_gpus,
                                 global_batch=global_batch, seq_len=seq_len))
    _validate.booleans(dense_at_defaults=dense_at_defaults)
    fixed = check_fixed(fixed, knob_domains(base["model"]))
    options = dict(base, dense_at_defaults=bool(dense_at_defaults))
    if fixed:
        options["fixed"] = dict(fixed)
    # A partial of a module-level function, not a closure: the definition pickles (spawn workers).
    suggest = functools.partial(
        suggest_config, **base, fixed=dict(fixed or {}), dense_at_defaults=bool(dense_at_defaults)
    )
    # The smallest gradient buckets take the least memory: a setup that runs only with buckets
    # under the 160 MB default (overlap fixed on) was refused as hopeless.
    roomiest = {} if dense_at_defaults else {
        "bucket_size_mb": knob_domains(base["model"])["bucket_size_mb"].low}
    default_config = expert_default(
        lambda: expert_config(**base, pins=fixed), measure,
        lambda: _check_any_runs(
            base, functools.partial(suggest_config, **base, fixed=dict(roomiest, **fixed))))
    return StudyDefinition(
        name=NAME,
        direction="maximize",
        metric="tokens/s",
        suggest=suggest,
        measure=measure,
        simulate=simulate,
        memory_use=memory_use,
        memory_estimate=functools.partial(memory_estimate, **base, fixed=dict(fixed or {})),
        default_config=default_config,
        optimum=stored_optimum(NAME, options),
        description=(
            f"{base['model']} pre-training on {base['num_gpus']}x {base['gpu']} "
            f"(global batch {base['global_batch']} x {base['seq_len']} tokens)"
        ),
        options=options,
    )
