"""Megatron-LM's theoretical memory formula, ready to hand a sampler as ``memory_estimate``.

The fastest training layouts sit at the memory wall, where the samplers' learned feasibility
models cannot tell the sides apart (``samplers/_mcts/estimate.py``). A formula can: with the
one below, calibrated on the peaks the trials report, the ``autoscout`` suite's 70B study
reaches 0.992 of the optimum in the median at 100 trials instead of 0.904, with 7.6 failed
trials per seed after trial 20 instead of 17.0 (row ``variant: memory estimate``).

The formula is Megatron-LM's theoretical memory report (``report_theoretical_memory``): 18
bytes per parameter of the first pipeline stage (bf16 weights, fp32 gradients, Adam), sharded
per ZeRO stage (Rajbhandari et al. 2020); activations ``s*b*h*(18 + 4*ffn/h)/tp`` bytes per
layer (Korthikanti et al. 2022, the sequence-parallel form with selective recomputation),
``2*s*b*h/tp`` per fully recomputed layer; ``pp`` micro-batches in flight on the first stage,
times ``1 + (pp-1)/(pp*vpp)`` when interleaved; fp32 logits where the first stage is also the
last. It leaves out allocator fragmentation, the CUDA context, NCCL buffers, gradient buckets
and CUDA-graph pools, so it reads low near the wall (26-30 % on the reference studies): the
calibration on measured peaks takes care of that, which is why the shape matters, not the
level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autoscout_optuna import _validate

BYTES_PER_GB = 1e9
# Megatron-LM's bytes per parameter (bf16 weight, fp32 gradient, Adam's two fp32 moments and
# fp32 master weight) under each ZeRO stage, as a function of the data-parallel degree.
_BYTES_PER_PARAM = {
    0: lambda dp: 18.0,
    1: lambda dp: 6 + 12 / dp,
    2: lambda dp: 2 + 16 / dp,
    3: lambda dp: 18 / dp,
}
# The formula's knobs and the value each takes when a study neither tunes nor fixes it
# (Megatron-LM's defaults); micro_batch has none: without it the formula cannot say.
KNOB_DEFAULTS: dict[str, Any] = {
    "tp": 1, "pp": 1, "vpp": 1, "zero_stage": 0, "recompute": "none", "recompute_layers": None,
}
KNOBS = (*KNOB_DEFAULTS, "micro_batch")
RECOMPUTE_MODES = ("none", "selective", "full")
_MISSING = object()


def layer_params(*, hidden: int, ffn_hidden: int, heads: int, kv_heads: int) -> int:
    """Weights of one decoder layer: Q/K/V/O projections (grouped-query attention: K and V
    for ``kv_heads`` heads), the gate/up/down SwiGLU MLP, two norms."""
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    return attention + 3 * hidden * ffn_hidden + 2 * hidden


def theoretical_memory_gb(
    *, layers: int, hidden: int, ffn_hidden: int, vocab: int, layer_params: float,
    seq_len: int, tp: int, pp: int, dp: int, vpp: int, micro_batch: int,
    num_microbatches: int, zero_stage: int, recompute: str, recompute_layers: int,
) -> float:
    """Peak memory of the first pipeline stage in GB, by Megatron-LM's theoretical report.

    ``layer_params``: the weights of one transformer layer; ``recompute_layers``: the layers
    per stage ``"full"`` recomputation applies to (``"selective"`` is the formula's baseline).
    """
    tokens = micro_batch * seq_len
    layers_stage = layers // pp
    params = (layers_stage * layer_params + vocab * hidden) / tp
    per_param = _BYTES_PER_PARAM[zero_stage](dp)
    recomputed = min(recompute_layers, layers_stage) if recompute == "full" else 0
    per_layer = tokens * hidden * (18 + 4 * ffn_hidden / hidden) / tp
    activations = (layers_stage - recomputed) * per_layer + recomputed * 2 * tokens * hidden / tp
    if vpp > 1:
        activations *= 1 + (pp - 1) / (pp * vpp)
    activations *= min(pp, num_microbatches)
    if pp == 1:
        activations += 4 * tokens * vocab / tp
    return (params * per_param + activations) / BYTES_PER_GB


def _check_fixed(fixed: Mapping[str, Any]) -> None:
    """A fixed value is used for every structure: a bad one made every call raise, which the
    samplers report once as a warning and then run without the estimate."""
    for knob in ("tp", "pp", "vpp", "micro_batch", "recompute_layers"):
        if knob in fixed and not (knob == "recompute_layers" and fixed[knob] is None):
            _validate.integers(**{knob: fixed[knob]})
            if fixed[knob] < 1:
                raise ValueError(f"fixed {knob} must be >= 1, got {fixed[knob]!r}")
    zero_stage = fixed.get("zero_stage", 0)
    if isinstance(zero_stage, bool) or zero_stage not in _BYTES_PER_PARAM:
        raise ValueError(f"fixed zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if fixed.get("recompute", "none") not in RECOMPUTE_MODES:
        raise ValueError(f"fixed recompute must be one of {RECOMPUTE_MODES}, "
                         f"got {fixed['recompute']!r}")


class MegatronMemoryEstimate:
    """A structure's theoretical peak memory over the GPU's, for ``memory_estimate``.

    Hand it to :class:`~autoscout_optuna.AutoScoutSampler` or
    :class:`~autoscout_optuna.MCTSSampler` when the job is Megatron-style 3D-parallel training
    of a decoder-only transformer (grouped-query attention, SwiGLU MLP). It is called with a
    structure's structural params and returns Megatron-LM's theoretical peak of the first
    pipeline stage over ``gpu_memory_gb``; infinity for a layout Megatron-LM refuses at launch
    (heads or layers that do not split, a batch the data-parallel degree does not divide, an
    interleaved schedule whose micro-batches the pipeline does not divide); None when a knob it
    needs is neither among the params, nor in ``fixed``, nor has a default. The samplers
    calibrate it on the peaks trials report (user attr ``memory_use``), so its level may be
    off; what it must get right is how memory moves between layouts.

    Args:
        layers: Transformer layers.
        hidden: Hidden size.
        ffn_hidden: MLP intermediate size.
        vocab: Vocabulary size (input and output embeddings untied).
        heads: Query heads.
        kv_heads: Key/value heads (grouped-query attention); None: ``heads``.
        seq_len: Tokens per sequence.
        global_batch: Sequences per optimizer step.
        num_gpus: GPUs of the job (``tp * pp * dp``).
        gpu_memory_gb: Memory of one GPU, in GB (1e9 bytes).
        param_names: The study's name for each knob it tunes, where it differs from the
            knob's: ``tp``, ``pp``, ``vpp``, ``micro_batch``, ``zero_stage``, ``recompute``
            (``"none"``, ``"selective"`` or ``"full"``) and ``recompute_layers`` (layers per
            stage that full recomputation covers; all of them when not given).
        fixed: Values of knobs the study does not tune (otherwise Megatron-LM's defaults:
            ``tp``, ``pp``, ``vpp`` 1, ``zero_stage`` 0, ``recompute`` ``"none"``).

    Example:
        >>> import optuna
        >>> from autoscout_optuna import AutoScoutSampler, MegatronMemoryEstimate
        >>> estimate = MegatronMemoryEstimate(
        ...     layers=32, hidden=4096, ffn_hidden=14336, vocab=128256, heads=32, kv_heads=8,
        ...     seq_len=8192, global_batch=512, num_gpus=64, gpu_memory_gb=80,
        ...     param_names={"tp": "tensor_parallel"}, fixed={"zero_stage": 1},
        ... )
        >>> round(estimate({"tensor_parallel": 2, "pp": 1, "micro_batch": 1}), 3)
        0.54
        >>> sampler = AutoScoutSampler(seed=0, memory_estimate=estimate)
    """

    def __init__(
        self,
        *,
        layers: int,
        hidden: int,
        ffn_hidden: int,
        vocab: int,
        heads: int,
        kv_heads: int | None = None,
        seq_len: int,
        global_batch: int,
        num_gpus: int,
        gpu_memory_gb: float,
        param_names: Mapping[str, str] | None = None,
        fixed: Mapping[str, Any] | None = None,
    ) -> None:
        kv_heads = heads if kv_heads is None else kv_heads
        shape = dict(layers=layers, hidden=hidden, ffn_hidden=ffn_hidden, vocab=vocab,
                     heads=heads, kv_heads=kv_heads, seq_len=seq_len,
                     global_batch=global_batch, num_gpus=num_gpus)
        _validate.integers(**shape)
        for name, value in shape.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        _validate.reals(gpu_memory_gb=gpu_memory_gb)
        if not 0 < gpu_memory_gb < math.inf:
            raise ValueError(f"gpu_memory_gb must be > 0 and finite, got {gpu_memory_gb}")
        names = dict(param_names or {})
        unknown = sorted((set(names) | set(fixed or {})) - set(KNOBS))
        if unknown:
            raise ValueError(f"unknown knob(s) {unknown}: the formula's knobs are {list(KNOBS)}")
        _check_fixed(dict(fixed or {}))
        self._shape = {k: int(v) for k, v in shape.items()}
        self._gpu_memory_gb = float(gpu_memory_gb)
        self._names = {knob: names.get(knob, knob) for knob in KNOBS}
        self._fixed = dict(fixed or {})
        self._layer_params = layer_params(
            hidden=hidden, ffn_hidden=ffn_hidden, heads=heads, kv_heads=kv_heads)

    def __call__(self, params: Mapping[str, Any]) -> float | None:
        knobs = {knob: self._value(params, knob) for knob in KNOBS}
        s = self._shape
        tp, pp, vpp = (int(knobs[k]) for k in ("tp", "pp", "vpp"))  # each has a default
        if (s["heads"] % tp or s["kv_heads"] % tp or s["num_gpus"] % (tp * pp)
                or s["layers"] % (pp * vpp) or (vpp > 1 and pp == 1)):
            return math.inf
        if knobs["micro_batch"] is _MISSING:
            return None
        micro_batch = int(knobs["micro_batch"])
        dp = s["num_gpus"] // (tp * pp)
        if s["global_batch"] % (micro_batch * dp):
            return math.inf
        num_microbatches = s["global_batch"] // (micro_batch * dp)
        if vpp > 1 and num_microbatches % pp:
            return math.inf
        zero_stage = int(knobs["zero_stage"])
        if zero_stage not in _BYTES_PER_PARAM:
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {knobs['zero_stage']!r}")
        recompute = knobs["recompute"]
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
        layers_stage = s["layers"] // pp
        recompute_layers = knobs["recompute_layers"]
        gb = theoretical_memory_gb(
            layers=s["layers"], hidden=s["hidden"], ffn_hidden=s["ffn_hidden"],
            vocab=s["vocab"], layer_params=self._layer_params, seq_len=s["seq_len"],
            tp=tp, pp=pp, dp=dp, vpp=vpp, micro_batch=micro_batch,
            num_microbatches=num_microbatches, zero_stage=zero_stage,
            recompute=recompute,
            recompute_layers=layers_stage if recompute_layers is None else int(recompute_layers),
        )
        return gb / self._gpu_memory_gb

    def _value(self, params: Mapping[str, Any], knob: str) -> Any:
        """The knob's value: the study's param, else the fixed value, else the default."""
        name = self._names[knob]
        if name in params:
            return params[name]
        if knob in self._fixed:
            return self._fixed[knob]
        return KNOB_DEFAULTS.get(knob, _MISSING)

    def __repr__(self) -> str:
        return (f"MegatronMemoryEstimate({self._shape}, gpu_memory_gb={self._gpu_memory_gb}, "
                f"param_names={self._names}, fixed={self._fixed})")
