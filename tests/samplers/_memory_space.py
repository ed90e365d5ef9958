"""A three-param structure space shared by the memory tests: micro-batch, tensor parallel
degree and recompute (0: none, 1: full), all of it enumerable."""

from __future__ import annotations

import numpy as np

VALUES = [np.array([1.0, 2.0, 4.0, 8.0, 16.0]), np.array([1.0, 2.0, 4.0, 8.0]), None]
N_VALUES = [5, 4, 2]
OFFSETS = np.array([0, 5, 9, 11])


def every_structure() -> np.ndarray:
    return np.array([[a, b, c] for a in range(5) for b in range(4) for c in range(2)])
