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

from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.benchmark import functions
from autoscout_optuna.benchmark._harness import Contender, Suite
from autoscout_optuna.samplers._coordinate.sampler import CoordinateDescentSampler

#: The structural values of each study's optimum (``studies/_optima.json``, found by enumeration),
#: so only the dense knobs are left to tune and the study's optimum is still reachable.
GOOD_LAYOUTS: dict[str, dict[str, Any]] = {
    # llama3-8b on 64 H100: pure data parallel; dense: bucket_size_mb (log), comm_sms (int).
    "llm_training": dict(tp=1, pp=1, micro_batch=1, recompute="none", zero_stage=2,
                         overlap_grad_reduce=True, cuda_graphs=True),
    # llama3-70b, TP4 replicas; dense: max_num_seqs, max_num_batched_tokens,
    # long_prefill_threshold (log ints), gpu_memory_utilization (float, OOM above the limit).
    "llm_serving": dict(tp=4, pp=1, chunked_prefill=True, block_size=16, cuda_graphs=True,
                        prefix_caching=True, speculative=True, num_speculative_tokens=1),
}


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
    for name, layout in GOOD_LAYOUTS.items():
        if name in studies.names():
            free = studies.load(name)
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
