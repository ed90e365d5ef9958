"""Peak memory a trial reports: evidence for the feasibility models.

An objective that knows its peak device memory records it as a fraction of the device's
capacity, ``trial.set_user_attr("memory_use", peak / capacity)`` (the GPT runner and the
reference training study do). With ``memory_model=True`` (``AutoScoutSampler``,
``MCTSSampler``), MCTS and the model arm then learn how memory grows with each structural
choice and avoid structures that would not fit before running them
(``samplers/_mcts/memory.py``); a trial that ran out of memory says so with
``failure_reason = "oom"`` (:class:`~autoscout_optuna.Infeasible`), as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autoscout_optuna._keys import MEMORY_USE


def memory_use(kind: str, user_attrs: Mapping[str, Any]) -> float:
    """The peak memory over capacity a trial that ran (``kind`` ``"real"``) reported; NaN
    where it reported none, or something that is not a positive finite number."""
    value = user_attrs.get(MEMORY_USE)
    if kind != "real" or isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value) if math.isfinite(value) and value > 0 else math.nan
