"""Model FLOPs utilization with the right denominator.

MFU is achieved model FLOP/s over a peak dense FLOP/s: the trainer takes the device's best
(bf16 on a GPU), so a run in a slower dtype shows its waste as a low MFU. A wrong denominator
(a sparse figure, another GPU's, fp16-accumulate rates on GeForce cards) is how MFU gets
misread, so the peak is picked from a table by the device name and the table says which figure
it uses; unknown GPUs and CPUs get a measured peak from a short matmul probe,
labeled ``"measured"``.

The arithmetic (``flops_per_token``, ``mfu``) is pure and imports nothing heavy; only
``measure_peak_flops`` and ``device_peak`` import torch, lazily.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

DTYPES = ("bf16", "fp16", "tf32", "fp32")

# Peak *dense* tensor-core FLOP/s in TFLOP/s (no 2:4 sparsity), from the vendors' datasheets.
# GeForce cards list FP16/BF16 with FP32 accumulate (what training uses), half their FP16-accumulate
# figure. None: the dtype has no fast path on that device. Order matters: the first entry whose
# every token occurs in the device name wins, so specific names come before general ones.
PEAK_TFLOPS: tuple[tuple[tuple[str, ...], dict[str, float | None]], ...] = (
    (("gh200",), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("h200", "nvl"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("h200",), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("h100", "nvl"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("h100", "pcie"), {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (("h100",), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    (("b200",), {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0}),
    (("a100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("a40",), {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4}),
    (("a10",), {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (("l40s",), {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    (("l40",), {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    (("l4",), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (("rtx", "6000", "ada"), {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1}),
    (("5090",), {"bf16": 209.5, "fp16": 209.5, "tf32": 104.8, "fp32": 104.8}),
    (("4090",), {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (("3090",), {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    (("v100",), {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7}),
    (("t4",), {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1}),
    (("mi300x",), {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
)

# Words that make a board another one than the entry it otherwise matches: laptop parts (other
# chips, lower clocks), "Ti"/"SUPER" (more SMs), "D" (China-market cuts).
VARIANT_TOKENS = ("laptop", "mobile", "max-q", "ti", "super", "d")


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak FLOP/s in one dtype, and where the number came from.

    Attributes:
        flops: Peak FLOP/s (not TFLOP/s).
        dtype: ``"bf16"``, ``"fp16"``, ``"tf32"`` or ``"fp32"``.
        source: ``"table"`` (datasheet, dense) or ``"measured"`` (matmul probe on this machine).
        device_name: The name the lookup used.
    """

    flops: float
    dtype: str
    source: str
    device_name: str


