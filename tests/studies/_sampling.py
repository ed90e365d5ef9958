"""Helpers the study tests share: suggest a fixed config, sample random ones, score them."""

from __future__ import annotations

import optuna

from autoscout_optuna import Infeasible


def suggest_fixed(definition, base_params, **overrides):
    """(config, names of the params the space asked) for ``base_params`` with ``overrides``."""
    trial = optuna.trial.FixedTrial(dict(base_params, **overrides))
    config = definition.suggest(trial)
    return config, set(trial.params)


def random_configs(definition, n_trials, seed=0):
    """(params, config) of random trials whose suggest did not fail."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n_trials):
        trial = study.ask()
        try:
            config = definition.suggest(trial)
        except Infeasible:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        study.tell(trial, 0.0)
        out.append((dict(trial.params), config))
    return out


def feasible_values(definition, configs):
    """(config, noiseless value) of the configs that measure without failing."""
    values = []
    for _, config in configs:
        try:
            values.append((config, definition.measure(config, None)))
        except Infeasible:
            pass
    return values
