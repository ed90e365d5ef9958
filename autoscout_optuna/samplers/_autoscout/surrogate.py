"""The model arm: a structure proposed by a learned model of the whole history (pure).

MCTS decides one level at a time from statistics of the rows that agree with the path so far;
with a few dozen trials spread over thousands of structures, a deep node has seen almost
nothing, and a value that co-occurred with failures is avoided everywhere. A job's speed is
closer to a *product* of per-choice factors (the tensor-parallel degree sets the communication
share, recomputation the compute overhead, the ZeRO stage the optimizer-step cost), so its
logarithm is close to a *sum* over the structural choices. Fitted on every scored trial at
once, such a model ranks structures no trial has tried. On ``llm_training`` 70B-on-512 (4,149
feasible structures, one within 1 % of the optimum untuned), an additive model fitted on 40
random feasible structures puts that one among its top 10 predictions in half the draws
(``python -m autoscout_optuna._enumerate ... --landscape`` counts the structures).

The model: Bayesian ridge regression of the standardized log-score on the one-hot encoded
structural choices (a conditional knob that was not asked contributes nothing), with a
Thompson draw of its weights per trial, so the arm both follows the model and tries choices
it is unsure of. Candidates are the top structures with one to three choices changed, and
uniformly drawn structures; a candidate already run (or failed, or running) is left out, as is
one the feasibility model of MCTS (:mod:`~autoscout_optuna.samplers._mcts.feasibility`) expects
to fail. The best draw among the rest is proposed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscout_optuna.samplers._mcts.encoding import value_key
from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility, numeric_values, one_hot
from autoscout_optuna.samplers._mcts.tree import ABSENT, unique_rows

# Ridge prior precision on the one-hot weights (standardized targets): about one trial's worth.
PRIOR_PRECISION = 1.0
# Residual variance floor (standardized units): keeps the Thompson draw exploring even when a
# handful of trials happen to fit perfectly.
MIN_RESIDUAL_VARIANCE = 0.05
N_CANDIDATES = 1500
N_TEMPLATES = 5
MAX_CHANGES = 3
# A third of the candidates ignore the history: structures far from every template.
UNIFORM_SHARE = 1 / 3
MAX_FAIL_PROBABILITY = 0.2
MIN_SCORED = 4
ESTIMATE_WEIGHT = 0.5


@dataclass(frozen=True)
class Proposal:
    """A structure to run, and the numbers that chose it (recorded as a user attr)."""

    values: dict[str, Any]
    predicted: float
    p_fail: float
    n_candidates: int

    def as_dict(self) -> dict[str, Any]:
        return {"predicted_z": round(self.predicted, 4), "p_fail": round(self.p_fail, 3),
                "candidates": self.n_candidates}


def propose(
    names: Sequence[str],
    value_lists: Sequence[Sequence[Any]],
    rows: Sequence[Mapping[str, Any]],
    kinds: Sequence[str],
    scores: Sequence[float | None],
    conditions: Mapping[str, Mapping[str, Sequence[Any]]],
    rng: np.random.Generator,
) -> Proposal | None:
    """The structure the model arm runs next; None with fewer than ``MIN_SCORED`` scored
    trials or when every candidate was run already.

    Args:
        names: Structural params (model features), in a fixed order.
        value_lists: Every value of each of ``names``.
        rows: Each trial's params (structural ones are read; others ignored).
        kinds: ``"real"``, ``"estimate"``, ``"failed"`` or ``"pending"`` per row.
        scores: Oriented score per row (larger is better; None unless real or estimate).
        conditions: ``{param: {parent: values under which param is asked}}``
            (``startup.infer_conditions``): a candidate leaves a param out where it would not
            be asked.
        rng: Source of the candidates and the Thompson draw.
    """
    lookups = _lookups(value_lists)
    codes = encode(names, lookups, rows)
    kind = np.asarray(kinds, dtype=str)
    scored = (kind == "real") | (kind == "estimate")
    if scored.sum() < MIN_SCORED:
        return None
    n_values = [len(v) for v in value_lists]
    offsets = np.concatenate([[0], np.cumsum(n_values)]).astype(int)
    scored_scores = np.asarray(scores, dtype=float)[scored]
    weights = draw_weights(
        one_hot(codes[scored], offsets), log_scores(scored_scores),
        np.where(kind[scored] == "estimate", ESTIMATE_WEIGHT, 1.0), rng,
    )
    order = np.argsort(-scored_scores, kind="stable")
    templates = codes[np.flatnonzero(scored)[order[:N_TEMPLATES]]]
    candidates = make_candidates(templates, n_values, rng)
    candidates = apply_conditions(candidates, names, lookups, conditions)
    candidates = untried(unique_rows(candidates)[0], codes)
    if len(candidates) == 0:
        return None
    feasibility = fit_feasibility(
        codes, n_values, kind == "failed", scored,
        numeric=[numeric_values(values) for values in value_lists],
    )
    p_fail = feasibility.p_fail(candidates)
    predicted = _with_intercept(one_hot(candidates, offsets)) @ weights
    allowed = p_fail <= MAX_FAIL_PROBABILITY
    if allowed.any():
        best = int(np.argmax(np.where(allowed, predicted, -np.inf)))
    else:
        best = int(np.argmin(p_fail))
    values = {name: value_lists[j][candidates[best, j]] for j, name in enumerate(names)
              if candidates[best, j] >= 0}
    return Proposal(values, float(predicted[best]), float(p_fail[best]), len(candidates))


def _lookups(value_lists: Sequence[Sequence[Any]]) -> list[dict[Any, int]]:
    """Per param, its values' codes by ``value_key``."""
    return [{value_key(v): k for k, v in enumerate(values)} for values in value_lists]


