"""Pairs of choices no trial got past: layouts that fail as soon as they are made (pure).

A trial that failed on its prefix (an invalid layout, found when its last offending choice was
made) names a culprit: the last param it asked. Which earlier choice made that value invalid
is not known, so each earlier choice forms a suspect pair with it. A pair that some trial got
past (it asked something after the culprit, or it ran) is cleared; a pair only ever seen
failing is dead. Each failure is one more piece of evidence for its dead pairs, and a planned
path is as likely to fail as the best-attested dead pair it contains says: ``1 - 2**-k`` after
``k`` failures (one failure: 0.5, above the redraw threshold, so only the redraw budget lets
such a path run; the descent's dead-end rule already forbids the exact failed prefix).
"""

from __future__ import annotations

import numpy as np

# Columns of the dead-pair array: suspect column and code, culprit column and code, failures.
SUSPECT, SUSPECT_CODE, CULPRIT, CULPRIT_CODE, FAILURES = range(5)


def dead_pairs(
    codes: np.ndarray, positions: np.ndarray, failed: np.ndarray, prefix: np.ndarray
) -> np.ndarray:
    """The uncleared pairs of the prefix failures, one row per pair (see the column names).

    Args:
        codes: History table (rows x columns), negative where not asked / out of domain.
        positions: Ask position of each param per row (-1 when not asked).
        failed: Mask of failed rows.
        prefix: Mask of the failed rows that failed on their prefix.
    """
    last = positions.max(axis=1, initial=-1)
    counts: dict[tuple[int, int, int, int], int] = {}
    for f in np.flatnonzero(prefix):
        culprit = int(np.argmax(positions[f]))
        value = int(codes[f, culprit])
        if value < 0:
            continue
        got_past = (codes[:, culprit] == value) & (~failed | (last > positions[:, culprit]))
        for suspect in np.flatnonzero(codes[f] >= 0):
            code = int(codes[f, suspect])
            if suspect == culprit or got_past[codes[:, suspect] == code].any():
                continue
            key = (int(suspect), code, culprit, value)
            counts[key] = counts.get(key, 0) + 1
    return np.array([[*key, n] for key, n in counts.items()], dtype=np.int64).reshape(-1, 5)


def p_dead(rows: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """P(FAIL) of each row from the dead pairs it contains: ``1 - 2**-k``, ``k`` the most
    failures behind one of them (0 without any)."""
    rows = np.atleast_2d(rows)
    if not len(pairs):
        return np.zeros(len(rows))
    contains = (rows[:, pairs[:, SUSPECT]] == pairs[:, SUSPECT_CODE]) & (
        rows[:, pairs[:, CULPRIT]] == pairs[:, CULPRIT_CODE]
    )
    k = (contains * pairs[:, FAILURES]).max(axis=1)
    return 1.0 - 0.5**k
