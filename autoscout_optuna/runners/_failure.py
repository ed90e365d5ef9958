"""How a real run failed, as one of a few reasons a sampler can learn from."""

from __future__ import annotations

from autoscout_optuna._failure import Infeasible

# timeout: killed at the wall-clock limit; oom: out of (GPU or host) memory, or killed by the
# kernel's OOM killer (signal 9); nan: the loss or a metric became NaN/inf; crash: any other
# non-zero exit; too_slow: alive but far slower than expected, aborted early; no_metric: exited
# cleanly without printing a metric the runner was told to parse.
REASONS = ("timeout", "oom", "nan", "crash", "too_slow", "no_metric")


class RunFailed(Infeasible):
    """A real run that ended without a usable measurement.

    A subclass of :class:`autoscout_optuna.Infeasible`, so ``study.optimize(...,
    catch=(Infeasible,))`` ends the trial FAIL and goes on.

    Args:
        reason: One of ``REASONS``.
        detail: What the run printed last, or why it was stopped.
        log_path: The per-trial log file, when there is one.
    """

    def __init__(self, reason: str, detail: str = "", *, log_path: str | None = None) -> None:
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {REASONS}, got {reason!r}")
        super().__init__(reason, detail)
        self.log_path = log_path
