"""Suite ``coordinate``: CoordinateDescentSampler against TPE, random and CMA-ES on dense spaces.

Studies: the smooth test functions of ``autoscout_optuna.benchmark.functions`` and the LLM
studies with their structure fixed at a good layout (only the dense knobs left to tune).
Contenders: coordinate descent with each coordinate rule (cyclic is the default; random and
sensitivity-weighted are there to justify that choice), TPE, random search and CMA-ES.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import optuna

from autoscout_optuna._space import is_structural
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.benchmark import functions
from autoscout_optuna.benchmark._harness import Contender, Suite
from autoscout_optuna.samplers._coordinate.sampler import CoordinateDescentSampler

#: The LLM studies searched with their structure fixed at their optimum's layout.
FIXED_LAYOUT_STUDIES = ("llm_training", "llm_serving")


def optimum_layout(definition: StudyDefinition) -> dict[str, Any] | None:
    """The structural params of ``definition``'s stored optimum (``studies/_optima.json``,
    found by enumeration), or None where none is stored.

    Read from the stored config itself, so a re-enumerated optimum moves the fixed layout
    with it and the fixed study keeps its optimum reachable: the config is replayed through
    the study's space, and the params it asks that are structural are the layout (on the
    stored studies: llama3-8b training pure data-parallel; llama3-70b served by TP4 replicas
    with one speculative token).
    """
    from autoscout_optuna.studies._optima import stored_config

    config = stored_config(definition.name, definition.options)
    if config is None:
        return None
    trial = optuna.trial.FixedTrial(config)
    definition.suggest(trial)
    return {name: trial.params[name] for name, distribution in trial.distributions.items()
            if is_structural(distribution)}


def _coordinate(seed: int, rule: str) -> optuna.samplers.BaseSampler:
    return CoordinateDescentSampler(seed=seed, rule=rule)


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed)


def _random(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def _cmaes(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)


CONTENDERS = [
    Contender("cd-cyclic", functools.partial(_coordinate, rule="cyclic")),
    Contender("cd-random", functools.partial(_coordinate, rule="random")),
    Contender("cd-sensitivity", functools.partial(_coordinate, rule="sensitivity")),
    Contender("tpe", _tpe),
    Contender("random", _random),
    Contender("cmaes", _cmaes),
]


def fixed_studies() -> list[StudyDefinition]:
    """The LLM studies with the structure fixed at their optimum's layout (optimum kept)."""
    from autoscout_optuna import studies

    out = []
    for name in FIXED_LAYOUT_STUDIES:
        if name not in studies.names():
            continue
        free = studies.load(name)
        layout = optimum_layout(free)
        if layout is not None:
            fixed = studies.load(name, fixed=layout)
            out.append(dataclasses.replace(fixed, optimum=free.optimum))
    return out


def suites(quick: bool = False) -> list[Suite]:
    smooth = [functions.definition(name) for name in functions.names()]
    fixed = fixed_studies()
    definitions = smooth + fixed
    labels = [d.name for d in smooth] + [f"{d.name}[fixed layout]" for d in fixed]
    n_trials = 30 if quick else 200
    if quick:
        definitions, labels = definitions[:2], labels[:2]
    return [
        Suite(
            name="coordinate",
            definitions=definitions,
            contenders=CONTENDERS,
            n_trials=n_trials,
            n_seeds=2 if quick else 20,
            budgets=[b for b in (25, 50, 100, 200) if b <= n_trials] or [n_trials],
            description=(
                "Dense refinement with the structure fixed: coordinate descent (three coordinate "
                "rules) vs TPE, random search and CMA-ES on smooth test functions (2-10 dims, log "
                "and int knobs, one with an OOM wall) and on the LLM studies with the structure "
                "fixed at their optimum's layout (the optimum stays reachable)."
            ),
            labels=labels,
        )
    ]
