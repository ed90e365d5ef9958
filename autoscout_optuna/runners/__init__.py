"""Real runs: a command runner for any job, the small-GPT trainer, per-GPU locks, telemetry.

Nothing here imports torch at import time; the trainer (``runners.gpt``) imports it when it runs.
"""

from autoscout_optuna.runners._command import CommandRunner
from autoscout_optuna.runners._failure import REASONS, RunFailed
from autoscout_optuna.runners._lock import GpuLock
from autoscout_optuna.runners._mfu import PeakFlops, flops_per_token, lookup_peak, mfu
from autoscout_optuna.runners._process import AUTORESEARCH_METRICS
from autoscout_optuna.runners._telemetry import GpuTelemetry
from autoscout_optuna.runners._workers import launch_workers, visible_gpus

__all__ = [
    "AUTORESEARCH_METRICS",
    "REASONS",
    "CommandRunner",
    "GpuLock",
    "GpuTelemetry",
    "PeakFlops",
    "RunFailed",
    "flops_per_token",
    "launch_workers",
    "lookup_peak",
    "mfu",
    "visible_gpus",
]
