"""MCTSSampler against TPE and random search on the structural part of the reference studies.

Every study runs with ``dense_at_defaults=True``: dense knobs sit at their defaults, so what
is compared is the search over structural (tree) decisions alone, the part MCTS is for.
"""

from __future__ import annotations

import optuna

from autoscout_optuna.benchmark._harness import Contender, Suite


def make_mcts(seed: int) -> optuna.samplers.BaseSampler:
    from autoscout_optuna import MCTSSampler

    return MCTSSampler(seed=seed)


def make_tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed)


def make_random(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def contenders() -> list[Contender]:
    return [
        Contender("mcts", make_mcts),
        Contender("tpe", make_tpe),
        Contender("random", make_random),
    ]


def structural_studies() -> tuple[list, list[str]]:
    """The reference studies with dense knobs held at their defaults, and their labels."""
    from autoscout_optuna import studies

    return (
        [
            studies.load("llm_training", dense_at_defaults=True),
            studies.load("llm_training", preset="70b-512", dense_at_defaults=True),
            studies.load("llm_serving", dense_at_defaults=True),
        ],
        [
            "llm_training (8B, 64 H100, structural)",
            "llm_training (70B, 512 H100, structural)",
            "llm_serving (structural)",
        ],
    )


def suites(quick: bool = False) -> list[Suite]:
    definitions, labels = structural_studies()
    if quick:
        return [Suite(
            name="mcts", definitions=definitions, labels=labels, contenders=contenders(),
            n_trials=12, n_seeds=2, budgets=(5, 10), description="Smoke-test run (--quick).",
        )]
    return [Suite(
        name="mcts",
        definitions=definitions,
        labels=labels,
        contenders=contenders(),
        n_trials=100,
        n_seeds=30,
        budgets=(20, 50, 100),
        description=(
            "MCTSSampler (defaults) vs Optuna's TPESampler (defaults) and RandomSampler on the "
            "reference studies with dense knobs held at their defaults (structural search "
            "only), 30 seeds x 100 trials (with 10 seeds the medians moved by a few percent "
            "from one seed set to another), scored on the noiseless reference value of the "
            "best trial so far; FAIL trials (invalid layouts, out of memory) counted per run."
        ),
    )]
