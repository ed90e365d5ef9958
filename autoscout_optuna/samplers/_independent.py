"""The base of the samplers that decide every param in ``sample_independent``."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial

from autoscout_optuna import _validate


class IndependentSampler(BaseSampler):
    """A sampler with an empty relative search space: Optuna asks it for one param at a time.

    Each sampler here plans a whole trial (a tree path, a coordinate move, the orchestrator's
    transplant plan) and serves the plan param by param, because the space is define-by-run:
    which params a trial asks depends on the values already chosen, so there is no joint
    space to sample ahead of the objective. Optuna's relative hooks therefore have nothing to
    do, and this class says so once for all of them.

    Subclasses implement ``sample_independent``. One that serves single-objective studies only
    sets ``single_objective_only``: ``sample_relative`` runs before the first param of every
    trial, so a multi-objective study is refused before any value is drawn.
    """

    single_objective_only: bool = False

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self.single_objective_only:
            _validate.single_objective(study, type(self).__name__)
        return {}
