"""The default sampler for dense params that MCTS meets alone."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial

from autoscout_optuna._history import decision_number, read_history
from autoscout_optuna._rng import resolve_seed, trial_rng
from autoscout_optuna._space import contains, from_unit
from autoscout_optuna._storage import study_directions
from autoscout_optuna.samplers._independent import IndependentSampler


class IncumbentOrUniformSampler(IndependentSampler):
    """Reuse the best value seen under the same structure, or draw uniformly.

    Why this default: MCTS compares structures; a dense knob drawn afresh every trial adds
    noise to that comparison, while one copied from the best trial that shares the most of this
    trial's decisions keeps good dense settings with the structures they suit. Half the time
    (``reuse_probability``) it still draws uniformly (in log space for log domains), so dense
    knobs are explored and nothing is stuck at a first lucky value. Refining dense knobs well is
    the coordinate-descent sampler's job; ``AutoScoutSampler`` passes its own.

    Args:
        seed: Seed; draws depend only on (seed, trial number, param name).
        reuse_probability: Chance of copying the incumbent's value when one exists.
    """

    def __init__(self, *, seed: int | None = None, reuse_probability: float = 0.5) -> None:
        if not 0.0 <= reuse_probability <= 1.0:
            raise ValueError(f"reuse_probability must be in [0, 1], got {reuse_probability}")
        self._seed = resolve_seed(seed)
        self._reuse_probability = reuse_probability

    def reseed_rng(self) -> None:
        """Keeps the seed (``_rng``'s module doc)."""

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        rng = trial_rng(self._seed, decision_number(study, trial), f"mcts:dense:{param_name}")
        if rng.random() < self._reuse_probability and len(study_directions(study)) == 1:
            value = _incumbent_value(study, trial, param_name, param_distribution)
            if value is not None:
                return value
        if isinstance(param_distribution, CategoricalDistribution):
            return param_distribution.choices[int(rng.integers(len(param_distribution.choices)))]
        return from_unit(param_distribution, float(rng.random()))


def _incumbent_value(
    study: optuna.Study, trial: FrozenTrial, name: str, dist: BaseDistribution
) -> Any:
    """The value of ``name`` in the best real trial sharing the most of ``trial``'s params."""
    best_key = None
    best_value = None
    for obs in read_history(study, exclude=trial):
        if obs.kind != "real" or name not in obs.params or not contains(dist, obs.params[name]):
            continue
        shared = sum(
            1 for key, value in trial.params.items()
            if key in obs.params and obs.params[key] == value
        )
        key = (shared, obs.score)
        if best_key is None or key > best_key:
            best_key, best_value = key, obs.params[name]
    return best_value
