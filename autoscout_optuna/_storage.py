"""The one module that touches Optuna's private storage API.

Optuna 5 removed ``Trial.set_system_attr``; samplers and pruners receive a ``FrozenTrial`` they
cannot write to. Everything that reads history or writes per-trial attrs from inside a sampler or
pruner goes through these functions, so an Optuna upgrade has one place to fix.
"""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState


def get_trials(
    study: optuna.Study, states: Container[TrialState] | None = None
) -> list[FrozenTrial]:
    """All trials of ``study`` (no deep copy, cached): the only source of sampler state."""
    return study._get_trials(deepcopy=False, use_cache=True, states=states)


def set_user_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """Record a JSON-serializable decision on a trial, visible in optuna-dashboard."""
    study._storage.set_trial_user_attr(trial._trial_id, key, _jsonable(value))


def set_system_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """Record internal bookkeeping on a trial (not shown by optuna-dashboard)."""
    study._storage.set_trial_system_attr(trial._trial_id, key, _jsonable(value))


def get_fresh_trial(study: optuna.Study, trial: FrozenTrial) -> FrozenTrial:
    """Re-read ``trial`` from storage (attrs written since the FrozenTrial was made)."""
    return study._storage.get_trial(trial._trial_id)


def study_id(study: optuna.Study) -> int:
    """The storage id of ``study`` (optuna-dashboard's artifact URLs are keyed by it)."""
    return study._study_id


def storage_key(study: optuna.Study) -> tuple[int, int]:
    """``(id of the storage object, study id)``: names a study within this process (a cache
    key; check it against the trials before trusting what it names)."""
    return id(study._storage), study._study_id


def serialize_sqlite_transactions(storage: optuna.storages.BaseStorage) -> None:
    """Make each transaction of a SQLite file ``storage`` take the write lock when it begins.

    Optuna pops its queue (and claims a trial, :func:`claim_waiting_trial`) by reading a
    WAITING trial and writing it RUNNING in one transaction "FOR UPDATE", which SQLite ignores:
    two worker processes on one file both read WAITING, both wrote RUNNING, and both ran the
    trial (the second to finish crashed with "Cannot tell a COMPLETE trial"). ``BEGIN
    IMMEDIATE`` makes the second wait until the first has committed, and then read RUNNING.
    Optuna's transactions are a few statements each, so workers wait milliseconds. No-op for
    other storages and in-memory SQLite (a new connection there is a new, empty database).
    """
    engine = getattr(storage, "engine", None)
    if engine is None or engine.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite issues no BEGIN of its own

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # the pooled connections were opened without the hook


def fail_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Move a RUNNING trial to FAIL (a trial whose worker died cannot finish it itself)."""
    study._storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)


def claim_waiting_trial(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Move a WAITING trial to RUNNING; False where another worker took or finished it first.

    The compare-and-set Optuna pops its queue with (every storage checks the state under its
    lock, row lock or log order): whoever it returns True to owns the trial.
    """
    try:
        return study._storage.set_trial_state_values(trial._trial_id, state=TrialState.RUNNING)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def study_directions(study: optuna.Study) -> Sequence[optuna.study.StudyDirection]:
    return study.directions


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so nothing unpicklable or numpy-typed reaches storage.

    NaN and infinities become None: Python's json writes them as ``NaN``/``Infinity`` tokens
    that strict JSON readers (optuna-dashboard's browser side among them) reject. An unbounded
    error bound, say, is stored as "no bound".
    """
    return json.loads(json.dumps(value, default=_default), parse_constant=lambda _: None)


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"value of type {type(obj).__name__} cannot be stored as a trial attr")
