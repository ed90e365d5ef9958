"""Pure tree statistics over structural decisions: rewards, nodes, UCT scores of children.

Nothing here knows Optuna. The history is a table: ``codes[i, j]`` is the index of the value
trial ``i`` took for structural param ``j`` in that param's list of values, ``ABSENT`` (-1)
when the trial never asked it (a conditional knob under another parent value) and ``OTHER``
(-2) for a value outside today's list (the domain changed). ``rewards`` and ``weights`` say how
good each row was and how much it counts.

The tree is never stored: a node is the set of rows that agree with the path to it, so its
statistics are recomputed from the table for whatever level order the tournament picked. A row
that lacks a param on the path (it was inactive there) still matches: it says nothing against
the path, and its deeper decisions are still evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ABSENT = -1
OTHER = -2

REAL, ESTIMATE, FAILED, PENDING = "real", "estimate", "failed", "pending"


def normalize_rewards(
    scores: Sequence[float | None],
    kinds: Sequence[str],
    *,
    failure_reward: float = -0.05,
    estimate_weight: float = 0.5,
    pending_weight: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rewards in [0, 1] by rank (larger score is better), and how much each row counts.

    Ranks make "maximize" and "minimize" (already oriented so larger is better) and any scale
    of metric behave the same. Real and estimated scores are ranked together (an estimate is a
    real-or-simulated value of the same metric) but an estimate counts ``estimate_weight``.
    A failed row gets ``failure_reward``, below every real reward, so a path that fails is
    left. A pending row (another worker is running it) counts as the worst real reward seen: a
    constant liar / virtual loss that makes parallel workers spread out.

    Args:
        scores: Oriented scores (None unless the kind is real or estimate).
        kinds: One of ``"real"``, ``"estimate"``, ``"failed"``, ``"pending"`` per row.
        failure_reward: Reward of a failed row (should be below 0, the worst real reward).
        estimate_weight: Weight of a low-fidelity row, in (0, 1].
        pending_weight: Weight of a pending row's virtual loss.

    Returns:
        ``(rewards, weights)``, two float arrays of the rows' length.
    """
    kind = np.array(kinds, dtype=str)
    unknown = ~np.isin(kind, (REAL, ESTIMATE, FAILED, PENDING))
    if unknown.any():
        raise ValueError(f"unknown observation kind {str(kind[unknown][0])!r}")
    rewards = np.zeros(len(kind))
    weights = np.ones(len(kind))
    scored = (kind == REAL) | (kind == ESTIMATE)
    if scored.any():
        values = np.array(scores, dtype=float)[scored]  # None (unscored rows) -> nan, dropped
        rewards[scored] = _average_rank01(values)
    weights[kind == ESTIMATE] = estimate_weight
    rewards[kind == FAILED] = failure_reward
    pending = kind == PENDING
    rewards[pending] = rewards[scored].min() if scored.any() else 0.0
    weights[pending] = pending_weight
    return rewards, weights


def _average_rank01(values: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1], ties sharing their average rank (1.0 = best)."""
    if len(values) == 1:
        return np.ones(1)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    # Average the ranks of equal values so the reward does not depend on row order.
    uniq, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks, minlength=len(uniq))
    counts = np.bincount(inverse, minlength=len(uniq))
    return (sums / counts)[inverse] / (len(values) - 1)


@dataclass(frozen=True)
class ChildScores:
    """UCT view of one node's children (one entry per value of the next param)."""

    visits: np.ndarray  # weighted visits of each child within this node
    value: np.ndarray  # blended estimate of each child's reward
    score: np.ndarray  # value + exploration bonus (inf: untried)


