"""Analytic models of vLLM-style serving on one node: goodput (req/s) under p99 SLOs.

Both models find the highest request rate the node sustains while meeting the p99 TTFT and TPOT
SLOs, by scanning the decode concurrency ``B`` of each replica (numpy, vectorized over ``B``).

Reference (plays the real benchmark):

- Memory: vLLM's budget ``gpu_memory_utilization * HBM - weights - peak activations`` (profiled
  at ``max_num_batched_tokens`` tokens plus sampler logits) goes to the KV cache; the rest of the
  GPU must hold the CUDA context, NCCL buffers and the CUDA-graph pool, else OOM at start-up.
  A KV cache smaller than one ``max_model_len`` sequence fails as vLLM does (``kv_cache_oom``).
  Paged blocks waste half a block per sequence; KV heads are replicated when ``tp > kv_heads``.
- Decode step: roofline of weight + KV reads vs FLOPs (small batches under-fill tensor cores),
  paged-attention efficiency per block size, two TP all-reduces per layer (latency-bound),
  kernel-launch overhead when eager or when the batch exceeds the largest captured CUDA graph,
  scheduler overhead per step, pipeline stages in sequence with ``pp`` virtual engines in flight.
- Speculative decoding (n-gram): expected accepted tokens ``(1 - a^(k+1)) / (1 - a)`` per step
  against ``k+1`` verified tokens of compute and a proposer cost; unsupported with ``pp > 1``.
- Prefill: compute-bound with causal attention; prefix caching skips the cached shared prefix
  (at block granularity); chunked prefill mixes ``max_num_batched_tokens - B`` prefill tokens
  into each step (bounded TPOT stalls, longer TTFT for long prompts), ``long_prefill_token_
  threshold`` caps one prompt's share of a chunk; without chunking, prefills pause all decodes.
- Tails: p99 batch ``B + 2.33 cv sqrt(B)``, prefill-stall variance, M/G/1-style prefill queueing,
  admission queueing near ``max_num_seqs`` and preemption when ``max_num_seqs`` overcommits KV.

Simulator (our coarse estimate): pure roofline decode (no launch, comm or block effects), flat
50% prefill efficiency, mean-value TPOT/TTFT (no queueing, no tails), optimistic acceptance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from autoscout_optuna._failure import Infeasible

from ._hardware import gpu_spec
from ._models import model_shape

NOISE_SIGMA = 0.03
Z99 = 2.326
# The reference scans every decode concurrency a replica can hold (one to 4,096 sequences): a
# scan of 40 log-spaced levels (24 % apart) made goodput a step function of ``max_num_seqs``,
# flat between levels and 3 % higher in a band four sequences wide where the next level just
# fit, so the serving optimum was an island no dense search could climb to (session 44).
_LOAD_LEVELS = np.arange(1.0, 4097.0)
# The simulator keeps the coarse scan: it is a cheap estimate, and its steps are part of its error.
_B_GRID = np.unique(np.round(np.geomspace(1, 4096, 40)).astype(int)).astype(float)


def _lognormal_p99(mean: float, sigma: float) -> float:
    return mean * math.exp(Z99 * sigma - sigma * sigma / 2)


def _per_gpu_bytes(c: Mapping[str, Any]) -> tuple[float, float]:
    """(weights bytes per GPU, KV bytes per token per GPU) of c's layout."""
    m = model_shape(c["model"])
    tp, pp = c["tp"], c["pp"]
    weights = 2 * m.params / (tp * pp)
    kv_heads_gpu = max(m.kv_heads / tp, 1.0)
    return weights, 2 * (m.layers / pp) * kv_heads_gpu * m.head_dim * 2


def _non_torch_bytes(c: Mapping[str, Any]) -> float:
    """What each GPU must keep outside vLLM's budget: CUDA context, NCCL and CUDA-graph pool."""
    layers, tp, pp = model_shape(c["model"]).layers, c["tp"], c["pp"]
    non_torch = 0.8e9 + (0.4e9 if tp * pp > 1 else 0.0)
    if c["cuda_graphs"]:
        non_torch += 0.5e9 + 1.5e9 * layers / pp / 80
    return non_torch


def _starts(c: Mapping[str, Any], utilization: float) -> bool:
    """Whether the reference's start-up leaves room for :func:`_non_torch_bytes`."""
    total = gpu_spec(c["gpu"]).memory_gb * 1e9
    return not total - utilization * total < _non_torch_bytes(c)


def highest_utilization(c: Mapping[str, Any]) -> float:
    """The highest ``gpu_memory_utilization`` the reference starts c's layout with (exact to the
    float: the start-up check's own rounding decides); every other knob of c aside."""
    utilization = 1 - _non_torch_bytes(c) / (gpu_spec(c["gpu"]).memory_gb * 1e9)
    while not _starts(c, utilization):
        utilization = math.nextafter(utilization, -math.inf)
    while _starts(c, math.nextafter(utilization, math.inf)):
        utilization = math.nextafter(utilization, math.inf)
    return utilization


