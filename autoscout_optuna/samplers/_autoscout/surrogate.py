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
uniformly drawn structures; a candidate already run (or failed, or running; for one only
estimated see :func:`settled_rows`) is left out, as is one the feasibility model of MCTS
(:mod:`~autoscout_optuna.samplers._mcts.feasibility`) expects to fail, with the evidence
MCTS uses: the logistic fit and monotone rule on full-length failures, the dead pairs of
prefix failures (an invalid layout found while suggesting; here only those that two failures
attest) and the patterns rule failures share. The best draw among the rest is proposed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscout_optuna.samplers._autoscout.conditions import value_offsets
from autoscout_optuna.samplers._mcts.encoding import value_key
from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility, numeric_values
from autoscout_optuna.samplers._mcts.tree import ABSENT, row_keys, unique_rows

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
# Prefix failures that must blame a pair of choices before the arm avoids it. One failure names
# every earlier choice as a suspect beside the culprit (P(FAIL) 0.5, over the arm's 0.2 bar), so
# it shut out good pairs: against the arm without these pairs (seeds 0-239, 100 trials), on
# ``llm_training`` 70B best/optimum -0.009 with one failure, -0.002 with two; on 8B 2.5 and 1.4
# fewer FAIL trials per seed after trial 20.
DEAD_PAIR_FAILURES = 2
# A PRUNED trial's estimate against a real value, unless the caller says otherwise (the
# sampler passes its ``estimate_weight``).
ESTIMATE_WEIGHT = 0.5
# Estimates of one structure before it counts as tried (see ``settled_rows``).
ESTIMATE_LOOKS = 3


@dataclass(frozen=True)
class Proposal:
    """A structure to run, and the numbers that chose it (recorded as a user attr)."""

    values: dict[str, Any]
    predicted: float
    p_fail: float
    n_candidates: int
    earlier_estimates: int = 0  # PRUNED trials of this structure: a second or third look

    def as_dict(self) -> dict[str, Any]:
        return {"predicted_z": round(self.predicted, 4), "p_fail": round(self.p_fail, 3),
                "candidates": self.n_candidates, "earlier_estimates": self.earlier_estimates}


def propose(
    names: Sequence[str],
    value_lists: Sequence[Sequence[Any]],
    rows: Sequence[Mapping[str, Any]],
    kinds: Sequence[str],
    scores: Sequence[float | None],
    conditions: Mapping[str, Mapping[str, Sequence[Any]]],
    rng: np.random.Generator,
    broke_rule: Sequence[bool] | None = None,
    memory: Sequence[float] | None = None,
    estimate_weight: float = ESTIMATE_WEIGHT,
) -> Proposal | None:
    """The structure the model arm runs next; None with fewer than ``MIN_SCORED`` scored
    trials or when every candidate was run already.

    Args:
        names: Structural params (model features), in a fixed order.
        value_lists: Every value of each of ``names``.
        rows: Each trial's params in ask order (structural ones are encoded; every param
            counts toward the ask positions, :func:`ask_positions`).
        kinds: ``"real"``, ``"estimate"``, ``"failed"`` or ``"pending"`` per row.
        scores: Oriented score per row (larger is better; None unless real or estimate).
        conditions: ``{param: {parent: values under which param is asked}}``
            (``startup.infer_conditions``): a candidate leaves a param out where it would not
            be asked.
        rng: Source of the candidates and the Thompson draw.
        broke_rule: Per row, whether it failed on a broken rule
            (:func:`autoscout_optuna._failure.breaks_a_rule`); None: none did.
        memory: Per row, the peak memory over capacity it reported (NaN: none;
            :mod:`autoscout_optuna._memory`); None: no row did.
        estimate_weight: Weight of an ``"estimate"`` row in the ridge, a real one's being 1.
    """
    codes = encode(names, value_lookups(value_lists), rows)
    return propose_encoded(
        names, value_lists, codes, kinds, scores, conditions, rng,
        positions=ask_positions(names, rows),
        broke_rule=None if broke_rule is None else np.asarray(broke_rule, dtype=bool),
        memory=None if memory is None else np.asarray(memory, dtype=float),
        estimate_weight=estimate_weight,
    )


