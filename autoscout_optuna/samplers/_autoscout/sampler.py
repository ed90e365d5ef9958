# PLACEHOLDER: replaced by the real implementation.
from optuna.samplers import RandomSampler


class AutoScoutSampler(RandomSampler):
    def __init__(self, *, seed=None, **kwargs):
        super().__init__(seed=seed)
