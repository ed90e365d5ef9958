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


def rule_pairs(codes: np.ndarray, broke: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """The pairs behind the rule failures ``broke``, in ``prefix.dead_pairs``'s row format
    (suspect column and code, culprit column and code, failures).

    Args:
        codes: History table (rows x columns), negative where not asked / out of domain.
        broke: Mask of the full-length rows that failed on a rule.
        feasible: Mask of the rows that ended with a value.
    """
    counts: dict[tuple[int, int, int, int], int] = {}
    ok = codes[feasible]
    for f in np.flatnonzero(broke):
        taken = np.flatnonzero(codes[f] >= 0)
        # Which pairs of this row's choices some feasible row also made (a p x p matrix).
        same = (ok[:, taken] == codes[f, taken]).astype(np.int64)
        seen = (same.T @ same) > 0
        for a in range(len(taken)):
            for b in range(a + 1, len(taken)):
                if not seen[a, b]:
                    i, j = int(taken[a]), int(taken[b])
                    key = (i, int(codes[f, i]), j, int(codes[f, j]))
                    counts[key] = counts.get(key, 0) + 1
    rows = [[*key, n] for key, n in counts.items() if n >= 2]
    return np.array(rows, dtype=np.int64).reshape(-1, 5)