def propose_encoded(
    names: Sequence[str],
    value_lists: Sequence[Sequence[Any]],
    codes: np.ndarray,
    kinds: Sequence[str],
    scores: Sequence[float | None],
    conditions: Mapping[str, Mapping[str, Sequence[Any]]],
    rng: np.random.Generator,
    gram: np.ndarray | None = None,
    positions: np.ndarray | None = None,
    broke_rule: np.ndarray | None = None,
    memory: np.ndarray | None = None,
    estimate_weight: float = ESTIMATE_WEIGHT,
    settled: np.ndarray | None = None,
    memory_estimate: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Proposal | None:
    """:func:`propose` on trials already encoded (``codes``, as :func:`encode` returns);
    ``gram``, where the caller keeps it, is :func:`weighted_gram` of these trials'
    :func:`scored_grams` at this ``estimate_weight``;
    ``positions`` (:func:`ask_positions`) and ``broke_rule``, where given, let the feasibility
    model name the dead pairs of prefix failures and the patterns of rule failures;
    ``memory``, where given, fits its memory model (``_mcts/memory.py``), or with
    ``memory_estimate`` (codes -> estimated peak over capacity) calibrates that estimate
    (``_mcts/estimate.py``; a candidate it cannot answer for because the inferred conditions
    left out a param it needs is checked, and planned, with that param drawn:
    :func:`complete_unestimated`);
    ``settled``, where given, marks the estimates that keep their structure tried as a real
    run does (see :func:`settled_rows`)."""
    lookups = value_lookups(value_lists)
    kind = np.asarray(kinds, dtype=str)
    scored = _scored(kind)
    if scored.sum() < MIN_SCORED:
        return None
    n_values = [len(v) for v in value_lists]
    offsets = value_offsets(value_lists)
    scored_scores = np.asarray(scores, dtype=float)[scored]
    weights = draw_weights(
        feature_indices(codes[scored], offsets), 1 + int(offsets[-1]),
        log_scores(scored_scores), _ridge_weights(kind[scored], estimate_weight), rng,
        gram=gram, offsets=offsets,
    )
    order = np.argsort(-scored_scores, kind="stable")
    templates = codes[np.flatnonzero(scored)[order[:N_TEMPLATES]]]
    candidates = make_candidates(templates, n_values, rng)
    candidates = apply_conditions(candidates, names, lookups, conditions)
    candidates = untried(unique_rows(candidates)[0], settled_rows(codes, kind, settled))
    if len(candidates) == 0:
        return None
    feasibility = fit_feasibility(
        codes, n_values, kind == "failed", scored,
        numeric=[numeric_values(values) for values in value_lists],
        positions=positions, broke_rule=broke_rule, dead_pair_failures=DEAD_PAIR_FAILURES,
        memory=memory, estimate=memory_estimate,
    )
    p_fail = feasibility.p_fail(candidates)
    runs_as = candidates
    if memory_estimate is not None and feasibility.predicts_memory:
        runs_as = complete_unestimated(candidates, memory_estimate, n_values, rng)
        # p_fail already holds every other row's P(out of memory): only the completed change
        completed = np.flatnonzero(np.any(runs_as != candidates, axis=1))
        if len(completed):
            p_fail[completed] = np.maximum(
                p_fail[completed], feasibility.p_out_of_memory(runs_as[completed]))
    predicted = predict(feature_indices(candidates, offsets), weights)
    allowed = p_fail <= MAX_FAIL_PROBABILITY
    if allowed.any():
        best = int(np.argmax(np.where(allowed, predicted, -np.inf)))
    else:
        best = int(np.argmin(p_fail))
    values = {name: value_lists[j][runs_as[best, j]] for j, name in enumerate(names)
              if runs_as[best, j] >= 0}
    earlier = int(np.all(codes[kind == "estimate"] == candidates[best], axis=1).sum())
    return Proposal(values, float(predicted[best]), float(p_fail[best]), len(candidates),
                    earlier)


def complete_unestimated(
    candidates: np.ndarray, memory_estimate: Callable[[np.ndarray], np.ndarray],
    n_values: Sequence[int], rng: np.random.Generator,
) -> np.ndarray:
    """The candidates as they would run: one the estimate cannot answer for while it leaves
    params out gets those params drawn at random, where the completed structure has an estimate.

    The conditions are inferred from the trials so far, and after failed prefixes they can be
    wrong: a param they leave out is then asked anyway and drawn at random when the trial runs,
    and the structure checked was not the one run (on ``llm_training`` 70B the worst
    out-of-memory failures of the model arm were such candidates). An estimate that needs a
    param the candidate lacks says so by giving none; the completed row is then the one checked,
    and its values go into the plan, so the trial runs what was checked. A param the study
    really does not ask is ignored by the estimate and by the trial alike.
    """
    missing = (candidates == ABSENT).any(axis=1)
    if missing.any():  # only a row that leaves a param out can lack an estimate for it
        missing[missing] = np.isnan(memory_estimate(candidates[missing]))
    if not missing.any():
        return candidates
    draws = rng.integers(0, np.asarray(n_values), size=(int(missing.sum()), candidates.shape[1]))
    partial = candidates[missing]
    filled = np.where(partial == ABSENT, draws, partial)
    known = ~np.isnan(memory_estimate(filled))
    completed = candidates.copy()
    completed[np.flatnonzero(missing)[known]] = filled[known]
    return completed


def settled_rows(
    codes: np.ndarray, kind: np.ndarray, settled: np.ndarray | None = None
) -> np.ndarray:
    """The rows that make a structure "tried": all but the estimates of a structure seen only
    through fewer than ``ESTIMATE_LOOKS`` of them, with other dense values than the trial's.

    A pruned trial's estimate is one noisy look: a structure whose single estimate drew the
    simulator's noise low would otherwise never be proposed again, whatever the model learns
    of its choices later (``fidelity-long``, 20 % noise: the stalled seeds never returned to
    the optimum's structure after one poor estimate). Proposed again, it runs with the dense
    values the trial gets; an estimate made with those very values is the same
    configuration, which a deterministic simulator would only score the same again, and an
    estimate the pruner judged measurement-grade is as good as a real run: such estimates
    (``settled``, per row; ``relook.settling_estimates``) count as tried at once. ``settled``
    None: none does, every estimate may be looked past.
    """
    estimate = kind == "estimate"
    # the estimates that may be looked past: all of them but the settled ones
    open_looks = estimate if settled is None else estimate & ~np.asarray(settled, dtype=bool)
    if not open_looks.any():
        return codes
    _, inverse, counts = unique_rows(codes[estimate])
    looks = np.zeros(len(codes), dtype=np.int64)
    looks[estimate] = counts[inverse]
    return codes[~open_looks | (looks >= ESTIMATE_LOOKS)]


def value_lookups(value_lists: Sequence[Sequence[Any]]) -> list[dict[Any, int]]:
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


def ask_positions(names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """``positions[i, j]``: where ``names[j]`` came in row ``i``'s ask order (its place among
    the row's params, dense ones included, as MCTS counts them); -1 if not asked."""
    positions = np.full((len(rows), len(names)), -1, dtype=np.int64)
    column = {name: j for j, name in enumerate(names)}
    for i, params in enumerate(rows):
        for place, name in enumerate(params):
            j = column.get(name)
            if j is not None:
                positions[i, j] = place
    return positions


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


def feature_indices(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the model weight of each choice: column 0 the intercept (weight 0), then per
    param ``1 + offsets[j] + code`` (-1 where the param was not asked: no weight)."""
    chosen = np.where(codes >= 0, 1 + offsets[:-1] + codes, -1)
    return np.hstack([np.zeros((len(codes), 1), dtype=int), chosen])


def predict(features: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The model's value of each row of :func:`feature_indices`."""
    padded = np.append(weights, 0.0)  # index -1 (not asked) reads the appended 0
    return padded[features].sum(axis=1)


def _scored(kind: np.ndarray) -> np.ndarray:
    """Which rows the ridge fits: those with a score."""
    return (kind == "real") | (kind == "estimate")


def _ridge_weights(kind: np.ndarray, estimate_weight: float) -> np.ndarray:
    """Each scored row's weight in the ridge: ``estimate_weight`` for an estimate."""
    return np.where(kind == "estimate", estimate_weight, 1.0)


def scored_grams(codes: np.ndarray, kinds: Sequence[str], offsets: np.ndarray) -> np.ndarray:
    """The ridge's ``X^T X`` over the real rows of ``codes`` and over the estimate rows, as
    ``[real, estimate]`` (:func:`gram_matrix` with unit weights; combine them with
    :func:`weighted_gram`).

    Their entries are counts: exact in floating point in any order, so the sum of the grams of
    two parts of a history is, bit for bit, the grams of the whole (a caller can keep them and
    add only new rows), at any estimate weight.
    """
    kind = np.asarray(kinds, dtype=str)
    n_weights = 1 + int(offsets[-1])
    grams = np.zeros((2, n_weights, n_weights))
    for g, part in enumerate(("real", "estimate")):
        rows = kind == part
        if rows.any():  # most studies have no estimates, and a read often no finished rows
            grams[g] = gram_matrix(feature_indices(codes[rows], offsets), n_weights,
                                   np.ones(int(rows.sum())))
    return grams


def weighted_gram(grams: np.ndarray, estimate_weight: float) -> np.ndarray:
    """``X^T W X`` of the ridge from :func:`scored_grams`: estimate rows at ``estimate_weight``."""
    return grams[0] + estimate_weight * grams[1]


def gram_matrix(features: np.ndarray, n_weights: int, w: np.ndarray) -> np.ndarray:
    """``X^T W X`` of the one-hot design whose rows are ``features`` (from
    :func:`feature_indices`), weighted by ``w``: counted, not multiplied.

    Matrix products through BLAS spin its threads when the cores are busy (a ~1,000 x 60
    product took 39 ms instead of 0.3 beside another process on 2 cores).
    """
    n, m = features.shape
    # Each weight sits in one column (the intercept in column 0, each param in its own block),
    # so a pair of columns j < k fills only entries above the diagonal of its own blocks: the
    # pairs j < k counted once and mirrored, plus each row's own weights on the diagonal, sum
    # the same terms in the same order as all m * m pairs would, at less than half the work.
    chosen = features >= 0
    left, right = np.triu_indices(m, 1)  # every pair of columns j < k
    first, second = features[:, left], features[:, right]
    pairs = (first >= 0) & (second >= 0)
    row_weights = np.broadcast_to(w[:, None], first.shape)
    half = np.bincount(
        (first * n_weights + second)[pairs], weights=row_weights[pairs],
        minlength=n_weights * n_weights,
    ).reshape(n_weights, n_weights)
    own = np.bincount(features[chosen], weights=np.broadcast_to(w[:, None], (n, m))[chosen],
                      minlength=n_weights)
    return half + half.T + np.diag(own)


def draw_weights(
    features: np.ndarray, n_weights: int, y: np.ndarray, w: np.ndarray,
    rng: np.random.Generator, gram: np.ndarray | None = None,
    offsets: np.ndarray | None = None,
) -> np.ndarray:
    """One draw of (intercept, weights) from the Bayesian ridge posterior.

    The design is one-hot, so ``X^T W X`` (:func:`gram_matrix`; ``gram`` where the caller
    has it) and ``X^T W y`` are sums over each row's chosen weights (``features``, from
    :func:`feature_indices`). With ``offsets`` (:func:`value_offsets` of the params), a choice
    no scored row made is drawn around the best posterior mean among its param's made
    choices instead of around 0 (:func:`optimistic_unseen`).
    """
    if gram is None:
        gram = gram_matrix(features, n_weights, w)
    m = features.shape[1]
    chosen = features >= 0
    rhs = np.bincount(features[chosen], weights=np.repeat(w * y, m)[chosen.ravel()],
                      minlength=n_weights)
    prior = np.full(n_weights, PRIOR_PRECISION)
    prior[0] = 1e-6
    precision = gram + np.diag(prior)
    mean = np.linalg.solve(precision, rhs)
    if offsets is not None:
        mean = optimistic_unseen(mean, np.diag(gram) == 0, offsets)
    residual = y - predict(features, mean)
    variance = max(float((w * residual**2).sum() / max(w.sum() - 1.0, 1.0)),
                   MIN_RESIDUAL_VARIANCE)
    # Sample N(mean, variance * precision^-1) through the Cholesky factor of the precision.
    factor = np.linalg.cholesky(precision)
    noise = np.linalg.solve(factor.T, rng.standard_normal(len(mean)))
    return mean + np.sqrt(variance) * noise


def optimistic_unseen(mean: np.ndarray, unseen: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``mean`` with each choice no scored row made (``unseen``, per weight) set to the best
    mean among the made choices of its param (none made: left at the prior's 0).

    Why: a choice whose every trial failed (or that no trial made) has said nothing about speed,
    and failures are the feasibility model's evidence, not the score model's. At the prior's 0,
    the average structure, such a choice loses to the incumbent's proven choices in every
    draw, and so does every structure that needs it, however light its companions: on
    ``llm_training`` 8B, where ``tp`` 1 runs out of memory with any micro-batch above 1 and the
    optimum is ``tp`` 1 with micro-batch 1, the ridge (seeds 0-5 of AutoScout alone, trial 100,
    the five still on ``tp`` 2) put that structure with ZeRO 2 0.5-2.2 standard deviations
    below the ``tp`` 2 incumbent (it is 0.94-0.997 of the optimum), its P(FAIL) under the
    arm's bar in two of the five. Left as good as its param's best, the feasibility bar decides.
    """
    mean = mean.copy()
    for j in range(len(offsets) - 1):
        block = np.arange(1 + offsets[j], 1 + offsets[j + 1])
        made = block[~unseen[block]]
        if len(made) and len(made) < len(block):
            mean[block[unseen[block]]] = mean[made].max()
    return mean


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
    keys = rng.random((n_local, n_columns))
    kth = np.sort(keys, axis=1)[np.arange(n_local), changes - 1]
    fresh = rng.integers(0, sizes, size=(n_local, n_columns))
    candidates[:n_local] = np.where(keys <= kth[:, None], fresh, local)
    return candidates


def apply_conditions(
    candidates: np.ndarray, names: Sequence[str], lookups: Sequence[Mapping[Any, int]],
    conditions: Mapping[str, Mapping[str, Sequence[Any]]],
) -> np.ndarray:
    """Each candidate with the params it would not be asked set to ``ABSENT`` (``lookups``:
    per param, its values' codes, as for :func:`encode`)."""
    candidates = candidates.copy()
    column = {name: j for j, name in enumerate(names)}
    # per (param, parent): which of the parent's codes ask the param, as a table indexed by the
    # code, with one more slot (last, False) that ``ABSENT`` (-1) reads
    tables = []
    for param, parents in conditions.items():
        if param not in column:
            continue
        tests = []
        for parent, values in parents.items():
            if parent not in column:
                continue
            codes = lookups[column[parent]]
            table = np.zeros(max(codes.values(), default=-1) + 2, dtype=bool)
            table[[codes[value_key(v)] for v in values if value_key(v) in codes]] = True
            tests.append((column[parent], table))
        tables.append((column[param], tests))
    # a parent that is itself conditional can switch a child off only once it is settled
    for _ in range(len(conditions)):
        before = candidates.copy()
        for j, tests in tables:
            active = np.ones(len(candidates), dtype=bool)
            for q, table in tests:
                active &= table[candidates[:, q]]
            candidates[~active, j] = ABSENT
        if np.array_equal(before, candidates):
            break
    return candidates


def untried(candidates: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Candidates no row matches: a row matches when the candidate agrees with it on every
    param the row asked (a failed prefix covers everything below it).

    Rows are grouped by which params they asked (a handful of patterns: the branches of the
    space), so each group is one set lookup of the candidates' values on those params, each
    row of values one int64 key (:func:`~autoscout_optuna.samplers._mcts.tree.row_keys`).
    """
    keep = np.ones(len(candidates), dtype=bool)
    if len(codes) == 0 or len(candidates) == 0:
        return candidates[keep]
    asked = codes != ABSENT
    masks, group, _ = unique_rows(asked)
    low = min(int(codes.min()), int(candidates.min()))
    base = max(int(codes.max()), int(candidates.max())) - low + 1
    for g, mask in enumerate(masks):
        if not mask.any():
            continue  # failed before its first structural choice: says nothing about any
        mine, rows = candidates[:, mask], codes[group == g][:, mask]
        keys = row_keys(mine, low, base)
        if keys is None:
            keep &= ~np.isin(_as_records(mine), _as_records(rows))
            continue
        # a binary search in the sorted row keys: np.isin sorts both sides (5x the time)
        taken = np.sort(row_keys(rows, low, base))
        place = np.minimum(np.searchsorted(taken, keys), len(taken) - 1)
        keep &= taken[place] != keys
    return candidates[keep]


def _as_records(array: np.ndarray) -> np.ndarray:
    """Each row of an int array as one opaque value, so whole rows compare in ``np.isin``."""
    array = np.ascontiguousarray(array, dtype=np.int64)
    return array.view(np.dtype((np.void, array.dtype.itemsize * array.shape[1]))).ravel()
