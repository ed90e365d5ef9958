"""Failures a trial can end with, and how they are recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoscout_optuna._keys import FAILURE_REASON as FAILURE_REASON_KEY


class Infeasible(Exception):
    """A configuration that cannot run: out of memory, invalid layout, SLO miss, crash.

    Raise it from an objective; pass ``catch=(Infeasible,)`` to ``study.optimize`` (the CLI and
    benchmark do) so the trial ends FAIL and the study goes on. The objectives this package
    builds (:func:`autoscout_optuna.fidelity.multi_fidelity_objective`, the CLI's, the
    benchmark's) also record the reason as user attr ``failure_reason``; a hand-written
    objective records it with ``trial.set_user_attr("failure_reason", reason)`` before raising.

    A recorded reason that starts with ``invalid`` or ``unsupported`` says the config broke a
    rule of the system (see :func:`breaks_a_rule`): MCTS then avoids the structural choices two
    such failures share, where a resource failure (``oom``) only says "too heavy".

    Args:
        reason: Short machine-readable class, such as ``"oom"`` or ``"invalid_layout"``.
        detail: Free text for humans.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


DETAIL_LIMIT = 500  # characters of user attr ``failure_detail``


def clip_detail(detail: str, limit: int = DETAIL_LIMIT) -> str:
    """``detail`` in at most ``limit`` characters: its first line (how a run ended: ``exit 1``,
    ``killed after 900 s``) and as much of its end as fits, where a job's output ends with the
    error that stopped it. Cutting either end alone lost one of them."""
    if len(detail) <= limit:
        return detail
    first = detail.partition("\n")[0][: limit // 4]
    gap = "\n...\n"
    return first + gap + detail[len(detail) - (limit - len(first) - len(gap)):]


# Reasons that name a rule of the system under test (an argument check, an unsupported pairing)
# rather than a resource running out: such a config fails whatever the memory or time, and so
# does every config that repeats its offending choices.
RULE_REASON_PREFIXES = ("invalid", "unsupported")


def breaks_a_rule(reason: object) -> bool:
    """Whether a failure ``reason`` (see :class:`Infeasible`) is a broken rule, not a resource
    limit: ``invalid_layout``, ``invalid_combination``, ``invalid_config``, ``unsupported``...
    yes; ``oom``, ``timeout``, ``nan``, ``slo_miss``, an unknown or missing reason, no."""
    return isinstance(reason, str) and reason.startswith(RULE_REASON_PREFIXES)


def failed_on_a_rule(kind: str, user_attrs: Mapping[str, Any]) -> bool:
    """Whether a trial read as evidence (``kind``, as :class:`autoscout_optuna._history.Kind`)
    failed on a broken rule: ``"failed"`` with a recorded reason :func:`breaks_a_rule` accepts.
    One test for MCTS's history table and the model arm's, so the two read failures alike."""
    return kind == "failed" and breaks_a_rule(user_attrs.get(FAILURE_REASON_KEY))
