"""The relative hooks every sampler of the package shares (``IndependentSampler``)."""

from __future__ import annotations

import optuna
import pytest

from autoscout_optuna import CoordinateDescentSampler, MCTSSampler
from autoscout_optuna.samplers._autoscout.transplant import TransplantSampler
from autoscout_optuna.samplers._independent import IndependentSampler
from autoscout_optuna.samplers._mcts.fallback import IncumbentOrUniformSampler


def _asked(directions: list[str]) -> tuple[optuna.Study, optuna.trial.FrozenTrial]:
    study = optuna.create_study(directions=directions)
    trial = study.ask()
    return study, study._storage.get_trial(trial._trial_id)


@pytest.mark.parametrize("sampler", [
    TransplantSampler(seed=0), IncumbentOrUniformSampler(seed=0),
    MCTSSampler(seed=0), CoordinateDescentSampler(seed=0),
])
def test_every_sampler_decides_params_one_at_a_time(sampler: IndependentSampler) -> None:
    study, trial = _asked(["minimize"])
    assert isinstance(sampler, IndependentSampler)
    assert sampler.infer_relative_search_space(study, trial) == {}
    assert sampler.sample_relative(study, trial, {}) == {}


@pytest.mark.parametrize("sampler, refuses", [
    (TransplantSampler(seed=0), False), (IncumbentOrUniformSampler(seed=0), False),
    (MCTSSampler(seed=0), True), (CoordinateDescentSampler(seed=0), True),
])
def test_single_objective_samplers_refuse_a_multi_objective_study_in_the_relative_hook(
    sampler: IndependentSampler, refuses: bool
) -> None:
    # Optuna calls sample_relative at a trial's first suggest: the refusal comes before any
    # value is drawn, whichever param comes first.
    study, trial = _asked(["minimize", "maximize"])
    if refuses:
        with pytest.raises(ValueError, match="single-objective"):
            sampler.sample_relative(study, trial, {})
    else:
        assert sampler.sample_relative(study, trial, {}) == {}
