"""AutoScout for Optuna: structural tree search, dense coordinate descent, a bandit between them,
and a multi-fidelity pruner that spends real runs only where they matter.

``import autoscout_optuna`` never imports torch.
"""

from autoscout_optuna._confirm import Confirmation, confirm_best
from autoscout_optuna._decisions import decisions_table
from autoscout_optuna._failure import Infeasible
from autoscout_optuna._megatron_memory import MegatronMemoryEstimate
from autoscout_optuna.fidelity import FidelityPruner
from autoscout_optuna.samplers import AutoScoutSampler, CoordinateDescentSampler, MCTSSampler

__version__ = "0.1.0"

__all__ = [
    "AutoScoutSampler",
    "Confirmation",
    "CoordinateDescentSampler",
    "FidelityPruner",
    "Infeasible",
    "MCTSSampler",
    "MegatronMemoryEstimate",
    "confirm_best",
    "decisions_table",
]
