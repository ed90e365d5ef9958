"""vLLM-style serving of one model on one node: maximize goodput (req/s) under p99 SLOs.

The space (define-by-run, conditional):

- structural: ``tp``, ``pp`` (``tp*pp`` GPUs per replica; the node runs
  ``gpus_per_node // (tp*pp)`` replicas behind a load balancer), ``block_size``,
  ``chunked_prefill``, ``cuda_graphs`` (vs eager), ``prefix_caching``, ``speculative`` (only
  when ``pp == 1``: vLLM has no speculative decoding with pipeline parallelism) and
  ``num_speculative_tokens`` (1-6, only when speculative decoding is on);
- dense: ``max_num_seqs`` (log int), ``max_num_batched_tokens`` (log int),
  ``gpu_memory_utilization`` (float), ``long_prefill_threshold`` (log int, only with chunked
  prefill).

The objective is goodput: the highest arrival rate (requests/s, Poisson or burstier with
``arrival_cv``) whose p99 TTFT and TPOT stay within the SLOs, so the arrival rate is what the
study measures rather than an input; prompts are lognormal (``prompt_mean``, ``prompt_sigma``),
outputs average ``output_mean`` tokens, and ``prefix_share`` of each prompt is a reusable prefix.

Failures: ``invalid_layout`` (tp*pp over the node, heads not divisible), ``invalid_config``
(vLLM's own argument checks), ``oom``, ``kv_cache_oom`` (not one ``max_model_len`` sequence
fits), ``slo_miss``; ``measure`` also rejects hand-written configs with speculative decoding and
``pp > 1`` (``invalid_combination``).

Hopeless setups: where the expert config fails, ``definition`` raises a ValueError naming what to
change when every trial would fail: no tp/pp layout splits the heads within the node, the weights
alone overflow every layout, no layout starts (``oom``, ``kv_cache_oom``, ``invalid_config`` even
at the dense knobs that leave the most KV cache: highest ``gpu_memory_utilization`` the start-up
allows, fewest ``max_num_seqs`` and ``max_num_batched_tokens``; exact, through the reference's
own start-up), or no layout that starts can meet an SLO even at one request at a time (the
reference's own decode and prefill times at one sequence: a proven lower bound on its p99 TTFT
and TPOT; the presets' best sampled configs come 2-5 % above it). An SLO just above those floors
can still fail every trial (queueing and tails), and is not refused.

Models: see ``_serving_model`` (ours: published serving simulators were checked first; Vidur
needs profiled kernel tables and simulates request by request, seconds per call; GenZ
(``genz-llm``) models single prefill/decode steps through pandas operator tables and pulls
plotting stacks; neither gives p99 TTFT/TPOT goodput at < 0.2 ms per call).
"""

from __future__ import annotations

import contextlib
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

from . import _serving_model
from ._hardware import gpu_spec
from ._models import model_shape
from ._optima import stored_optimum

NAME = "llm_serving"

#: Named model/node/workload combinations; ``definition(preset=...)`` starts from one.
PRESETS: dict[str, dict[str, Any]] = {
    "70b-h100": dict(model="llama3-70b", gpu="H100", gpus_per_node=8),
    "8b-a100": dict(model="llama3-8b", gpu="A100", gpus_per_node=8),
    "14b-a40": dict(model="qwen2.5-14b", gpu="A40", gpus_per_node=8),
}
DEFAULT_PRESET = "70b-h100"
#: Workload and SLOs (chat-style: lognormal prompts, a shared system prompt, Poisson arrivals).
WORKLOAD: dict[str, Any] = dict(
    prompt_mean=1024, prompt_sigma=0.8, output_mean=256, prefix_share=0.3, arrival_cv=1.0,
    spec_acceptance=0.55, max_model_len=8192, ttft_slo_ms=2000.0, tpot_slo_ms=60.0,
)

