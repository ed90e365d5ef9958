"""The model arm's table of the history, extended as trials finish (a cache, not state).

A model proposal needs every trial's structural codes, kind and score, the dependency tree read
from them, its ridge's ``X^T X`` over the real and over the estimate rows (counts: exact in any
order), and, for its feasibility check, each trial's ask positions and whether it failed on a
broken rule. Built from scratch, that walks every record of the history on every proposal: at
1,000 trials, more of the arm's time than its numeric work. Finished trials never change, and
the history reader hands back the very same record objects for them, so the table keeps the
rows of the history's finished start (up to its first running trial) and a proposal reads only
the records after them. Whenever the history no longer starts with the kept records (a study
recreated, a running trial in the middle finished, other value lists), the table starts over
from the history, so it answers exactly what a rebuild would.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscout_optuna._failure import failed_on_a_rule
from autoscout_optuna._memory import memory_use
from autoscout_optuna.samplers._autoscout.conditions import ConditionEvidence, value_offsets
from autoscout_optuna.samplers._autoscout.reader import Seen
from autoscout_optuna.samplers._autoscout.surrogate import (
    ask_positions,
    encode,
    scored_grams,
    value_lookups,
)
from autoscout_optuna.samplers._mcts.encoding import value_key

# Structures whose codes the table keeps before it starts that memo over.
MAX_STRUCTURES = 200_000


@dataclass(frozen=True)
class ModelInputs:
    """What :func:`~autoscout_optuna.samplers._autoscout.surrogate.propose_encoded` reads.

    Attributes:
        codes: Per trial, each structural param's value code (``ABSENT`` if not asked).
        kinds: Per trial, ``"real"``, ``"estimate"``, ``"failed"`` or ``"pending"``.
        scores: Per trial, its oriented score (nan where it has none).
        conditions: The dependency tree, as ``conditions_of`` reads it from ``codes``.
        grams: The ridge's ``X^T X`` over the real and over the estimate trials
            (``surrogate.scored_grams``; ``surrogate.weighted_gram`` weighs them).
        positions: Per trial, where each structural param came in its ask order
            (``surrogate.ask_positions``; -1 if not asked).
        broke_rule: Per trial, whether it failed on a broken rule, not a resource limit
            (:func:`autoscout_optuna._failure.breaks_a_rule` of its ``failure_reason``).
        memory: Per trial, the peak memory over capacity it reported (NaN: none;
            :mod:`autoscout_optuna._memory`).
    """

    codes: np.ndarray
    kinds: np.ndarray
    scores: np.ndarray
    conditions: dict[str, dict[str, list[Any]]]
    grams: np.ndarray
    positions: np.ndarray
    broke_rule: np.ndarray
    memory: np.ndarray


class HistoryTable:
    """The model arm's inputs for a history, reusing the rows of its finished start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start_over(None, [], [])

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (HistoryTable, ())  # a cache: rebuilt from the history after unpickling

    def _start_over(
        self, signature: Any, names: Sequence[str], value_lists: Sequence[Sequence[Any]]
    ) -> None:
        self._signature = signature
        self._lookups = value_lookups(value_lists)
        # each structure's codes: a long study runs one structure many times (refinements)
        self._by_structure: dict[Hashable, np.ndarray] = {}
        self._records: list[Seen] = []
        # the per-trial columns of ``ModelInputs``, for the kept records
        self._rows = self._columns(names, [])
        self._offsets = value_offsets(value_lists)
        self._evidence = ConditionEvidence(self._offsets)
        self._grams = scored_grams(self._rows["codes"], self._rows["kinds"], self._offsets)

    def read(
        self, history: Sequence[Seen], names: Sequence[str],
        value_lists: Sequence[Sequence[Any]],
    ) -> ModelInputs:
        """The inputs for ``history`` (oldest first), with ``names`` the structural params
        and ``value_lists`` every value of each."""
        with self._lock:
            signature = (tuple(names), tuple(tuple(map(value_key, v)) for v in value_lists))
            kept = len(self._records)
            # list equality tests each record's identity first (records compare by identity)
            if signature != self._signature or list(history[:kept]) != self._records:
                self._start_over(signature, names, value_lists)
                kept = 0
            tail = history[kept:]
            new = self._columns(names, tail)
            codes, kinds = new["codes"], new["kinds"]
            finished = next((i for i, obs in enumerate(tail) if obs.kind == "pending"),
                            len(tail))
            if finished:
                self._records.extend(tail[:finished])
                self._rows = {key: np.concatenate([self._rows[key], column[:finished]])
                              for key, column in new.items()}
                self._evidence.add(codes[:finished])
                self._grams = self._grams + scored_grams(codes[:finished], kinds[:finished],
                                                         self._offsets)
            evidence, grams = self._evidence, self._grams
            if finished < len(tail):  # running trials (or finished after one): this read only
                evidence = evidence.copy()
                evidence.add(codes[finished:])
                grams = grams + scored_grams(codes[finished:], kinds[finished:], self._offsets)
            return ModelInputs(
                conditions=evidence.conditions(names, value_lists), grams=grams,
                **{key: np.concatenate([self._rows[key], column[finished:]])
                   for key, column in new.items()},
            )

    def _columns(self, names: Sequence[str], records: Sequence[Seen]) -> dict[str, np.ndarray]:
        """The per-trial columns of ``ModelInputs`` for ``records``, keyed by field."""
        return {
            "codes": self._encode(names, records),
            "kinds": np.array([obs.kind for obs in records], dtype=str),
            "scores": np.array([np.nan if obs.score is None else obs.score for obs in records],
                               dtype=float),
            "positions": ask_positions(names, [obs.params for obs in records]),
            "broke_rule": np.array([failed_on_a_rule(obs.kind, obs.user_attrs)
                                    for obs in records], dtype=bool),
            "memory": np.array([memory_use(obs.kind, obs.user_attrs) for obs in records],
                               dtype=float),
        }

    def _encode(self, names: Sequence[str], records: Sequence[Seen]) -> np.ndarray:
        if len(self._by_structure) > MAX_STRUCTURES:
            self._by_structure.clear()
        codes = np.empty((len(records), len(names)), dtype=int)
        for i, obs in enumerate(records):
            row = self._by_structure.get(obs.structure)
            if row is None:
                row = self._by_structure[obs.structure] = encode(names, self._lookups,
                                                                 [obs.params])[0]
            codes[i] = row
        return codes
