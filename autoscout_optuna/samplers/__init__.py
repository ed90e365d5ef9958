from autoscout_optuna.samplers._autoscout.sampler import AutoScoutSampler
from autoscout_optuna.samplers._coordinate.sampler import CoordinateDescentSampler
from autoscout_optuna.samplers._mcts.sampler import MCTSSampler

__all__ = ["AutoScoutSampler", "CoordinateDescentSampler", "MCTSSampler"]