#: The range each workload option must lie in: (low, high, whether low / high may be reached).
#: Outside them the model computes nonsense (prefix_share 1.5 above its optimum, a negative
#: prompt) or crashes mid-run (prompt_mean 0, spec_acceptance 1: ZeroDivisionError), and an
#: SLO <= 0 fails every trial as slo_miss.
WORKLOAD_RANGES: dict[str, tuple[float, float, bool, bool]] = dict(
    prompt_mean=(0.0, math.inf, False, False), prompt_sigma=(0.0, math.inf, True, False),
    output_mean=(0.0, math.inf, False, False), prefix_share=(0.0, 1.0, True, True),
    arrival_cv=(0.0, math.inf, True, False), spec_acceptance=(0.0, 1.0, True, False),
    max_model_len=(0.0, math.inf, False, False), ttft_slo_ms=(0.0, math.inf, False, False),
    tpot_slo_ms=(0.0, math.inf, False, False),
)

TP_CHOICES = [1, 2, 4, 8]
PP_CHOICES = [1, 2]
BLOCK_CHOICES = [16, 8, 32]
# vLLM defaults (EngineArgs / V1 scheduler on H100-class GPUs).
MAX_NUM_SEQS_DEFAULT = 256
MAX_BATCHED_TOKENS_DEFAULT = 8192
GPU_UTIL_DEFAULT = 0.9
LONG_PREFILL_DEFAULT = 16384  # top of the range: no per-prompt cap, as vLLM without the flag


#: The one declaration of the knobs: :func:`suggest_config` suggests each from here.
_SPACE: Mapping[str, optuna.distributions.BaseDistribution] = MappingProxyType(dict(
    tp=optuna.distributions.CategoricalDistribution(TP_CHOICES),
    pp=optuna.distributions.CategoricalDistribution(PP_CHOICES),
    speculative=optuna.distributions.CategoricalDistribution([False, True]),
    num_speculative_tokens=optuna.distributions.IntDistribution(1, 6),
    max_num_seqs=optuna.distributions.IntDistribution(8, 1024, log=True),
    max_num_batched_tokens=optuna.distributions.IntDistribution(512, 65536, log=True),
    chunked_prefill=optuna.distributions.CategoricalDistribution([True, False]),
    long_prefill_threshold=optuna.distributions.IntDistribution(64, 16384, log=True),
    block_size=optuna.distributions.CategoricalDistribution(BLOCK_CHOICES),
    gpu_memory_utilization=optuna.distributions.FloatDistribution(0.5, 0.99),
    cuda_graphs=optuna.distributions.CategoricalDistribution([True, False]),
    prefix_caching=optuna.distributions.CategoricalDistribution([True, False]),
))


def knob_domains() -> dict[str, optuna.distributions.BaseDistribution]:
    """Every knob :func:`suggest_config` may suggest and its domain (``fixed`` is checked
    against these)."""
    return dict(_SPACE)


def _check_workload(base: dict[str, Any]) -> None:
    for key, (low, high, low_ok, high_ok) in WORKLOAD_RANGES.items():
        value = base[key]
        if key == "max_model_len":
            _validate.integers(max_model_len=value)
        _validate.reals(**{key: value})
        if not ((low <= value if low_ok else low < value)
                and (value <= high if high_ok else value < high)):
            bounds = f"{'[' if low_ok else '('}{low:g}, {high:g}{']' if high_ok else ')'}"
            raise ValueError(f"{key} must be in {bounds}, got {value!r}")


def _check_any_layout(base: dict[str, Any]) -> None:
    """Raise a ValueError where no layout can exist on this node: none splits the heads within
    it, or the weights alone exceed the most memory any layout could give them."""
    shape, gpu = model_shape(base["model"]), gpu_spec(base["gpu"])
    layouts = [tp * pp for tp in TP_CHOICES for pp in PP_CHOICES
               if tp * pp <= base["gpus_per_node"] and shape.heads % tp == 0]
    where = f"{base['model']} on {base['gpus_per_node']}x {base['gpu']}"
    if not layouts:
        raise ValueError(f"no tp/pp layout of {where}: tp in {TP_CHOICES} must divide "
                         f"{shape.heads} heads and tp*pp fit the node")
    most = max(layouts)
    if 2 * shape.params / most >= 0.99 * gpu.memory_gb * 1e9:
        raise ValueError(
            f"{where} cannot run: its weights take {2 * shape.params / most / 1e9:.0f} GB per "
            f"GPU even at tp*pp={most}, over {gpu.memory_gb:.0f} GB x the highest "
            f"gpu_memory_utilization 0.99")


