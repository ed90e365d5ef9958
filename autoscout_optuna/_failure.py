"""Failures a trial can end with, and how they are recorded."""

from __future__ import annotations

from autoscout_optuna._keys import FAILURE_REASON as FAILURE_REASON_KEY  # noqa: F401


class Infeasible(Exception):
    """A configuration that cannot run: out of memory, invalid layout, SLO miss, crash.

    Raise it from an objective; pass ``catch=(Infeasible,)`` to ``study.optimize`` (the CLI and
    benchmark do) so the trial ends FAIL with its reason recorded and the study goes on.

    Args:
        reason: Short machine-readable class, such as ``"oom"`` or ``"invalid_layout"``.
        detail: Free text for humans.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)
