"""Which estimates the model arm may look past: a second look at a configuration (pure).

A PRUNED trial's estimate is one look through the simulator. Where the simulator's error is
drawn afresh at every call (a sampled simulator, a short profiling run; the benchmarks'
multiplicative noise), a good structure whose one estimate drew the error low is worth a
second look, with the very same dense values too: the model arm may propose it again
(``surrogate.settled_rows``). Where the simulator repeats itself exactly (an analytic model,
a learned cost model), the same configuration would only be scored the same again, and only
structures met with *other* dense values are worth a new look.

Which kind the study has is read from its own history: two estimates of one configuration
that differ say the error is drawn per call; estimates that agree say it is not. Before any
configuration was estimated twice, a second look is allowed, so the first one finds out (a
repeating simulator costs one cheap simulated trial, not a real run). The raw simulator value
(user attr ``autoscout:simulated``, which ``fidelity.from_definition`` records) is compared
where a trial has it, as an ensemble refitted between the looks moves the reported estimate
of even a repeating simulator; otherwise the reported estimate of PRUNED trials.

An estimate the pruner judged as good as a measurement when it was made (``Seen.graded``)
is no noisy look at all: it keeps its structure tried, as a real run would. With a noiseless
simulator (``fidelity-long``, training, 0 % noise, seeds 0-15) looking past such estimates
cost the search: 99 % in 12 of 16 seeds after a median 57 real runs, against 11 after 43.5
before second looks existed (2db7375).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autoscout_optuna import _keys
from autoscout_optuna.samplers._autoscout.reader import Seen
from autoscout_optuna.samplers._mcts.encoding import value_key

# Two looks closer than this (relative) are the same value: a repeating simulator's floats.
SAME_VALUE = 1e-9


def settling_estimates(
    history: Sequence[Seen], dense: Mapping[str, Any] | None, dense_names: Sequence[str]
) -> np.ndarray:
    """Per trial, whether it is an estimate that keeps its structure tried as a real run does
    (``surrogate.settled_rows``): a measurement-grade one (:func:`graded_estimates`), or one a
    proposal with ``dense`` would repeat exactly (:func:`exact_repeats`; ``dense`` None: no
    such repeat is known)."""
    settled = graded_estimates(history)
    exact = None if dense is None else exact_repeats(history, dense, dense_names)
    return settled if exact is None else settled | exact


def exact_repeats(
    history: Sequence[Seen], dense: Mapping[str, Any], dense_names: Sequence[str]
) -> np.ndarray | None:
    """Per trial, whether it is an estimate a proposal with ``dense`` would repeat exactly
    (its every dense param has the value ``dense`` gives it); None where a second look at
    the same configuration is worth taking (:func:`simulator_varies` is not False)."""
    if simulator_varies(history) is not False:
        return None
    wanted = {name: value_key(value) for name, value in dense.items()}
    names = set(dense_names)
    return np.array([obs.kind == "estimate" and all(
        wanted.get(n, _MISSING) == value_key(v) for n, v in obs.params.items() if n in names
    ) for obs in history], dtype=bool)


def graded_estimates(history: Sequence[Seen]) -> np.ndarray:
    """Per trial, whether it is an estimate the pruner judged as good as a measurement when it
    was made (:func:`autoscout_optuna._history.measurement_grade`): such an estimate is no
    noisy look but as good as a real run, so it keeps its structure tried like one."""
    return np.array([obs.graded for obs in history], dtype=bool)


def simulator_varies(history: Sequence[Seen]) -> bool | None:
    """True when two estimates of one configuration differ, False when every configuration
    estimated more than once got the same value each time, None before any was."""
    first: dict[Any, float] = {}
    repeated = False
    for obs in history:
        look = _look(obs)
        if look is None:
            continue
        if obs.config not in first:
            first[obs.config] = look
            continue
        repeated = True
        seen = first[obs.config]
        if abs(look - seen) > SAME_VALUE * max(abs(look), abs(seen)):
            return True
    return False if repeated else None


def _look(obs: Seen) -> float | None:
    """The trial's simulator value: the raw one where recorded, else a PRUNED trial's
    estimate; None without one."""
    raw = obs.user_attrs.get(_keys.SIMULATED)
    if raw is None and obs.kind == "estimate":
        raw = obs.score
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    return None


_MISSING = object()
