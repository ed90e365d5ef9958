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


def simulator_agreement(definition, configs):
    """(pairs compared, Spearman rho, median relative error) of simulator vs noiseless reference."""
    import numpy as np
    from scipy.stats import spearmanr

    pairs = []
    for config, value in feasible_values(definition, configs):
        try:
            pairs.append((value, definition.simulate(config)))
        except Infeasible:
            pass
    reference, simulated = np.array(pairs).T
    rho = spearmanr(reference, simulated)[0]
    return len(pairs), rho, float(np.median(np.abs(simulated - reference) / reference))


def check_seeded_noise(definition):
    """Noiseless repeats agree, a seed reproduces its noise; returns 400 log noise ratios."""
    import numpy as np

    config = dict(definition.default_config)
    clean = definition.measure(config, None)
    assert definition.measure(config, None) == clean
    first = definition.measure(config, np.random.default_rng(7))
    assert definition.measure(config, np.random.default_rng(7)) == first
    assert definition.measure(config, np.random.default_rng(8)) != first
    rng = np.random.default_rng(0)
    return np.log([definition.measure(config, rng) / clean for _ in range(400)])


def check_fixed_domains(name, suggest, domains, **options):
    """The knobs ``suggest`` (a trial -> config function) asks for over 300 random trials are
    exactly those of ``domains`` (what ``fixed=`` is checked against), each with its domain
    there, and a whole config the space suggested is accepted as ``fixed`` by study ``name``
    with ``options``."""
    from autoscout_optuna import studies

    def objective(trial):
        suggest(trial)
        return 0.0

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    study.optimize(objective, n_trials=300, catch=(Infeasible,))
    for trial in study.trials:
        for knob, dist in trial.distributions.items():
            assert dist == domains[knob], knob
    # A domain no trial asks for would let ``fixed=`` pin a knob the study ignores.
    assert set().union(*(trial.distributions for trial in study.trials)) == set(domains)
    pinned = study.best_trial.params
    assert studies.load(name, **options, fixed=pinned).options["fixed"] == pinned
