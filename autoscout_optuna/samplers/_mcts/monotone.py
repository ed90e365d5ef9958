"""Monotone infeasibility: a structure at least as heavy as a known failure fails too (pure).

Out-of-memory is (nearly) monotone: given the other choices, memory grows or shrinks
monotonically along each ordinal knob (more micro-batch, less sharding, no recomputation). The
logistic model of ``feasibility.py`` is a soft additive threshold and, shrunk by its penalty,
rarely calls a structure certain to fail; the dominance rule here is a sharp boundary:

* every column gets a *heaviness* per value, learned from the data: a numeric column (ints,
  ordered floats, booleans) is ordered by its values, in the direction in which the logistic
  weights of its values rise (failure grows), or not at all when they do not rise or fall
  consistently; a column of other values (strings) is ordered by those weights themselves.
  Unseen values of a numeric column are placed by the order (extrapolation is the point); of
  an unordered column they have no heaviness.
* a candidate *dominates* a known failure when in every column both rows lack the param, take
  the same value, or the candidate's value is at least as heavy; it is then predicted to fail.
  Symmetrically a candidate dominated by a known success is predicted feasible.
* a failure that some success dominates is not explained by the order (an invalid
  combination, a failure caused by other knobs): that pair stops being evidence on both sides.

Everything is refitted from the table on every plan (no state to keep).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscout_optuna.samplers._mcts.tree import OTHER, unique_rows

# Minimum |correlation| between a numeric column's value order and its logistic weights for
# the column to get a direction: below it the data do not say which way failure grows.
MIN_CORRELATION = 0.6
# Bytes of anchor bit masks gathered at once (bounds the temporaries of ``_passes``).
CELLS_PER_BLOCK = 1 << 20


@dataclass(frozen=True)
class DominanceModel:
    """Known failures and successes a candidate can be compared with, and how heavy each value
    of each column is (``heaviness[j, code]``, NaN: only equal values compare)."""

    heaviness: np.ndarray
    failures: np.ndarray
    successes: np.ndarray

    def verdicts(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``codes``: (dominates a known failure, dominated by a known success)."""
        rows = np.atleast_2d(codes)
        return _passes(rows, self._failure_masks), _passes(rows, self._success_masks)

    # A model answers a plan's every P(FAIL) question: its anchors' masks are built once.
    @functools.cached_property
    def _failure_masks(self) -> np.ndarray | None:
        return _anchor_masks(self.failures, self.heaviness, heavier=True)

    @functools.cached_property
    def _success_masks(self) -> np.ndarray | None:
        return _anchor_masks(self.successes, self.heaviness, heavier=False)


def fit_dominance(
    codes: np.ndarray,
    numeric: Sequence[np.ndarray | None],
    weights: Sequence[np.ndarray],
    failed: np.ndarray,
    feasible: np.ndarray,
) -> DominanceModel:
    """Learn each column's order from the logistic ``weights`` and keep consistent anchors.

    Args:
        codes: History table (rows x columns), ``ABSENT`` / ``OTHER`` (negative) as in ``tree``.
        numeric: Per column, the numeric value of each code (None: values are not numbers).
        weights: Per column, the logistic weight of each code (larger: more failure).
        failed: Mask of the failed rows that may serve as anchors.
        feasible: Mask of the rows that ended with a value.

    Returns:
        The model; without anchors it predicts nothing either way.
    """
    seen = _seen_codes(codes[feasible | failed], [len(w) for w in weights])
    width = max((len(w) for w in weights), default=0)
    heaviness = np.full((len(weights), width), np.nan)
    for j, (w, values) in enumerate(zip(weights, numeric, strict=True)):
        heaviness[j, : len(w)] = _column_heaviness(np.asarray(w, float), values, seen[j])
    # Trials that share a structure (dense refinements of one layout) are one anchor: the rule
    # only asks whether *any* anchor dominates, and a long study repeats its structures
    # thousands of times (5,000 trials on 300 structures, 20 % failed: 0.55 s per plan
    # without this, 15 ms with).
    failures = unique_rows(codes[failed])[0]
    successes = unique_rows(codes[feasible])[0]
    # A success at least as heavy as a failure contradicts the order: drop both from evidence.
    return DominanceModel(
        heaviness,
        failures[~_passes(failures, _anchor_masks(successes, heaviness, heavier=False))],
        successes[~_passes(successes, _anchor_masks(failures, heaviness, heavier=True))],
    )


