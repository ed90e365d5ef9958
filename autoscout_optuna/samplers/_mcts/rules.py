"""Pairs of choices behind a broken rule: full-length failures that recur (pure).

A trial that asked every param and then failed on a rule of the system (``invalid_combination``:
CUDA graphs cannot capture ZeRO-3 gathers; see :func:`autoscout_optuna._failure.breaks_a_rule`)
does not say which of its choices broke it, and the logistic feasibility model, a sum of
per-choice weights, cannot say "these two together" at all: the same combination came back
three to six times per 100-trial ``llm_training`` study. A pair of choices that two or more such
failures share and that no feasible row contains is the likely culprit, and the failures that
contain it are its evidence, in the dead-pair form of ``prefix.py`` (``1 - 2**-k``: two
failures 0.75, above even a promising path's redraw threshold). One failure names no pair: its
few dozen pairs would shut out every companion of the rule's choices not yet seen to work.
"""

from __future__ import annotations

import numpy as np

from autoscout_optuna.samplers._mcts.descent import _bits


def rule_pairs(codes: np.ndarray, broke: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """The pairs behind the rule failures ``broke``, in ``prefix.dead_pairs``'s row format
    (suspect column and code, culprit column and code, failures).

    Args:
        codes: History table (rows x columns), negative where not asked / out of domain.
        broke: Mask of the full-length rows that failed on a rule.
        feasible: Mask of the rows that ended with a value.
    """
    failures, repeats = np.unique(codes[broke], axis=0, return_counts=True)
    if not len(failures):
        return np.zeros((0, 5), dtype=np.int64)
    # Which feasible rows made each choice, as an int bit mask: a pair was seen to work when
    # its two masks share a bit (one ``&`` per pair, whatever the number of rows).
    ok = codes[feasible]
    made: dict[tuple[int, int], int] = {}
    for column in range(codes.shape[1]):
        for code in np.unique(failures[:, column]):
            if code >= 0:
                made[(column, int(code))] = _bits(ok[:, column] == code)
    counts: dict[tuple[int, int, int, int], int] = {}
    for row, n in zip(failures, repeats, strict=True):
        choices = [(int(j), int(row[j])) for j in np.flatnonzero(row >= 0)]
        for a, first in enumerate(choices):
            for second in choices[a + 1:]:
                if not made[first] & made[second]:
                    key = (*first, *second)
                    counts[key] = counts.get(key, 0) + int(n)
    rows = [[*key, n] for key, n in counts.items() if n >= 2]
    return np.array(rows, dtype=np.int64).reshape(-1, 5)