def _kv_capacity_tokens(c: Mapping[str, Any], reference: bool) -> tuple[float, float, float]:
    """(KV tokens per replica, KV bytes per token per GPU, weights bytes per GPU)."""
    m, g = model_shape(c["model"]), gpu_spec(c["gpu"])
    tp = c["tp"]
    weights, kv_per_token = _per_gpu_bytes(c)
    total = g.memory_gb * 1e9
    budget = c["gpu_memory_utilization"] * total
    if reference:
        activations = c["max_num_batched_tokens"] * (3 * m.ffn / tp + 4 * m.hidden) * 2
        activations += c["max_num_seqs"] * m.vocab * 4
        if not _starts(c, c["gpu_memory_utilization"]):
            raise Infeasible("oom", "no room left for CUDA context, NCCL and graph pool")
    else:
        activations = 0.0
    kv_bytes = budget - weights - activations
    if kv_bytes <= 0:
        raise Infeasible("oom", "weights and activations exceed gpu_memory_utilization")
    return kv_bytes / kv_per_token, kv_per_token, weights


def kv_tokens(c: Mapping[str, Any]) -> float:
    """KV tokens per replica the reference's budget leaves (raises ``oom`` where none)."""
    return _kv_capacity_tokens(c, reference=True)[0]


def start_up(c: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """The reference up to its first request, as vLLM starts an engine: (KV tokens per replica,
    KV bytes per token per GPU, weights bytes per GPU, sequences of the mean context the KV
    holds); raises ``oom``, ``kv_cache_oom`` and ``invalid_config`` as vLLM does."""
    kv_tokens, kv_per_token, weights = _kv_capacity_tokens(c, reference=True)
    if kv_tokens < c["max_model_len"]:
        raise Infeasible("kv_cache_oom", f"{kv_tokens:.0f} KV tokens < max_model_len")
    mnbt, max_seqs = c["max_num_batched_tokens"], c["max_num_seqs"]
    if not c["chunked_prefill"] and mnbt < c["max_model_len"]:
        raise Infeasible("invalid_config", "max_num_batched_tokens < max_model_len, no chunking")
    if mnbt < max_seqs:
        raise Infeasible("invalid_config", "max_num_batched_tokens < max_num_seqs")
    context = c["prompt_mean"] + c["output_mean"] / 2
    seqs_kv = kv_tokens / (context + c["block_size"] / 2)
    if min(float(max_seqs), seqs_kv) < _LOAD_LEVELS[0]:
        raise Infeasible("kv_cache_oom", "not one sequence fits")
    return kv_tokens, kv_per_token, weights, seqs_kv


def _speculation(c: Mapping[str, Any]) -> tuple[float, float, float]:
    """(expected tokens per decode step, tokens verified per step, proposer seconds per step)."""
    if c["speculative"]:
        k, accept = c["num_speculative_tokens"], c["spec_acceptance"]
        return (1 - accept ** (k + 1)) / (1 - accept), k + 1.0, 0.3e-3
    return 1.0, 1.0, 0.0


def _decode_step(
    c: Mapping[str, Any], batch: np.ndarray, q: float, weights: float, kv_per_token: float
) -> np.ndarray:
    """Seconds of one decode step of ``batch`` sequences, ``q`` tokens each; non-decreasing in
    ``batch`` (every term grows with it, and a batch past the CUDA graphs runs eager)."""
    m, g = model_shape(c["model"]), gpu_spec(c["gpu"])
    tp, pp, block = c["tp"], c["pp"], c["block_size"]
    context = c["prompt_mean"] + c["output_mean"] / 2
    peak, hbm = g.tflops * 1e12, g.hbm_tbs * 1e12
    layers_stage = m.layers / pp
    micro = np.maximum(batch / pp, 1.0)  # pp virtual engines share the batch
    tokens = micro * q
    gemm_eff = 0.75 * tokens / (tokens + 96)
    compute = 2 * m.params / (tp * pp) * tokens / (peak * gemm_eff)
    attn_eff = {8: 0.72, 16: 0.85, 32: 0.82}.get(block, 0.8)
    memory = weights / (hbm * 0.85) + micro * context * kv_per_token / (hbm * attn_eff)
    stage = np.maximum(compute, memory) + 0.15 * np.minimum(compute, memory)
    if tp > 1:
        allreduce = 7e-6 + tokens * m.hidden * 2 * 2 / (g.nvlink_gbs * 1e9)
        stage = stage + layers_stage * 2 * allreduce
    graphed = c["cuda_graphs"] & (batch <= 512)
    stage = stage + np.where(graphed, 20e-6, layers_stage * 14 * 4.5e-6)
    step = pp * stage + (pp - 1) * 30e-6 + 1.5e-3 + 2e-6 * batch
    return step


def _prefill_token(c: Mapping[str, Any]) -> float:
    """Seconds of prefill per prompt token on one pipeline stage."""
    m, g = model_shape(c["model"]), gpu_spec(c["gpu"])
    tp, pp = c["tp"], c["pp"]
    prefill_token = (2 * m.params / (tp * pp) + 2 * c["prompt_mean"] * m.hidden / tp) / (
        g.tflops * 1e12 * 0.6)
    if tp > 1:
        prefill_token += m.layers / pp * 2 * m.hidden * 2 * 2 / (g.nvlink_gbs * 1e9) / pp
    return prefill_token


def _cacheable(c: Mapping[str, Any]) -> int:
    """Prompt tokens of the reusable prefix that fill whole KV blocks (what a hit can skip)."""
    block = c["block_size"]
    return math.floor(c["prefix_share"] * c["prompt_mean"] / block) * block


def latency_floor(c: Mapping[str, Any]) -> tuple[float, float]:
    """Lower bounds (s) on the p99 TTFT and TPOT :func:`reference_goodput` finds at any load
    level for c's structure (tp, pp, block size, CUDA graphs, speculation, chunked prefill,
    prefix caching), whatever its dense knobs (``max_num_seqs``, ``max_num_batched_tokens``,
    ``gpu_memory_utilization``, ``long_prefill_threshold``) and the workload's rate.

    Why they bound it: every load level has ``batch99 >= batch >= 1`` and the decode step is
    non-decreasing in the batch, so ``t_decode99 >= t_one`` (one sequence's step plus the
    proposer); ``1 - busy <= 1`` and stalls, queueing and admission delays are ``>= 0``, so
    ``tpot99 >= t_one / tau``. A chunked prompt takes ``iterations >= 1`` steps whose chunks
    sum to at least ``prompt_p99`` tokens, so ``ttft99 >= t_one + prompt_p99 * prefill``;
    unchunked, ``ttft99 >= t_prefill99 + t_decode99``, and a prefix hit skips at most 95 % of
    the cacheable blocks. Float rounding keeps each inequality (every step is monotone).
    """
    tau, q, proposer = _speculation(c)
    weights, kv_per_token = _per_gpu_bytes(c)
    t_one = float(_decode_step(c, _LOAD_LEVELS[:1], q, weights, kv_per_token)[0]) + proposer
    prompt = c["prompt_mean"]
    prompt_p99 = _lognormal_p99(prompt, c["prompt_sigma"])
    prefill_token = _prefill_token(c)
    if c["chunked_prefill"]:
        ttft = t_one + prompt_p99 * prefill_token
    else:
        prompt_new = prompt - (_cacheable(c) * 0.95 if c["prefix_caching"] else 0.0)
        ttft = prompt_new * (prompt_p99 / prompt) * prefill_token * c["pp"] + 5e-3 + t_one
    return ttft, t_one / tau


def reference_goodput(c: Mapping[str, Any]) -> float:
    """Noiseless reference goodput in requests/s for the whole node."""
    if c["speculative"] and c["pp"] > 1:
        raise Infeasible("invalid_combination", "speculative decoding does not support pp > 1")
    kv_tokens, kv_per_token, weights, seqs_kv = start_up(c)
    mnbt, max_seqs = c["max_num_batched_tokens"], c["max_num_seqs"]
    chunked = c["chunked_prefill"]
    prompt, output, sigma = c["prompt_mean"], c["output_mean"], c["prompt_sigma"]
    prompt_p99 = _lognormal_p99(prompt, sigma)
    context = prompt + output / 2
    cap = min(float(max_seqs), seqs_kv)
    tau, q, proposer = _speculation(c)
    prefill_token = _prefill_token(c)
    pp = c["pp"]
    batch = _LOAD_LEVELS[_LOAD_LEVELS <= cap]  # not empty: start_up checked one sequence fits
    # Prefix caching: the reusable prefix (earlier turns) survives in the KV blocks left free by
    # running sequences, so the hit rate grows with spare KV (gpu_memory_utilization).
    cached = np.zeros_like(batch)
    if c["prefix_caching"]:
        spare = np.maximum(kv_tokens - batch * context, 0.0)
        hit = 0.95 * np.minimum(1.0, spare / (256 * prompt))
        cached = _cacheable(c) * hit
    prompt_new = prompt - cached
    # Chunked prefill piggybacks prefill tokens on memory-bound decode steps.
    overlap = 0.8 if chunked else 1.0
    t_prefill = prompt_new * prefill_token * pp * overlap + 5e-3
    t_prefill99 = prompt_new * (prompt_p99 / prompt) * prefill_token * pp * overlap + 5e-3
    cv = c["arrival_cv"]
    t_decode = _decode_step(c, batch, q, weights, kv_per_token) + proposer
    rate = batch * tau / (output * t_decode + batch * tau * t_prefill)
    busy = np.minimum(rate * t_prefill, 0.99)
    batch99 = np.minimum(cap, batch + Z99 * cv * np.sqrt(batch))
    t_decode99 = _decode_step(c, batch99, q, weights, kv_per_token) + proposer
    life = output * t_decode / (tau * (1 - busy))
    if chunked:
        budget = mnbt - batch * q
        share = np.maximum(np.minimum(budget, c["long_prefill_threshold"]), 1.0)
        stable = (budget > 0) & (rate * prompt_new * t_decode / (1 - busy) <= np.maximum(budget, 1))
        chunk_time = np.maximum(budget, 0.0) * prefill_token
        stalls = Z99 * cv * np.minimum(chunk_time, t_prefill99) * np.sqrt(rate * life) / output
        tpot99 = t_decode99 / tau / (1 - busy) + stalls
        iterations = np.ceil(prompt_p99 / np.maximum(share, 1))
        own = iterations * (t_decode99 + np.minimum(share, prompt_p99) * prefill_token)
        queue = t_prefill99 * cv**2 * busy / (1 - busy) * 2.3
        queue *= np.minimum(1.0, np.sqrt(np.minimum(share, prompt_p99) / prompt_p99) + 0.3)
    else:
        stable = busy < 0.95
        stalls = Z99 * cv * t_prefill99 * np.sqrt(rate * life) / output
        tpot99 = t_decode99 / tau / (1 - busy) + stalls
        own = t_prefill99
        queue = t_prefill99 * cv**2 * busy / (1 - busy) * 2.3 + t_decode99
    use = batch / max(float(max_seqs), 1.0)
    admission = life / max_seqs * use ** math.sqrt(2 * (max_seqs + 1)) / (1 - np.minimum(use, 0.99))
    ttft99 = own + queue + admission * 2.3
    ok = stable & (ttft99 <= c["ttft_slo_ms"] / 1e3) & (tpot99 <= c["tpot_slo_ms"] / 1e3)
    if not ok.any():
        raise Infeasible("slo_miss", "no load level meets the p99 TTFT and TPOT SLOs")
    best = float(rate[ok].max())
    if max_seqs > seqs_kv:  # overcommitted KV: recompute preemptions under bursts
        best /= 1 + 0.15 * min(1.0, (max_seqs - seqs_kv) / seqs_kv)
    return best * c["replicas"]


def simulated_goodput(c: Mapping[str, Any]) -> float:
    """Coarse roofline estimate of goodput in requests/s (mean values, no tails)."""
    m, g = model_shape(c["model"]), gpu_spec(c["gpu"])
    tp, pp = c["tp"], c["pp"]
    kv_tokens, kv_per_token, weights = _kv_capacity_tokens(c, reference=False)
    if kv_tokens < c["max_model_len"]:
        raise Infeasible("kv_cache_oom", "simulator: KV cache smaller than one sequence")
    prompt, output = c["prompt_mean"], c["output_mean"]
    prompt_new = prompt * (1 - c["prefix_share"]) if c["prefix_caching"] else prompt
    context = prompt + output / 2
    cap = min(float(c["max_num_seqs"]), kv_tokens / context)
    batch = _B_GRID[_B_GRID <= cap]
    if batch.size == 0:
        raise Infeasible("kv_cache_oom", "simulator: not one sequence fits")
    hbm = g.hbm_tbs * 1e12
    t_decode = (weights + batch / pp * context * kv_per_token) / hbm * pp * 1.25 + 4e-3
    tau = 1.0
    if c["speculative"]:
        accept, k = 0.7, c["num_speculative_tokens"]
        tau = (1 - accept ** (k + 1)) / (1 - accept)
    t_prefill = prompt_new * 2 * m.params / (tp * pp) / (g.tflops * 1e12 * 0.5) * pp
    rate = batch * tau / (output * t_decode + batch * tau * t_prefill)
    busy = np.minimum(rate * t_prefill, 0.99)
    tpot = t_decode / tau / (1 - busy) * 1.5  # a flat allowance for tails
    ttft = t_prefill * (1 + 3 * busy / (1 - busy))
    ok = (tpot <= c["tpot_slo_ms"] / 1e3) & (ttft <= c["ttft_slo_ms"] / 1e3)
    if not ok.any():
        raise Infeasible("slo_miss", "simulator: SLOs missed at every load")
    return float(rate[ok].max()) * c["replicas"]
