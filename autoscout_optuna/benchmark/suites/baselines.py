"""Optuna's own samplers on every reference study: the bar our samplers have to clear.

Random search, TPE and CMA-ES with Optuna 5 defaults, and GPSampler. CMA-ES only models the
params present in every trial; it samples categoricals and conditional knobs independently
(randomly), which is exactly the weakness on hierarchical spaces this suite is meant to show.
"""

from __future__ import annotations

import optuna

from autoscout_optuna.benchmark._harness import Contender, Suite

# GPSampler's cost grows with the number of trials (it refits a GP and optimizes an acquisition
# function each trial); with 2 cores shared, it gets fewer seeds to keep `make bench` in budget.
GP_SEEDS = 5


def make_random(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def make_tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed)


def make_gp(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.GPSampler(seed=seed)


def make_cmaes(seed: int) -> optuna.samplers.BaseSampler:
    # Its fallback to independent sampling is the point; its warning per param is just noise.
    return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)


def contenders(*, gp_seeds: int | None = GP_SEEDS) -> list[Contender]:
    return [
        Contender("random", make_random),
        Contender("tpe", make_tpe),
        Contender("gp", make_gp, max_seeds=gp_seeds),
        Contender("cmaes", make_cmaes),
    ]


def reference_studies() -> tuple[list, list[str]]:
    """The reference studies and their table labels."""
    from autoscout_optuna import studies

    return (
        [
            studies.load("llm_training"),
            studies.load("llm_training", preset="70b-512"),
            studies.load("llm_serving"),
        ],
        ["llm_training (8B, 64 H100)", "llm_training (70B, 512 H100)", "llm_serving"],
    )


def suites(quick: bool = False) -> list[Suite]:
    definitions, labels = reference_studies()
    if quick:
        return [Suite(
            name="baselines", definitions=definitions, labels=labels, contenders=contenders(),
            n_trials=12, n_seeds=2, budgets=(5, 10), description="Smoke-test run (--quick).",
        )]
    return [Suite(
        name="baselines",
        definitions=definitions,
        labels=labels,
        contenders=contenders(),
        n_trials=100,
        n_seeds=10,
        budgets=(10, 20, 50, 100),
        description=(
            "Optuna's samplers with their defaults (random, TPE, GPSampler, CMA-ES with its "
            "independent fallback for categorical and conditional knobs) on the reference "
            f"studies, scored on the noiseless reference value. GP runs {GP_SEEDS} seeds "
            "(its per-trial cost); the others run 10."
        ),
    )]
