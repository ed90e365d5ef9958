from autoscout_optuna.fidelity._pruner import FidelityPruner

__all__ = ["FidelityPruner"]
