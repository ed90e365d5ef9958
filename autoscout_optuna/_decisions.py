"""Why each trial was run: a study's per-trial decisions as one pandas table."""

from __future__ import annotations

from typing import Any

import optuna

from autoscout_optuna import _keys
from autoscout_optuna._storage import get_trials

_FIRST = ("number", "state", "value", _keys.ARM, _keys.REASON)


def decisions_table(study: optuna.Study) -> Any:
    """One row per trial: state, value, and every namespaced decision the samplers recorded.

    Columns are ``number``, ``state``, ``value`` (the last reported value for a PRUNED trial,
    None for FAIL/RUNNING), ``autoscout:arm``, ``autoscout:reason`` and then every other user
    attr whose key has a namespace (``"ns:name"``, e.g. ``autoscout:bandit`` or a
    sub-sampler's own attrs), plus ``failure_reason``. Trials without a decision (e.g. enqueued
    or run by another sampler) have None there.

    Example:

        .. testcode::

            import optuna
            from autoscout_optuna import AutoScoutSampler, decisions_table

            study = optuna.create_study(sampler=AutoScoutSampler(seed=0))
            study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=5)
            table = decisions_table(study)
            assert list(table["autoscout:arm"]) == ["startup"] * 5

    Returns:
        A ``pandas.DataFrame`` indexed from 0, ordered by trial number.
    """
    import pandas as pd

    rows = []
    keys: dict[str, None] = {}
    for trial in get_trials(study):
        row: dict[str, Any] = {
            "number": trial.number,
            "state": trial.state.name,
            "value": _value(trial),
        }
        for key, value in trial.user_attrs.items():
            if ":" in key or key == _keys.FAILURE_REASON:
                row[key] = value
                keys.setdefault(key, None)
        rows.append(row)
    columns = list(_FIRST) + sorted(k for k in keys if k not in _FIRST)
    # object dtype: trial numbers stay ints and missing decisions stay None, not NaN.
    table = [[row.get(column) for column in columns] for row in rows]
    return pd.DataFrame(table, columns=columns, dtype=object)


def _value(trial: optuna.trial.FrozenTrial) -> float | None:
    if trial.values is not None and len(trial.values) == 1:
        return trial.values[0]
    if trial.state == optuna.trial.TrialState.PRUNED and trial.intermediate_values:
        return trial.intermediate_values[max(trial.intermediate_values)]
    return None
