"""Peak memory a trial reports: evidence for the feasibility models.

An objective that knows its peak device memory records it as a fraction of the device's
capacity, ``trial.set_user_attr("memory_use", peak / capacity)`` (the GPT runner and the
reference training study do). With ``memory_model=True`` (``AutoScoutSampler``,
``MCTSSampler``), MCTS and the model arm then learn how memory grows with each structural
choice and avoid structures that would not fit before running them
(``samplers/_mcts/memory.py``); a trial that ran out of memory says so with
``failure_reason = "oom"`` (:class:`~autoscout_optuna.Infeasible`), as before. With a
``memory_estimate`` (``samplers/_mcts/estimate.py``) the measured peaks calibrate the estimate,
and the failures that ran out of memory are the estimate's to explain where it saw them coming.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autoscout_optuna._keys import FAILURE_REASON, MEMORY_USE

OUT_OF_MEMORY = "oom"


def memory_use(kind: str, user_attrs: Mapping[str, Any]) -> float:
    """The peak memory over capacity a trial that ran (``kind`` ``"real"``) reported; infinity
    for a failed trial whose reason is ``"oom"`` (over capacity, by an unknown amount); NaN
    where it reported none, or something that is not a positive finite number."""
    if kind == "failed" and user_attrs.get(FAILURE_REASON) == OUT_OF_MEMORY:
        return math.inf
    value = user_attrs.get(MEMORY_USE)
    if kind != "real" or isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value) if math.isfinite(value) and value > 0 else math.nan