def encode(
    names: Sequence[str], lookups: Sequence[Mapping[Any, int]], rows: Sequence[Mapping[str, Any]]
) -> np.ndarray:
    """``codes[i, j]``: the index (``lookups[j]``) of row ``i``'s value of ``names[j]``;
    ``ABSENT`` if not asked (or a value outside today's list)."""
    codes = np.full((len(rows), len(names)), ABSENT, dtype=int)
    for i, params in enumerate(rows):
        for j, name in enumerate(names):
            if name in params:
                codes[i, j] = lookups[j].get(value_key(params[name]), ABSENT)
    return codes


def log_scores(scores: np.ndarray) -> np.ndarray:
    """Standardized targets: log of the score's magnitude where every score has one sign (a
    throughput, or a minimized time, oriented), else the score itself."""
    if np.all(scores > 0):
        target = np.log(scores)
    elif np.all(scores < 0):
        target = -np.log(-scores)  # oriented minimization: larger (less negative) is better
    else:
        target = scores.astype(float)
    spread = float(target.std())
    return (target - target.mean()) / (spread if spread > 0 else 1.0)


def draw_weights(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """One draw of (intercept, weights) from the Bayesian ridge posterior."""
    design = _with_intercept(x)
    prior = np.full(design.shape[1], PRIOR_PRECISION)
    prior[0] = 1e-6
    precision = (design * w[:, None]).T @ design + np.diag(prior)
    mean = np.linalg.solve(precision, (design * w[:, None]).T @ y)
    residual = y - design @ mean
    variance = max(float((w * residual**2).sum() / max(w.sum() - 1.0, 1.0)),
                   MIN_RESIDUAL_VARIANCE)
    # Sample N(mean, variance * precision^-1) through the Cholesky factor of the precision.
    factor = np.linalg.cholesky(precision)
    noise = np.linalg.solve(factor.T, rng.standard_normal(len(mean)))
    return mean + np.sqrt(variance) * noise


def make_candidates(
    templates: np.ndarray, n_values: Sequence[int], rng: np.random.Generator
) -> np.ndarray:
    """Templates with 1-``MAX_CHANGES`` choices redrawn, and uniform structures."""
    n_columns = len(n_values)
    sizes = np.asarray(n_values)
    candidates = rng.integers(0, sizes, size=(N_CANDIDATES, n_columns))  # uniform draws
    n_local = int(round(N_CANDIDATES * (1 - UNIFORM_SHARE))) if len(templates) else 0
    if n_local == 0:
        return candidates
    local = templates[rng.integers(len(templates), size=n_local)]
    redrawn = rng.integers(0, sizes, size=(n_local, n_columns))
    # a choice the template never made (not asked there) gets a random value; the conditions
    # decide afterwards whether the candidate asks it
    local = np.where(local < 0, redrawn, local)
    # change k random columns per row: those whose random key ranks among the row's k smallest
    changes = rng.integers(1, min(MAX_CHANGES, n_columns) + 1, size=n_local)
    ranks = np.argsort(np.argsort(rng.random((n_local, n_columns)), axis=1), axis=1)
    fresh = rng.integers(0, sizes, size=(n_local, n_columns))
    candidates[:n_local] = np.where(ranks < changes[:, None], fresh, local)
    return candidates


def apply_conditions(
    candidates: np.ndarray, names: Sequence[str], lookups: Sequence[Mapping[Any, int]],
    conditions: Mapping[str, Mapping[str, Sequence[Any]]],
) -> np.ndarray:
    """Each candidate with the params it would not be asked set to ``ABSENT`` (``lookups``:
    per param, its values' codes, as for :func:`encode`)."""
    candidates = candidates.copy()
    column = {name: j for j, name in enumerate(names)}
    # a parent that is itself conditional can switch a child off only once it is settled
    for _ in range(len(conditions)):
        before = candidates.copy()
        for param, parents in conditions.items():
            if param not in column:
                continue
            active = np.ones(len(candidates), dtype=bool)
            for parent, values in parents.items():
                if parent not in column:
                    continue
                codes = lookups[column[parent]]
                allowed = [codes[value_key(v)] for v in values if value_key(v) in codes]
                active &= np.isin(candidates[:, column[parent]], allowed)
            candidates[~active, column[param]] = ABSENT
        if np.array_equal(before, candidates):
            break
    return candidates


def untried(candidates: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Candidates no row matches: a row matches when the candidate agrees with it on every
    param the row asked (a failed prefix covers everything below it).

    Rows are grouped by which params they asked (a handful of patterns: the branches of the
    space), so each group is one set lookup of the candidates' values on those params.
    """
    keep = np.ones(len(candidates), dtype=bool)
    asked = codes != ABSENT
    for mask in unique_rows(asked)[0]:
        if not mask.any():
            continue  # failed before its first structural choice: says nothing about any
        rows = codes[np.all(asked == mask, axis=1)][:, mask]
        keep &= ~np.isin(_as_records(candidates[:, mask]), _as_records(rows))
    return candidates[keep]


def _as_records(array: np.ndarray) -> np.ndarray:
    """Each row of an int array as one opaque value, so whole rows compare in ``np.isin``."""
    array = np.ascontiguousarray(array, dtype=np.int64)
    return array.view(np.dtype((np.void, array.dtype.itemsize * array.shape[1]))).ravel()


def _with_intercept(x: np.ndarray) -> np.ndarray:
    return np.hstack([np.ones((len(x), 1)), x])


