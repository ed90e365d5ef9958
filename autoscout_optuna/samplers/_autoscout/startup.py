"""Start-up coverage and what it learns (pure: value lists and counts in, choices out).

Blind start-up coverage (``AutoScoutSampler(startup="coverage")``, the ablation of MCTS's
start-up): each structural param takes its least-tried value (ties broken at random), counting
every earlier trial that had the param, pending ones included so parallel workers spread out.
Counts are per param among the trials that reached it, so a conditional knob is covered within
the branches that expose it. Either way, :func:`infer_conditions` reads which knob appears only
under which upstream values (the dependency tree, as seen so far).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np


def least_covered(
    values: Sequence[Any], seen: Sequence[Any], rng: np.random.Generator
) -> Any:
    """The value of ``values`` seen least often in ``seen`` (random among ties)."""
    if not values:
        raise ValueError("values must not be empty")
    counts = np.zeros(len(values))
    index = {choice_key(v): i for i, v in enumerate(values)}
    for value in seen:
        i = index.get(choice_key(value))
        if i is not None:
            counts[i] += 1
    candidates = np.flatnonzero(counts == counts.min())
    return values[int(rng.choice(candidates))]


def infer_conditions(
    param_sets: Sequence[Mapping[str, Any]], structural: Sequence[str],
    of: Sequence[str] | None = None,
) -> dict[str, dict[str, list[Any]]]:
    """Which structural values each conditional param has been seen under.

    A param ``p`` is conditional on a structural param ``q`` when ``q`` was present in every
    trial that had ``p`` and ``p`` appeared under only some of ``q``'s observed values.
    ``of`` limits the params ``p`` looked at (default: every param seen).

    Returns:
        ``{p: {q: sorted values of q under which p appeared}}`` for conditional params only.
    """
    all_values: dict[str, set[Hashable]] = {}
    for params in param_sets:
        for q in structural:
            if q in params:
                all_values.setdefault(q, set()).add(choice_key(params[q]))
    names = sorted({name for params in param_sets for name in params} if of is None else of)
    conditions: dict[str, dict[str, list[Any]]] = {}
    for p in names:
        having = [params for params in param_sets if p in params]
        if len(having) == len(param_sets):
            continue  # present everywhere: unconditional
        for q in structural:
            if q == p or not all(q in params for params in having):
                continue
            under = {choice_key(params[q]): params[q] for params in having}
            if set(under) < all_values.get(q, set()):
                conditions.setdefault(p, {})[q] = [under[k] for k in sorted(under, key=repr)]
    return conditions


def choice_key(value: Any) -> Hashable:
    # Optuna categorical choices may be None, bool, int, float or str; bool and int must differ.
    return (type(value).__name__, value)
