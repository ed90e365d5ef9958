"""Which structural params are asked only under some values of another, read from encoded rows.

The model arm needs the dependency tree on every proposal (a candidate leaves a param out where
it would not be asked). Every fact the tree rests on is an AND or an OR over rows: whether a
param was asked in every row, whether ``q`` was asked in every row that asked ``p``, which
values rows that asked ``p`` took, which values any row took. So :class:`ConditionEvidence`
takes rows as trials finish, in any order and with repeats, and answers what one pass over all
the rows gives (:func:`conditions_of`) without reading the old rows again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autoscout_optuna.samplers._autoscout.startup import choice_key
from autoscout_optuna.samplers._mcts.feasibility import one_hot
from autoscout_optuna.samplers._mcts.tree import ABSENT, unique_rows


class ConditionEvidence:
    """The AND/OR facts of the rows added so far (see the module doc).

    Args:
        offsets: Where each param's block of value columns starts, and last their total
            (``offsets[j] + code`` is the column of param ``j``'s value ``code``).
    """

    def __init__(self, offsets: np.ndarray) -> None:
        n_params, n_columns = len(offsets) - 1, int(offsets[-1])
        self.offsets = offsets
        self.everywhere = np.ones(n_params, dtype=bool)  # p asked in every row
        self.co_asked = np.ones((n_params, n_params), dtype=bool)  # q asked wherever p was
        self.under = np.zeros((n_params, n_columns), dtype=bool)  # a row asking p took value v
        self.seen = np.zeros(n_columns, dtype=bool)  # some row took value v

    def copy(self) -> ConditionEvidence:
        twin = ConditionEvidence(self.offsets)
        for name in ("everywhere", "co_asked", "under", "seen"):
            setattr(twin, name, getattr(self, name).copy())
        return twin

    def add(self, codes: np.ndarray) -> None:
        """Add encoded rows (``ABSENT`` where a param was not asked; a value outside today's
        lists is encoded as not asked)."""
        if len(codes) == 0:
            return
        asked = (codes != ABSENT).astype(np.int64)
        present = one_hot(codes, self.offsets) > 0
        self.everywhere &= asked.all(axis=0)
        # integer products: counts of rows, exact, and numpy does not send them to BLAS
        self.co_asked &= (asked.T @ (1 - asked)) == 0
        self.under |= (asked.T @ present.astype(np.int64)) > 0
        self.seen |= present.any(axis=0)

    def conditions(
        self, names: Sequence[str], value_lists: Sequence[Sequence[Any]]
    ) -> dict[str, dict[str, list[Any]]]:
        """``{p: {q: values of q under which p was asked}}`` where ``q`` was asked wherever
        ``p`` was and ``p`` only under some of ``q``'s values."""
        conditions: dict[str, dict[str, list[Any]]] = {}
        for p, name in enumerate(names):
            if self.everywhere[p]:
                continue  # asked everywhere: unconditional
            parents = self.co_asked[p].copy()
            parents[p] = False
            under = self.under[p]
            for q in np.flatnonzero(parents):
                block = slice(self.offsets[q], self.offsets[q + 1])
                if (under[block] != self.seen[block]).any():  # some value of q never had p
                    values = [value_lists[q][k] for k in np.flatnonzero(under[block])]
                    # in the order infer_conditions gives: by the repr of the value's key
                    conditions.setdefault(name, {})[names[q]] = sorted(
                        values, key=lambda v: repr(choice_key(v)))
        return conditions


def value_offsets(value_lists: Sequence[Sequence[Any]]) -> np.ndarray:
    """Where each param's block of one-hot columns starts (and, last, their total)."""
    return np.concatenate([[0], np.cumsum([len(v) for v in value_lists])]).astype(int)


def conditions_of(
    codes: np.ndarray, names: Sequence[str], value_lists: Sequence[Sequence[Any]]
) -> dict[str, dict[str, list[Any]]]:
    """:func:`~autoscout_optuna.samplers._autoscout.startup.infer_conditions` read from
    encoded rows (a value outside today's lists counts as not asked), in one pass over the
    distinct rows."""
    evidence = ConditionEvidence(value_offsets(value_lists))
    evidence.add(unique_rows(codes)[0] if len(codes) else codes)
    return evidence.conditions(names, value_lists)