def lookup_peak(device_name: str, dtype: str) -> PeakFlops | None:
    """The datasheet peak for ``device_name`` in ``dtype``, or None when the table lacks it.

    None also for a MIG slice, whose peak is a share of the whole board's, and for a variant
    of a listed board (``VARIANT_TOKENS``: a laptop part, a Ti, a D) that no entry names.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    name = device_name.lower()
    if _has_token(name, "mig"):
        # a MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") has a fraction of the board's SMs:
        # the board's figure made its MFU read ~7x low, so a slice gets a measured peak
        return None
    variants = {token for token in VARIANT_TOKENS if _has_token(name, token)}
    for tokens, peaks in PEAK_TFLOPS:
        # "RTX 5090 Laptop GPU" holds every token of the desktop card's entry: a variant the
        # entry does not name has other SM counts or clocks, and gets a measured peak
        if all(_has_token(name, token) for token in tokens) and variants <= set(tokens):
            tflops = peaks.get(dtype)
            if tflops is None:
                return None
            return PeakFlops(tflops * 1e12, dtype, "table", device_name)
    return None


def _has_token(name: str, token: str) -> bool:
    # "a10" must not match "a100", "h200" not "gh200": the token must stand between non-alnums.
    start = name.find(token)
    while start >= 0:
        end = start + len(token)
        before_ok = start == 0 or not name[start - 1].isalnum()
        if before_ok and (end == len(name) or not name[end].isalnum()):
            return True
        start = name.find(token, start + 1)
    return False


def flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 per weight (forward + backward) plus causal attention.

    ``n_params`` excludes the embedding lookup (a gather, not a matmul); the output projection
    counts. Attention scores and values add ``12 * n_layer * n_embd * seq_len`` per token
    (PaLM appendix B), which counts the full square; causal kernels skip half of it, as the
    PaLM and nanoGPT convention also ignores.
    """
    for name, value in (("n_params", n_params), ("n_layer", n_layer), ("n_embd", n_embd),
                        ("seq_len", seq_len)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return 6.0 * n_params + 12.0 * n_layer * n_embd * seq_len


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s over peak FLOP/s (a fraction, not percent)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
    if tokens_per_s < 0 or flops_per_tok < 0:
        raise ValueError("tokens_per_s and flops_per_tok must be >= 0")
    return tokens_per_s * flops_per_tok / peak_flops


_MEASURED: dict[tuple[str, str], float] = {}


def default_cpu_threads() -> int:
    """CPU threads for torch: the cores this process may use, less those other work keeps busy.

    On an oversubscribed machine every OpenMP barrier waits for a descheduled thread: measured
    on a 2-core machine at load 11, a 1024 matmul took 40 ms with 2 threads and 4 ms with 1,
    and the tiny GPT trained at 480 tok/s with 2 threads against 6,000 with 1.
    """
    import os

    cores = len(os.sched_getaffinity(0))
    idle = cores - os.getloadavg()[0]
    return max(1, min(cores, int(idle + 0.5)))


def measure_peak_flops(device: str, dtype: str, *, size: int | None = None,
                       seconds: float = 0.5) -> float:
    """Peak matmul FLOP/s measured on ``device`` (``"cpu"``, ``"cuda"``) in ``dtype``.

    Square matmuls for about ``seconds``; the best of several timings, since a shared machine
    only ever makes a timing slower. Without ``size`` the matrices grow from 256 while one
    product is quick, so an emulated dtype (fp16 on most CPUs, ~300x slower) is measured in
    well under a second instead of stalling the run. Cached per process.
    """
    import torch

    key = (device, dtype)
    if key in _MEASURED:
        return _MEASURED[key]
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    is_cuda = device.startswith("cuda")
    largest = size or (8192 if is_cuda else 1024)
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"

    def timed(a, b, repeats: int) -> float:
        if is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if is_cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / repeats

    try:
        n = size or 256
        while True:
            a = torch.randn(n, n, device=device, dtype=torch_dtype)
            b = torch.randn(n, n, device=device, dtype=torch_dtype)
            timed(a, b, 1)  # warm-up: library start-up, allocation, kernel selection
            first = timed(a, b, 1)
            if n >= largest or first > 0.01:
                break
            n *= 2
        best = first
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            best = min(best, timed(a, b, 4 if first < 0.05 else 1))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    _MEASURED[key] = 2.0 * n**3 / best
    return _MEASURED[key]


def device_peak(device: str, dtype: str) -> PeakFlops:
    """Peak FLOP/s for ``device`` in ``dtype``: the table for known GPUs, else measured."""
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        import platform

        name = f"cpu {platform.processor() or platform.machine()}"
    found = lookup_peak(name, dtype) if device.startswith("cuda") else None
    if found is not None:
        return found
    return PeakFlops(measure_peak_flops(device, dtype), dtype, "measured", name)


def training_peak(device: str, dtype: str, *, tf32: bool = False) -> PeakFlops:
    """The MFU denominator of a training run in ``dtype``: what the device can do at its best.

    On a GPU an fp32 run scored against the fp32 peak read 79% MFU on an H200 while training
    6x slower than bf16 (benchmarks/gpu/). A CPU's fast dtype is not known by name, so each is
    measured and the fastest is the denominator: on an EPYC with avx512_bf16 an fp32 run read
    72% MFU against fp32's peak while bf16 trained 26% faster; where half precision is
    emulated (fp16 on most CPUs, ~30x slower), fp32's peak is the one its waste shows against.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:i"``.
        dtype: The run's dtype, ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        tf32: Whether fp32 matmuls run as TF32 (GPU only).
    """
    is_cuda = device.startswith("cuda")
    peak = device_peak(device, "tf32" if dtype == "fp32" and tf32 and is_cuda else dtype)
    if is_cuda:
        best = _best_gpu_peak(device)
    else:
        best = max((device_peak(device, other) for other in ("fp32", "bf16", "fp16")),
                   key=lambda candidate: candidate.flops)
    return best if best.flops > peak.flops else peak


def _best_gpu_peak(device: str) -> PeakFlops:
    """The faster of the GPU's bf16 and fp16 table peaks, measured bf16 when it has neither.

    A V100 or T4 has no bf16 entry: its fast path is fp16, while a measured (emulated) bf16
    peak is near fp32's and would let an fp32 run read as a high MFU.
    """
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    table = [peak for half in ("bf16", "fp16") if (peak := lookup_peak(name, half)) is not None]
    return max(table, key=lambda peak: peak.flops) if table else device_peak(device, "bf16")