def _seen_codes(rows: np.ndarray, n_values: Sequence[int]) -> list[np.ndarray]:
    """Per column, a mask of its codes that some row takes (``ABSENT`` / ``OTHER`` none)."""
    seen = []
    for j, n in enumerate(n_values):
        mask = np.zeros(n, dtype=bool)
        column = rows[:, j]
        mask[column[(column >= 0) & (column < n)]] = True
        seen.append(mask)
    return seen


def _column_heaviness(
    weights: np.ndarray, values: np.ndarray | None, seen: np.ndarray
) -> np.ndarray:
    """Heaviness of each value of one column (NaN where no order is known)."""
    out = np.full(len(weights), np.nan)
    if seen.sum() < 2:
        return out
    if values is None:
        out[seen] = weights[seen]  # an order the data give, for the values they cover
        return out
    r = correlation(np.asarray(values, float)[seen], weights[seen])
    if abs(r) >= MIN_CORRELATION:
        out[:] = np.sign(r) * np.asarray(values, float)
    return out


def correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; 0 where either side does not vary (a constant says nothing of order)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def _anchor_masks(
    anchors: np.ndarray, heaviness: np.ndarray, *, heavier: bool
) -> np.ndarray | None:
    """``[column, code - OTHER]``: the anchors a row with that code passes in that column, as
    packed bits; passing means at least as heavy as the anchor there (``heavier``) or at most
    as heavy (not ``heavier``). None without anchors.

    A column's comparison depends only on the two codes in it, so a row's anchors are the AND
    of its columns' masks (:func:`_passes`): rows x anchors / 8 byte operations per column.
    Comparing every pair of rows cell by cell instead (1,500 model-arm candidates against
    hundreds of anchors, several times per trial) made AutoScoutSampler cost 97 ms of CPU per
    trial over trials 1,000-1,199 of ``llm_training`` 8B, against 53 ms this way (the same
    trials).
    """
    if not len(anchors):
        return None
    codes = np.arange(OTHER, heaviness.shape[1])  # every code a column can hold, OTHER up
    h = np.hstack([np.full((len(heaviness), -OTHER), np.nan), heaviness])  # negative: no order
    # Equal codes compare (both absent included), except OTHER: two out-of-domain values
    # need not be the same value. NaN compares False: no order, no claim.
    same = (codes[:, None] == codes[None, :]) & (codes != OTHER)[:, None]
    order = same | (h[:, :, None] >= h[:, None, :])  # [column, p, q]: p at least as heavy as q
    if not heavier:
        order = order.transpose(0, 2, 1)
    columns = np.arange(len(heaviness))[:, None, None]
    passed = order[columns, np.arange(len(codes))[None, :, None], (anchors.T - OTHER)[:, None, :]]
    return np.packbits(passed, axis=2)


def _passes(rows: np.ndarray, masks: np.ndarray | None) -> np.ndarray:
    """Per row: whether some anchor of ``masks`` (:func:`_anchor_masks`) passes every column."""
    out = np.zeros(len(rows), dtype=bool)
    if masks is None:
        return out
    columns = np.arange(len(masks))
    # in blocks of rows, so the rows x columns x anchor-bytes gather stays within a few MB
    block = max(1, CELLS_PER_BLOCK // (masks.shape[0] * masks.shape[2]))
    for start in range(0, len(rows), block):
        gathered = masks[columns, rows[start:start + block] - OTHER]
        out[start:start + block] = np.bitwise_and.reduce(gathered, axis=1).any(axis=1)
    return out