def _roomiest(config: dict[str, Any], free: set[str]) -> dict[str, Any]:
    """``config`` with its ``free`` dense knobs at the values that leave its layout the most KV
    cache and pass vLLM's argument checks, if any do: the KV cache grows with
    ``gpu_memory_utilization`` up to the highest one the start-up leaves room at, and shrinks
    with ``max_num_seqs`` and ``max_num_batched_tokens`` (their activations), which must still
    satisfy ``max_num_batched_tokens >= max_num_seqs`` and, without chunked prefill,
    ``>= max_model_len``. No other knob enters :func:`_serving_model.start_up`."""
    domains, config = _SPACE, dict(config)  # read, not copied: called once per structure
    if "max_num_seqs" in free:
        config["max_num_seqs"] = domains["max_num_seqs"].low
    if "max_num_batched_tokens" in free:
        dist = domains["max_num_batched_tokens"]
        needed = max(dist.low, config["max_num_seqs"],
                     config["max_model_len"] if not config["chunked_prefill"] else 0)
        config["max_num_batched_tokens"] = min(needed, dist.high)  # above: invalid_config
    if "gpu_memory_utilization" in free:
        dist = domains["gpu_memory_utilization"]
        highest = _serving_model.highest_utilization(config)
        config["gpu_memory_utilization"] = min(max(highest, dist.low), dist.high)
    return config


def _check_any_runs(base: dict[str, Any], fixed: dict[str, Any], dense_at_defaults: bool) -> None:
    """Raise a ValueError naming why where every config of the space fails: no layout exists
    (:func:`_check_any_layout`); none starts (``oom``, ``kv_cache_oom``, ``invalid_config``)
    even with its dense knobs at :func:`_roomiest`, which is exact (each start-up check is
    monotone in each dense knob); or every layout that starts has a p99 TTFT or TPOT floor
    (:func:`_serving_model.latency_floor`, a proven lower bound at any load and dense knob)
    over its SLO. A setup this passes may still fail every trial (an SLO just above the floors).
    """
    _check_any_layout(base)
    free = set() if dense_at_defaults else {
        "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"} - set(fixed)
    suggest = functools.partial(suggest_config, options=base, fixed=fixed,
                                dense_at_defaults=dense_at_defaults)
    failures: dict[str, int] = {}
    floors = []
    most_kv = 0.0
    for config in enumerate_configs(suggest, dense_points=1):
        config = _roomiest(config, free)
        try:
            _serving_model.start_up(config)
        except Infeasible as error:
            failures[error.reason] = failures.get(error.reason, 0) + 1
            with contextlib.suppress(Infeasible):
                most_kv = max(most_kv, _serving_model.kv_tokens(config))
            continue
        floors.append(_serving_model.latency_floor(config))
    where = f"{base['model']} on {base['gpus_per_node']}x {base['gpu']}"
    unfix = f" or fewer fixed knobs (fixed {sorted(fixed)})" if fixed else ""
    if not floors and not failures:
        raise ValueError(f"no tp/pp layout of {where} is valid with the fixed knobs {fixed}")
    if not floors:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(failures.items()))
        held = (f"the most KV cache any layout holds is {most_kv:.0f} tokens per replica, and "
                f"one max_model_len {base['max_model_len']} sequence must fit; lower "
                f"max_model_len or use" if most_kv > 0 else
                "weights and activations leave no KV cache at any layout; use")
        raise ValueError(
            f"no layout of {where} starts ({counts}, even with the dense knobs that leave the "
            f"most KV cache): {held} more or larger GPUs{unfix}")
    ttft_slo, tpot_slo = base["ttft_slo_ms"] / 1e3, base["tpot_slo_ms"] / 1e3
    if not any(ttft <= ttft_slo and tpot <= tpot_slo for ttft, tpot in floors):
        ttft_floor, tpot_floor = (min(values) * 1e3 for values in zip(*floors, strict=True))
        raise ValueError(
            f"no layout of {where} meets the p99 SLOs (TTFT {base['ttft_slo_ms']:g} ms, TPOT "
            f"{base['tpot_slo_ms']:g} ms) even with one request at a time: the fastest layouts "
            f"need TTFT >= {ttft_floor:.3g} ms and TPOT >= {tpot_floor:.3g} ms (not always the "
            f"same layout); raise ttft_slo_ms / tpot_slo_ms or use faster GPUs")


