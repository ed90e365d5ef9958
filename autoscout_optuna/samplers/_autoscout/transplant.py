"""The sampler behind start-up trials and behind the sub-samplers' fallbacks.

It plays back a per-trial *plan* (``{"values": {param: value}, "unseen_dense": "centre" or
"random"}``) that :class:`AutoScoutSampler` computes in
``before_trial`` from history and stores on the trial (system attr ``autoscout:plan``):

* dense params: the incumbent's values where the incumbent has them and they are legal under the
  requested distribution, else the value of the best trial that had the param, else the centre
  of the domain. A new structure is so tried at the incumbent's stage of dense tuning, which is
  what makes the difference-in-differences comparison with the incumbent fair (and keeps
  exploration from wasting trials on untuned dense knobs).
* structural params during blind start-up coverage (``startup="coverage"``): the
  least-covered value (MCTS decides them in every other trial).

Anything the plan does not cover (a param never seen, a changed domain, no plan at all) is drawn
uniformly from a generator derived from (seed, trial number, param name).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial

from autoscout_optuna._history import decision_number
from autoscout_optuna._rng import resolve_seed, trial_rng
from autoscout_optuna._space import contains, from_unit, is_structural
from autoscout_optuna._storage import get_fresh_trial
from autoscout_optuna.samplers._independent import IndependentSampler

PLAN_KEY = "autoscout:plan"


class PlanCache:
    """Plans of this process's running trials, keyed by trial id (storage stays the truth).

    Optuna hands hooks a FrozenTrial read *before* ``before_trial`` ran, so the plan written
    there is not on it; this cache spares a storage read per param. It is dropped on pickling
    and misses fall back to storage, so workers and resumed studies see the same plans.
    """

    def __init__(self) -> None:
        # (trial id, start time) -> plan: trial ids restart in every new in-memory storage
        self.entries: MutableMapping[tuple[int, Any], dict[str, Any]] = {}

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (PlanCache, ())

    def lookup(self, study: optuna.Study, trial: FrozenTrial, key: str) -> Any:
        entry = self.entries.get(_key(trial))
        if entry is not None and key in entry:
            return entry[key]
        if key in trial.system_attrs:
            return trial.system_attrs[key]
        try:
            fresh = get_fresh_trial(study, trial)
        except (KeyError, AttributeError):
            return None
        value = fresh.system_attrs.get(key, fresh.user_attrs.get(key))
        if value is not None:
            self.entries.setdefault(_key(trial), {})[key] = value
        return value

    def store(self, trial: FrozenTrial, key: str, value: Any) -> None:
        self.entries.setdefault(_key(trial), {})[key] = value

    def forget(self, trial: FrozenTrial) -> None:
        self.entries.pop(_key(trial), None)


def _key(trial: FrozenTrial) -> tuple[int, Any]:
    return trial._trial_id, trial.datetime_start


class TransplantSampler(IndependentSampler):
    """Independent sampler that plays the orchestrator's plan (see module doc).

    Args:
        seed: Seed for values the plan does not cover.
        cache: The orchestrator's plan cache (a fresh one when used alone).
    """

    def __init__(self, *, seed: int | None = None, cache: PlanCache | None = None) -> None:
        self._seed = resolve_seed(seed)
        self._cache = cache if cache is not None else PlanCache()

    def reseed_rng(self) -> None:
        """Keeps the seed (``_rng``'s module doc)."""

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        plan = self._cache.lookup(study, trial, PLAN_KEY) or {}
        values = plan.get("values", {})
        if param_name in values:
            value = values[param_name]
            if contains(param_distribution, value):
                return _native(param_distribution, value)
        rng = trial_rng(self._seed, decision_number(study, trial), f"transplant:{param_name}")
        if isinstance(param_distribution, CategoricalDistribution):
            return param_distribution.choices[int(rng.integers(len(param_distribution.choices)))]
        if plan.get("unseen_dense") == "centre" and not is_structural(param_distribution):
            # A dense knob no earlier trial had: the centre of its domain, a neutral default
            # every structure shares (so start-up trials differ only in structure).
            return from_unit(param_distribution, 0.5)
        return from_unit(param_distribution, float(rng.random()))


def _native(distribution: BaseDistribution, value: Any) -> Any:
    """Storage may hand back 3.0 for an int param: return the type Optuna expects."""
    if isinstance(distribution, CategoricalDistribution):
        return distribution.to_external_repr(distribution.to_internal_repr(value))
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return int(value)
    return float(value)
