"""A pruner that knows the truth: how far any pruner could take the fidelity suite.

A benchmark diagnostic, never a tool. The simulated objective leaves each trial's noiseless
value in a user attr before it asks ``should_prune``; :class:`OraclePruner` then runs a trial
for real exactly when that value is within ``tolerance`` of the best noiseless value run so far,
and prunes it otherwise. Everything else is :class:`~autoscout_optuna.FidelityPruner`'s: the
same user attrs (the estimate, the simulator's measured error) so the sampler reads the study
exactly as it would with the real pruner, and learns from the same noisy estimates on pruned
trials. Only the choice of real runs changes: none goes to a config that cannot improve.

The sampler also learns from real runs that do not improve, so fewer real runs can mean a worse
path. If even this pruner rarely reaches a level within the trial budget, the limit is the path
the sampler takes through noisy estimates, not the pruner's decisions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna._storage import get_trials
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.fidelity import FidelityPruner
from autoscout_optuna.fidelity._decision import REAL, SIMULATOR, FidelityDecision

# Only the oracle reads it; the dashboard shows it, which a diagnostic run may.
ORACLE_KEY = "benchmark:noiseless_value"


def with_oracle_value(
    definition: StudyDefinition, simulate: Callable[[optuna.Trial, Mapping], float]
) -> Callable[[optuna.Trial, Mapping], float]:
    """``simulate`` that first records the config's noiseless value for :class:`OraclePruner`."""

    def run(trial: optuna.Trial, config: Mapping) -> float:
        trial.set_user_attr(ORACLE_KEY, float(definition.measure(config, None)))
        return simulate(trial, config)

    return run


class OraclePruner(FidelityPruner):
    """Runs a trial for real iff its noiseless value is within ``tolerance`` of the best one
    run so far (0: only a strict improvement runs); reads everything from storage.

    Args:
        tolerance: Relative shortfall from the best real run's noiseless value that still
            runs for real, in [0, 1).
    """

    def __init__(self, *, tolerance: float = 0.0) -> None:
        super().__init__()
        if not (isinstance(tolerance, (int, float)) and 0.0 <= tolerance < 1.0):
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        self._tolerance = float(tolerance)

    def decide(self, study: optuna.Study, trial: FrozenTrial) -> FidelityDecision:
        decision = super().decide(study, trial)
        value = _oracle_value(trial)
        if value is None:
            return decision  # nothing known: the pruner's own decision
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        run = [_oracle_value(t) for t in get_trials(study) if t.state == TrialState.COMPLETE]
        best = max((sign * v for v in run if v is not None), default=None)
        if best is None:
            good = True
        elif self._tolerance == 0.0:
            good = sign * value > best
        else:  # within tolerance of the best, on the value's own scale
            good = sign * value >= best - self._tolerance * abs(best)
        fidelity = REAL if good else SIMULATOR
        return dataclasses.replace(decision, fidelity=fidelity, reason=f"oracle_{fidelity}")


def _oracle_value(trial: FrozenTrial) -> float | None:
    value: Any = trial.user_attrs.get(ORACLE_KEY)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None
