"""Multi-fidelity search: trust a cheap simulator where it has proven right, run for real where
it matters (DESIGN section 1, multi-fidelity protocol)."""

from autoscout_optuna.fidelity._ensemble import SimulatorEnsemble
from autoscout_optuna.fidelity._error import SimulatorError, measure_error
from autoscout_optuna.fidelity._objective import (
    from_definition,
    multi_fidelity_objective,
    run_protocol,
)
from autoscout_optuna.fidelity._pruner import FidelityPruner
from autoscout_optuna.fidelity._study_ensemble import StudyEnsembleEstimator

__all__ = [
    "FidelityPruner",
    "SimulatorEnsemble",
    "SimulatorError",
    "StudyEnsembleEstimator",
    "from_definition",
    "measure_error",
    "multi_fidelity_objective",
    "run_protocol",
]
