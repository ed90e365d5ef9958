"""Read a study's trials into observations every algorithm can use without special cases.

Pruned trials have ``value is None``; conditional params are missing from some trials; failed
trials have no value; RUNNING trials are pending. All four are handled here once, so no sampler
indexes ``t.params[name]`` or ``t.value`` on its own (a known crash class in community samplers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna._keys import ORPHANED
from autoscout_optuna._storage import get_trials

Kind = Literal["real", "estimate", "failed", "pending"]


@dataclass(frozen=True)
class Observation:
    """One trial as evidence.

    Attributes:
        number: Trial number.
        params: Parameters the trial took (conditional ones may be missing).
        distributions: Their distributions.
        kind: ``"real"`` (COMPLETE), ``"estimate"`` (PRUNED with an intermediate value: a
            low-fidelity observation), ``"failed"`` (FAIL, or a NaN/inf result) or ``"pending"``
            (RUNNING/WAITING).
        score: The value oriented so that larger is better (negated for minimize); None unless
            ``kind`` is real or estimate.
        user_attrs: The trial's user attrs (decisions recorded by samplers).
    """

    number: int
    params: Mapping[str, Any]
    distributions: Mapping[str, BaseDistribution]
    kind: Kind
    score: float | None
    user_attrs: Mapping[str, Any]
    system_attrs: Mapping[str, Any]


def orient(value: float, direction: StudyDirection) -> float:
    """Make larger better: the identity for maximize, negation for minimize."""
    return value if direction == StudyDirection.MAXIMIZE else -value


def observation_of(trial: FrozenTrial, direction: StudyDirection) -> Observation:
    kind: Kind
    score: float | None = None
    if trial.state == TrialState.COMPLETE:
        value = trial.value
        if value is None or not math.isfinite(value):
            kind = "failed"
        else:
            kind, score = "real", orient(float(value), direction)
    elif trial.state == TrialState.PRUNED:
        # A pruned trial's last intermediate value is a low-fidelity estimate. With none (or a
        # NaN one) it taught us nothing we can rank by: count it as failed, never crash.
        last = _last_intermediate(trial)
        if last is None:
            kind = "failed"
        else:
            kind, score = "estimate", orient(last, direction)
    elif trial.state == TrialState.FAIL:
        kind = "failed"
    else:
        kind = "pending"
    return Observation(
        number=trial.number,
        params=trial.params,
        distributions=trial.distributions,
        kind=kind,
        score=score,
        user_attrs=trial.user_attrs,
        system_attrs=trial.system_attrs,
    )


def read_history(study: optuna.Study, exclude: FrozenTrial | None = None) -> list[Observation]:
    """Every trial of a single-objective study as an :class:`Observation`, oldest first.

    Args:
        study: The study.
        exclude: The trial being sampled right now (it is RUNNING but is not "another worker").
    """
    direction = study.direction
    skip = None if exclude is None else exclude.number
    return [
        observation_of(t, direction)
        for t in get_trials(study)
        if t.number != skip and not t.system_attrs.get(ORPHANED)
    ]


def decision_number(study: optuna.Study, trial: FrozenTrial) -> int:
    """The trial's index among non-orphaned trials: what seeds its random choices.

    A trial whose worker died is failed and re-run as a new trial (``_recovery``). Counting it
    would shift every later decision; skipping it makes the resumed study propose exactly what
    the uninterrupted one would have.
    """
    # an orphan is marked while RUNNING and failed next: no other state can hold one
    candidates = get_trials(study, states=(TrialState.FAIL, TrialState.RUNNING))
    orphans = sum(
        1 for t in candidates if t.number < trial.number and t.system_attrs.get(ORPHANED)
    )
    return trial.number - orphans


def _last_intermediate(trial: FrozenTrial) -> float | None:
    if not trial.intermediate_values:
        return None
    step = max(trial.intermediate_values)
    value = trial.intermediate_values[step]
    if value is None or not math.isfinite(value):
        return None
    return float(value)
