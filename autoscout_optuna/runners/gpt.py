"""A small GPT trained for a fixed time budget, in the nanoGPT / autoresearch manner.

Reads top to bottom: the knobs in one block, then data, model, optimizer, the timed training
loop, evaluation in validation bits per byte, and a grep-able summary block::

    python -m autoscout_optuna.runners.gpt --time_budget 8 --dtype bf16
    ...
    ---
    val_bpb:          2.103456
    tokens_per_s:     41234.5
    mfu:              0.0712
    peak_mem_mb:      612.3
    first_step_s:     0.41

Or from Python: ``train(TrainConfig(time_budget=8)) -> TrainResult``.

The time budget counts training steps after the first one; the first step (which pays for
``torch.compile``) is timed apart as ``first_step_s``. Bytes are the tokens, so the mean
cross-entropy in bits is exactly bits per byte. A non-finite loss stops the run, prints
``loss nan`` and exits with status 3.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields

# ----------------------------------------------------------------------------------------------
# Config: every knob, in one block. The model size defaults are the CPU size; the GPT study
# passes the GPU size (8 layers, width 512, sequence 2048) on a GPU.


@dataclass
class TrainConfig:
    data: str | None = None  # a text file; None: the Python standard library's source
    device: str = "auto"  # "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1"
    seed: int = 0
    time_budget: float = 8.0  # seconds of training after the first step
    threads: int = 0  # CPU threads for torch; 0: the idle cores this process may use
    # model
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    seq_len: int = 256
    # batch: total_batch tokens per optimizer step, device_batch sequences per micro-step
    total_batch: int = 2**12
    device_batch: int = 8
    # speed knobs
    dtype: str = "fp32"  # "fp32", "bf16", "fp16" (autocast; fp16 with a gradient scaler)
    tf32: bool = False  # TF32 matmuls for fp32 work (CUDA Ampere+)
    attention: str = "auto"  # "auto", "math", "flash", "efficient", "cudnn" (SDPA backends)
    compile: str = "off"  # "off", "default", "reduce-overhead", "max-autotune", ...
    optimizer: str = "foreach"  # "foreach", "fused", "compiled" (torch.compile of the step)
    # learning
    lr: float = 2e-3
    lr_mult: float = 1.0
    warmup_frac: float = 0.05  # fraction of the time budget spent warming the LR up
    cooldown_frac: float = 0.3  # final fraction decaying the LR linearly to 10%
    weight_decay: float = 0.1
    # evaluation and logging
    eval_tokens: int = 2**16
    log_interval_s: float = 1.0
    max_steps: int = 0  # 0: no limit besides the time budget (tests use a step cap)


@dataclass(frozen=True)
class TrainResult:
    val_bpb: float
    tokens_per_s: float
    mfu: float
    peak_mem_mb: float
    first_step_s: float
    training_s: float
    steps: int
    tokens: int
    n_params: int
    flops_per_token: float
    peak_flops: float
    peak_source: str
    device: str
    diverged: bool


DTYPES = ("fp32", "bf16", "fp16")
ATTENTION = ("auto", "math", "flash", "efficient", "cudnn")
OPTIMIZERS = ("foreach", "fused", "compiled")


def validate(cfg: TrainConfig) -> None:
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {cfg.dtype!r}")
    if cfg.attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {cfg.attention!r}")
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {cfg.optimizer!r}")
    if cfg.n_embd % cfg.n_head:
        raise ValueError(f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    micro = cfg.device_batch * cfg.seq_len
    if cfg.device_batch < 1 or cfg.total_batch % micro:
        raise ValueError(
            f"total_batch ({cfg.total_batch}) must be a multiple of device_batch * seq_len "
            f"({cfg.device_batch} * {cfg.seq_len})"
        )
    if cfg.time_budget <= 0:
        raise ValueError(f"time_budget must be > 0, got {cfg.time_budget}")


def check_corpus(cfg: TrainConfig, train_bytes: int, val_bytes: int) -> None:
    """Raise ``ValueError`` unless each split holds a window of ``seq_len + 1`` bytes.

    Checked before training: a validation split shorter than one window otherwise failed
    indexing only in the evaluation, after the whole budget was spent (on a GPU, as a
    device-side assert that names neither the data nor ``seq_len``).
    """
    source = repr(cfg.data) if cfg.data else "the standard-library corpus"
    for split, size, need in (("training", train_bytes, cfg.seq_len + 2),
                              ("validation", val_bytes, cfg.seq_len + 1)):
        if size < need:
            raise ValueError(f"the {split} split of {source} has {size} bytes, fewer than "
                             f"seq_len + {need - cfg.seq_len} ({need}): use more text or a "
                             f"shorter seq_len")


# ----------------------------------------------------------------------------------------------
# Model: pre-norm transformer, learned positions, SDPA attention, byte vocabulary.

VOCAB = 256


def build_model(cfg: TrainConfig):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(cfg.n_embd, bias=False)
            self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
            self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
            self.norm2 = nn.LayerNorm(cfg.n_embd, bias=False)
            self.up = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
            self.down = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, cfg.n_head, c // cfg.n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, cfg.n_embd)
            self.pos = nn.Embedding(cfg.seq_len, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.norm = nn.LayerNorm(cfg.n_embd, bias=False)
            self.head = nn.Linear(cfg.n_embd, VOCAB, bias=False)
            residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # so depth does not blow up
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    is_residual = name.endswith(("proj.weight", "down.weight"))
                    nn.init.normal_(p, std=residual_std if is_residual else 0.02)

        def forward(self, idx, targets):
            positions = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(positions)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.norm(x)).float()
            return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))

    return GPT()


def matmul_params(model) -> int:
    """Weights that take part in matmuls (embedding lookups are gathers and do not count)."""
    return sum(p.numel() for n, p in model.named_parameters()
               if p.dim() == 2 and not n.startswith(("tok.", "pos.", "_orig_mod.tok.",
                                                     "_orig_mod.pos.")))


def attention_context(kind: str):
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    return contextlib.nullcontext() if kind == "auto" else sdpa_kernel(backends[kind])


# ----------------------------------------------------------------------------------------------
# Training: fixed wall-clock budget, LR schedule by elapsed fraction, progress lines to stdout.


def train(cfg: TrainConfig, *, out=None) -> TrainResult:
    """Train ``cfg`` for ``cfg.time_budget`` seconds and evaluate; prints progress to ``out``."""
    import contextlib

    import torch

    from autoscout_optuna.runners._data import load_corpus
    from autoscout_optuna.runners._mfu import (
        default_cpu_threads,
        flops_per_token,
        mfu,
        training_peak,
    )

    out = out or sys.stdout
    validate(cfg)
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    is_cuda = device.startswith("cuda")
    torch.set_num_threads(cfg.threads or default_cpu_threads())
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    print(f"config: {json.dumps(asdict(cfg) | {'device': device})}", file=out, flush=True)

    # data: random windows of the training bytes, fixed windows of the validation bytes
    corpus = load_corpus(cfg.data)
    check_corpus(cfg, len(corpus.train), len(corpus.val))
    train_data = torch.from_numpy(corpus.train.copy()).to(device)
    val_data = torch.from_numpy(corpus.val.copy()).to(device)
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    offsets = torch.arange(cfg.seq_len + 1, device=device)

    def batch(n: int):
        starts = torch.randint(0, len(train_data) - cfg.seq_len - 1, (n,), generator=gen)
        window = train_data[starts.to(device)[:, None] + offsets].long()
        return window[:, :-1], window[:, 1:]

    # model, precision, optimizer
    model = build_model(cfg).to(device)
    n_params = matmul_params(model)
    flops_tok = flops_per_token(n_params, cfg.n_layer, cfg.n_embd, cfg.seq_len)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.dtype)
    autocast = (torch.autocast(device_type="cuda" if is_cuda else "cpu", dtype=amp_dtype)
                if amp_dtype else contextlib.nullcontext())
    scaler = torch.amp.GradScaler(enabled=cfg.dtype == "fp16" and is_cuda)
    if cfg.compile != "off":
        model = torch.compile(model, mode=None if cfg.compile == "default" else cfg.compile)
    peak = training_peak(device, cfg.dtype, tf32=cfg.tf32)
    base_lr = cfg.lr * cfg.lr_mult
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "compiled":  # a tensor LR, so changing it does not recompile the step
        optimizer = torch.optim.AdamW(groups, lr=torch.tensor(base_lr), betas=(0.9, 0.95))
        step_fn = torch.compile(optimizer.step)
    else:
        optimizer = torch.optim.AdamW(groups, lr=base_lr, betas=(0.9, 0.95),
                                      fused=cfg.optimizer == "fused",
                                      foreach=None if cfg.optimizer == "fused" else True)
        step_fn = optimizer.step
    accum = cfg.total_batch // (cfg.device_batch * cfg.seq_len)

    def lr_at(progress: float) -> float:
        if progress < cfg.warmup_frac:
            return base_lr * (progress + 1e-3) / cfg.warmup_frac
        if progress > 1.0 - cfg.cooldown_frac:
            return base_lr * (0.1 + 0.9 * (1.0 - progress) / cfg.cooldown_frac)
        return base_lr

    def sync() -> None:
        if is_cuda:
            torch.cuda.synchronize()

    # the timed loop: step 1 pays for compilation and is timed apart. A progress line at most
    # every log_interval_s, also between micro-steps, so a slow run shows it within seconds
    step, diverged, loss_value = 0, False, float("nan")
    start = time.perf_counter()
    train_start = log_time = start
    first_step_s = training_s = 0.0
    seen = log_seen = 0  # tokens processed, and at the last progress line

    def progress_line(label: str, loss_now: float, now: float, tail: str) -> None:
        nonlocal log_time, log_seen
        rate = (seen - log_seen) / max(now - log_time, 1e-9)
        print(f"step {label} | loss {loss_now:.4f} | tok/s {rate:.1f} | {tail}",
              file=out, flush=True)
        log_time, log_seen = now, seen

    with attention_context(cfg.attention):
        while not diverged:
            # the schedule follows whichever limit ends the run first: seconds or a step cap
            progress = 0.0 if step == 0 else max(training_s / cfg.time_budget,
                                                 step / cfg.max_steps if cfg.max_steps else 0.0)
            for group in optimizer.param_groups:
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(lr_at(progress))
                else:
                    group["lr"] = lr_at(progress)
            for micro in range(accum):
                x, y = batch(cfg.device_batch)
                with autocast:
                    loss = model(x, y) / accum
                scaler.scale(loss).backward()
                seen += cfg.device_batch * cfg.seq_len
                if micro < accum - 1 and time.perf_counter() - log_time >= cfg.log_interval_s:
                    sync()
                    loss_value = float(loss.detach()) * accum
                    progress_line(f"{step + 1} micro {micro + 1}/{accum}", loss_value,
                                  time.perf_counter(), f"elapsed {training_s:.1f}s")
                    if not math.isfinite(loss_value):
                        diverged = True
                        break
            if diverged:
                break
            if scaler.is_enabled():
                scaler.step(optimizer)
            else:
                step_fn()
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            sync()
            step += 1
            now = time.perf_counter()
            if step == 1:  # its rate includes compilation: a runner's too_slow guard skips it
                first_step_s = now - start
                train_start = now
                loss_value = float(loss.detach()) * accum
                log_time, log_seen = start, 0
                progress_line("1", loss_value, now, f"first step {first_step_s:.2f}s")
            else:
                training_s = now - train_start
                if now - log_time >= cfg.log_interval_s or training_s >= cfg.time_budget:
                    loss_value = float(loss.detach()) * accum
                    progress_line(str(step), loss_value, now, f"elapsed {training_s:.1f}s")
            diverged = not math.isfinite(loss_value)
            if training_s >= cfg.time_budget or (cfg.max_steps and step >= cfg.max_steps):
                break

        # evaluation: mean cross-entropy over fixed validation windows, in bits per byte
        val_bpb = float("nan")
        if not diverged:
            model.eval()
            n_windows = max(1, min(cfg.eval_tokens, len(val_data) - 1) // cfg.seq_len)
            total = 0.0
            with torch.no_grad(), autocast:
                for i in range(0, n_windows, cfg.device_batch):
                    rows = torch.arange(i, min(i + cfg.device_batch, n_windows), device=device)
                    window = val_data[rows[:, None] * cfg.seq_len + offsets].long()
                    total += float(model(window[:, :-1], window[:, 1:])) * len(rows)
            val_bpb = total / n_windows / math.log(2)

    tokens = max(step - 1, 0) * cfg.total_batch
    tokens_per_s = tokens / training_s if training_s > 0 else 0.0
    if is_cuda:
        peak_mem_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        import resource

        peak_mem_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return TrainResult(
        val_bpb=val_bpb, tokens_per_s=tokens_per_s,
        mfu=mfu(tokens_per_s, flops_tok, peak.flops), peak_mem_mb=peak_mem_mb,
        first_step_s=first_step_s, training_s=training_s, steps=step, tokens=tokens,
        n_params=n_params, flops_per_token=flops_tok, peak_flops=peak.flops,
        peak_source=peak.source, device=device, diverged=diverged,
    )


# ----------------------------------------------------------------------------------------------
# Summary block and command line.


def summary(result: TrainResult) -> str:
    """The grep-able block printed at the end (``grep '^val_bpb:' run.log``)."""
    rows = [
        ("val_bpb", f"{result.val_bpb:.6f}"),
        ("tokens_per_s", f"{result.tokens_per_s:.1f}"),
        ("mfu", f"{result.mfu:.4f}"),
        ("peak_mem_mb", f"{result.peak_mem_mb:.1f}"),
        ("first_step_s", f"{result.first_step_s:.2f}"),
        ("training_s", f"{result.training_s:.2f}"),
        ("steps", str(result.steps)),
        ("tokens", str(result.tokens)),
        ("n_params", str(result.n_params)),
        ("peak_flops", f"{result.peak_flops:.4g} ({result.peak_source})"),
        ("device", result.device),
    ]
    return "---\n" + "\n".join(f"{k + ':':<17} {v}" for k, v in rows)


def parse_args(argv: list[str]) -> TrainConfig:
    """``--key value`` (or ``--key=value``) for every :class:`TrainConfig` field."""
    types = {f.name: f.type for f in fields(TrainConfig)}
    values: dict[str, object] = {}
    items = [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--")
                                               and "=" in arg else [arg])]
    if len(items) % 2:
        raise SystemExit(f"expected --key value pairs, got {argv}")
    for key, raw in zip(items[::2], items[1::2], strict=True):
        name = key.removeprefix("--").replace("-", "_")
        if not key.startswith("--") or name not in types:
            raise SystemExit(f"unknown option {key!r}; options: {', '.join(types)}")
        kind = types[name]
        if "bool" in kind:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise SystemExit(f"--{name} takes true/false, got {raw!r}")
            values[name] = raw.lower() in ("true", "1")
        elif "int" in kind:
            values[name] = int(raw)
        elif "float" in kind:
            values[name] = float(raw)
        else:
            values[name] = None if raw in ("", "none", "None") else raw
    return TrainConfig(**values)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    result = train(cfg)
    print(summary(result), flush=True)
    if result.diverged:
        print("loss nan: training diverged", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
