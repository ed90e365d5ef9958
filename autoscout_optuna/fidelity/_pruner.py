# PLACEHOLDER: replaced by the real implementation.
from optuna.pruners import NopPruner


class FidelityPruner(NopPruner):
    pass