def suggest_config(
    trial: Any, *, options: dict[str, Any], fixed: dict[str, Any] | None = None,
    dense_at_defaults: bool = False,
) -> dict[str, Any]:
    """Suggest one serving configuration; returns params plus workload and derived values."""
    shape = model_shape(options["model"])
    knobs = Knobs(trial, space=_SPACE, fixed=fixed, dense_at_defaults=dense_at_defaults)
    tp = knobs.suggest("tp")
    pp = knobs.suggest("pp")
    if tp * pp > options["gpus_per_node"]:
        raise Infeasible("invalid_layout", f"tp*pp={tp * pp} > {options['gpus_per_node']} GPUs")
    if shape.heads % tp:
        raise Infeasible("invalid_layout", f"{shape.heads} heads do not split over tp={tp}")
    # vLLM runs speculative decoding only without pipeline parallelism: the knob exists for pp=1.
    speculative, num_speculative_tokens = False, 0
    if pp == 1:
        speculative = knobs.suggest("speculative")
        if speculative:
            num_speculative_tokens = knobs.suggest("num_speculative_tokens", default=3)
    max_num_seqs = knobs.suggest("max_num_seqs", default=MAX_NUM_SEQS_DEFAULT)
    max_num_batched_tokens = knobs.suggest(
        "max_num_batched_tokens", default=MAX_BATCHED_TOKENS_DEFAULT
    )
    chunked_prefill = knobs.suggest("chunked_prefill")
    long_prefill_threshold = LONG_PREFILL_DEFAULT
    if chunked_prefill:
        long_prefill_threshold = knobs.suggest(
            "long_prefill_threshold", default=LONG_PREFILL_DEFAULT
        )
    block_size = knobs.suggest("block_size")
    gpu_memory_utilization = knobs.suggest("gpu_memory_utilization", default=GPU_UTIL_DEFAULT)
    cuda_graphs = knobs.suggest("cuda_graphs")
    prefix_caching = knobs.suggest("prefix_caching")
    return dict(
        options, tp=tp, pp=pp, replicas=options["gpus_per_node"] // (tp * pp),
        max_num_seqs=int(max_num_seqs), max_num_batched_tokens=int(max_num_batched_tokens),
        chunked_prefill=chunked_prefill, long_prefill_threshold=int(long_prefill_threshold),
        block_size=block_size, gpu_memory_utilization=float(gpu_memory_utilization),
        cuda_graphs=cuda_graphs, prefix_caching=prefix_caching, speculative=speculative,
        num_speculative_tokens=int(num_speculative_tokens),
    )