def value_statistics(
    codes: np.ndarray, column: int, n_values: int, rewards: np.ndarray, weights: np.ndarray,
    rows: np.ndarray | None = None, with_best: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted visits, reward sums and best reward of each value of ``column`` over ``rows``
    (all rows: None); the best is -inf where a value has no row (and everywhere without
    ``with_best``, which saves the time when nobody reads it)."""
    col = codes[:, column] if rows is None else codes[rows, column]
    w = weights if rows is None else weights[rows]
    r = rewards if rows is None else rewards[rows]
    taken = col >= 0
    visits = np.bincount(col[taken], weights=w[taken], minlength=n_values)[:n_values]
    sums = np.bincount(col[taken], weights=(w * r)[taken], minlength=n_values)[:n_values]
    best = np.full(n_values, -np.inf)
    if with_best:
        np.maximum.at(best, col[taken], r[taken])
    return visits, sums, best


def child_scores(
    codes: np.ndarray,
    column: int,
    n_values: int,
    rewards: np.ndarray,
    weights: np.ndarray,
    node_rows: np.ndarray,
    *,
    exploration: float,
    rave_equivalence: float,
    rave_visit_share: float,
    global_stats: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    max_backup: float = 0.0,
) -> ChildScores:
    """Score the children of a node: UCB1 on node statistics blended with all-moves-as-first.

    With a few dozen trials a deep node has seen almost nothing, so its children's estimates
    are shrunk (RAVE, Gelly & Silver 2007) toward the same value's statistics over the whole
    history: ``beta = k / (k + n)`` puts weight ``k`` on that prior, vanishing as the node's own
    visits ``n`` grow. A child no row has ever taken is untried and goes first (score inf).

    Args:
        codes: The history table (rows x params).
        column: Which param the children are values of.
        n_values: How many values it has (children ``0 .. n_values - 1``).
        rewards: Normalized rewards per row.
        weights: Weights per row.
        node_rows: Indices of the rows in this node (see :func:`node_rows`).
        exploration: UCB1 constant ``c``.
        rave_equivalence: ``k``, visits at which node and global statistics weigh the same.
        rave_visit_share: How much a global visit counts as a visit of the node in the bonus.
        global_stats: ``value_statistics`` of the column over all rows, if already computed.
        max_backup: ``lambda`` in ``(1 - lambda) * mean + lambda * best``: we search for the
            best configuration, not the best average, so a subtree's best result counts too
            (max-backup MCTS); 0 is plain UCT.
    """
    w_node, s_node, b_node = value_statistics(
        codes, column, n_values, rewards, weights, node_rows, with_best=max_backup > 0
    )
    if global_stats is None:
        global_stats = value_statistics(
            codes, column, n_values, rewards, weights, with_best=max_backup > 0
        )
    w_all, s_all, b_all = global_stats
    with np.errstate(invalid="ignore", divide="ignore"):
        q_node = np.where(w_node > 0, s_node / np.maximum(w_node, 1e-12), 0.0)
        q_all = np.where(w_all > 0, s_all / np.maximum(w_all, 1e-12), 0.0)
        if max_backup > 0:
            q_node = np.where(w_node > 0, (1 - max_backup) * q_node + max_backup * b_node, 0.0)
            q_all = np.where(w_all > 0, (1 - max_backup) * q_all + max_backup * b_all, 0.0)
        beta = rave_equivalence / (rave_equivalence + w_node)
        value = (1.0 - beta) * q_node + beta * q_all
        effective = w_node + rave_visit_share * w_all
        parent = float(w_node.sum()) + rave_visit_share * float(w_all.sum())
        bonus = exploration * np.sqrt(np.log(1.0 + parent) / effective)
    score = np.where(effective > 0, value + bonus, np.inf)
    return ChildScores(visits=w_node, value=value, score=score)


def pick(scores: np.ndarray, rng: np.random.Generator, allowed: np.ndarray | None = None) -> int:
    """Index of the best score (ties broken at random), among ``allowed`` ones if given."""
    masked = scores.astype(float).copy()
    if allowed is not None:
        masked[~allowed] = -np.inf
    best = masked.max()
    if best == -np.inf:
        candidates = np.flatnonzero(allowed) if allowed is not None else np.arange(len(scores))
        if len(candidates) == 0:
            candidates = np.arange(len(scores))
    else:
        candidates = np.flatnonzero(masked == best)
    return int(candidates[rng.integers(len(candidates))])


def node_rows(codes: np.ndarray, decided: dict[int, int]) -> np.ndarray:
    """Indices of the rows that agree with ``decided`` (column -> code); a row lacking a
    column still agrees (it was inactive there, so it says nothing against the path)."""
    rows = np.arange(len(codes))
    for column, code in decided.items():
        rows = narrow(codes, rows, column, code)
    return rows


def narrow(codes: np.ndarray, rows: np.ndarray, column: int, code: int) -> np.ndarray:
    """The rows of a child node: those of ``rows`` that took ``code`` or lack ``column``."""
    col = codes[rows, column]
    return rows[(col == code) | (col == ABSENT)]


def row_keys(rows: np.ndarray, low: int, base: int) -> np.ndarray | None:
    """Each int row as one int64: its values minus ``low`` as digits in ``base``, the first
    column most significant (so keys sort as the rows do); None where a key could overflow.
    Every value must lie in ``[low, low + base)``."""
    if base ** rows.shape[1] >= 2**62:
        return None
    powers = base ** np.arange(rows.shape[1] - 1, -1, -1, dtype=np.int64)
    return (rows.astype(np.int64) - low) @ powers  # integers: exact, and no BLAS


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True, return_counts=True)`` for int rows.

    Each row becomes one int64 key (its codes as digits, the first column most significant),
    so the rows sort as a 1-D array, in the same lexicographic order: ``np.unique`` with
    ``axis=0`` sorts a structured view instead, 10x slower on a few hundred rows, and the
    feasibility model does it several times per plan. Falls back to it when the key would
    overflow.

    Returns:
        ``(unique rows, index of each row's unique row, count of each unique row)``.
    """
    rows = np.asarray(rows)
    if len(rows) == 0:
        return rows, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low = int(rows.min())
    key = row_keys(rows, low, int(rows.max()) - low + 1)
    if key is None:
        unique, inverse, counts = np.unique(
            rows, axis=0, return_inverse=True, return_counts=True
        )
        return unique, inverse.reshape(-1), counts
    _, first, inverse, counts = np.unique(
        key, return_index=True, return_inverse=True, return_counts=True
    )
    return rows[first], inverse.reshape(-1), counts
