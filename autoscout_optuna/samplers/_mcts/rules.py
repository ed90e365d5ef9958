"""Broken rules: what two full-length failures of a rule have in common (pure).

A trial that asked every param and then failed on a rule of the system (``invalid_combination``:
CUDA graphs cannot capture ZeRO-3 gathers; see :func:`autoscout_optuna._failure.breaks_a_rule`)
does not say which of its choices broke it, and the logistic feasibility model, a sum of
per-choice weights, cannot say "these two together" at all: the same combination came back
three to six times per 100-trial ``llm_training`` study. Whatever broke the rule in two such
failures is among the choices they share, so the *pattern* of shared choices is blamed as a
whole: a planned path that makes all of them is as likely to fail as ``1 - 2**-k`` says, ``k``
the failures that contain the pattern (two: 0.75, above even a promising path's redraw
threshold). A pattern some feasible trial made is cleared. A path that lacks one of the
shared choices is not judged, so the guess never shuts out a structure that avoids the
culprit: naming every *pair* the two failures share instead blamed companions that happened
to be there (on ``llm_training`` 70B, in 14 of 160 seeds by trial 100 a pair of the optimum's
own choices, such as CUDA graphs with ``pp=2``). One failure names nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Only the latest rule failures are compared pairwise: bounds the work (patterns grow with the
# square) in a study that keeps breaking rules.
MAX_FAILURES = 48


@dataclass(frozen=True)
class RulePatterns:
    """Patterns of choices (column and code arrays) and the rule failures behind each."""

    columns: tuple[np.ndarray, ...]
    codes: tuple[np.ndarray, ...]
    failures: np.ndarray

    def p_fail(self, rows: np.ndarray) -> np.ndarray:
        """P(FAIL) of each row: ``1 - 2**-k`` of the best-attested pattern it contains, else 0."""
        rows = np.atleast_2d(rows)
        p = np.zeros(len(rows))
        for columns, codes, k in zip(self.columns, self.codes, self.failures, strict=True):
            contains = (rows[:, columns] == codes).all(axis=1)
            p = np.where(contains, np.maximum(p, 1.0 - 0.5 ** float(k)), p)
        return p


def rule_patterns(codes: np.ndarray, broke: np.ndarray, feasible: np.ndarray) -> RulePatterns:
    """The patterns two of the rule failures ``broke`` share and no feasible row made.

    Args:
        codes: History table (rows x columns), negative where not asked / out of domain.
        broke: Mask of the full-length rows that failed on a rule.
        feasible: Mask of the rows that ended with a value.
    """
    failed = codes[np.flatnonzero(broke)[-MAX_FAILURES:]]
    if len(failed) < 2:  # the common case, on every plan: no copy of the feasible rows
        return RulePatterns((), (), np.zeros(0, dtype=np.int64))
    ok = codes[feasible]
    seen: set[tuple[tuple[int, int], ...]] = set()
    columns, values, counts = [], [], []
    for i in range(len(failed)):
        for j in range(i + 1, len(failed)):
            shared = np.flatnonzero((failed[i] == failed[j]) & (failed[i] >= 0))
            key = tuple((int(c), int(failed[i, c])) for c in shared)
            if not key or key in seen:
                continue
            seen.add(key)
            pattern = failed[i, shared]
            if (ok[:, shared] == pattern).all(axis=1).any():
                continue  # a feasible trial made all of these choices: not the rule
            columns.append(shared)
            values.append(pattern)
            counts.append(int((failed[:, shared] == pattern).all(axis=1).sum()))
    return RulePatterns(tuple(columns), tuple(values), np.array(counts, dtype=np.int64))