def expert_config(options: dict[str, Any], pins: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's documented starting point for the model and node.

    Recipe: vLLM docs "Distributed inference and serving": a model that does not fit one GPU
    gets tensor parallelism over all GPUs of the node, otherwise one GPU per replica; every
    other knob at the vLLM V1 defaults (``max_num_seqs=256``, ``max_num_batched_tokens=8192``,
    chunked prefill and prefix caching on, block size 16, ``gpu_memory_utilization=0.9``,
    CUDA graphs on, no speculative decoding).
    """
    shape = model_shape(options["model"])
    fits_one_gpu = 2 * shape.params < 0.5 * gpu_spec(options["gpu"]).memory_gb * 1e9
    fixed = dict(
        tp=1 if fits_one_gpu else options["gpus_per_node"], pp=1,
        max_num_seqs=MAX_NUM_SEQS_DEFAULT, max_num_batched_tokens=MAX_BATCHED_TOKENS_DEFAULT,
        chunked_prefill=True, long_prefill_threshold=LONG_PREFILL_DEFAULT, block_size=16,
        gpu_memory_utilization=GPU_UTIL_DEFAULT, cuda_graphs=True, prefix_caching=True,
        speculative=False,
    )
    # pins (a study's fixed) override the recipe: the config a trial with those pins runs from it
    # (a knob they make the structure ask that the recipe has no value for takes its default)
    return suggest_config(None, options=options, fixed=dict(fixed, **(pins or {})))


def measure(config: dict[str, Any], rng: Any = None) -> float:
    """Reference goodput (req/s): noiseless when ``rng`` is None, else ~3% lognormal noise."""
    value = _serving_model.reference_goodput(config)
    if rng is not None:
        value *= float(rng.lognormal(0.0, _serving_model.NOISE_SIGMA))
    return value


def simulate(config: dict[str, Any]) -> float:
    """Coarse simulator estimate of goodput (req/s)."""
    return _serving_model.simulated_goodput(config)


def definition(
    *,
    preset: str | None = None,
    model: str | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    fixed: dict[str, Any] | None = None,
    dense_at_defaults: bool = False,
    **workload: Any,
) -> StudyDefinition:
    """The serving study; ``preset`` picks a row of :data:`PRESETS`; workload keys of
    :data:`WORKLOAD` (e.g. ``ttft_slo_ms=1000``) override the workload and SLOs.

    Example:
        >>> import optuna
        >>> from autoscout_optuna import Infeasible
        >>> from autoscout_optuna._objective import reference_objective
        >>> study_def = definition(preset="70b-h100")
        >>> study = optuna.create_study(direction=study_def.direction)
        >>> study.optimize(reference_objective(study_def), n_trials=5, catch=(Infeasible,))
    """
    preset = DEFAULT_PRESET if preset is None else preset
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    unknown = sorted(set(workload) - set(WORKLOAD))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; workload options are {sorted(WORKLOAD)}")
    base = dict(PRESETS[preset], **WORKLOAD)
    overrides = dict(model=model, gpu=gpu, gpus_per_node=gpus_per_node, **workload)
    base.update({k: v for k, v in overrides.items() if v is not None})
    model_shape(base["model"])
    gpu_spec(base["gpu"])
    gpus_per_node = base["gpus_per_node"]
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a positive int, got {gpus_per_node!r}")
    _check_workload(base)
    _validate.booleans(dense_at_defaults=dense_at_defaults)
    fixed = check_fixed(fixed, knob_domains())
    default_config = expert_default(
        lambda: expert_config(base, pins=fixed), measure,
        lambda: _check_any_runs(base, fixed, bool(dense_at_defaults)))
    options = dict(base, dense_at_defaults=bool(dense_at_defaults))
    if fixed:
        options["fixed"] = dict(fixed)
    # A partial of a module-level function, not a closure: the definition pickles (spawn workers).
    suggest = functools.partial(
        suggest_config, options=base, fixed=dict(fixed or {}),
        dense_at_defaults=bool(dense_at_defaults),
    )
    return StudyDefinition(
        name=NAME,
        direction="maximize",
        metric="requests/s within p99 SLOs",
        suggest=suggest,
        measure=measure,
        simulate=simulate,
        default_config=default_config,
        optimum=stored_optimum(NAME, options),
        description=(
            f"{base['model']} served on {base['gpus_per_node']}x {base['gpu']} "
            f"(p99 TTFT {base['ttft_slo_ms']:.0f} ms, TPOT {base['tpot_slo_ms']:.0f} ms)"
        ),
        options=options,
    )
