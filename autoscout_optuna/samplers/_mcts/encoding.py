"""Observations -> the table the pure tree code works on (one row per trial, one column per
structural param), and value keys that compare equal across distributions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution

from autoscout_optuna._failure import failed_on_a_rule
from autoscout_optuna._history import Observation
from autoscout_optuna._memory import memory_use
from autoscout_optuna._space import discrete_values
from autoscout_optuna.samplers._mcts.tournament import Dependencies, DependencyLearner
from autoscout_optuna.samplers._mcts.tree import ABSENT, ESTIMATE, OTHER, REAL

ORDER_KEY = "mcts:order"

StructuralTest = Callable[[str, BaseDistribution], bool]


def value_key(value: Any) -> tuple[str, Any]:
    """A hashable key: numbers compare by value (``4 == 4.0``, float steps rounded), while
    ``True`` and ``1`` stay apart (they hash alike in a plain dict)."""
    if value is None or isinstance(value, (bool, np.bool_, str)):
        return (type(value).__name__, value)
    if isinstance(value, (int, np.integer)):
        return ("number", float(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return ("number", round(value, 10) if math.isfinite(value) else value)
    return (type(value).__name__, repr(value))


@dataclass(frozen=True)
class Table:
    """The history as arrays.

    Attributes:
        names: Structural params, one per column.
        distributions: The reference distribution of each column (its latest one).
        values: The values of each column (children of a node at that level), in order.
        codes: ``(rows, columns)`` value indices; ``ABSENT`` / ``OTHER`` as in ``tree.py``.
        positions: Index of each param in the row's ask order (-1 when absent).
        kinds: Observation kind per row.
        scores: Oriented score per row (None for failed/pending).
        ask_rank: Mean relative ask position of each column (0 = asked first).
        previous_order: The last recorded tournament winner (param names), if any.
        dense: Per row, the index in ``dense_values`` of its non-structural params: to tell a
            repeat of a whole configuration from a known structure met again with other
            dense values.
        dense_values: Distinct non-structural params of rows, as ``(name, value_key)`` pairs
            in ask order (many rows share them: explore trials take the incumbent's).
        dependencies: What the finished rows say about conditional params (see
            :func:`~autoscout_optuna.samplers._mcts.tournament.learn_dependencies`), learned
            row by row as trials finish; None: not learned yet.
        broke_rule: Per row, whether it failed on a broken rule rather than a resource limit
            (:func:`autoscout_optuna._failure.breaks_a_rule` of its ``failure_reason``).
        memory: Per row, the peak memory over capacity it reported (NaN: none; see
            :mod:`autoscout_optuna._memory`).
    """

    names: list[str]
    distributions: list[BaseDistribution]
    values: list[list[Any]]
    codes: np.ndarray
    positions: np.ndarray
    kinds: list[str]
    scores: list[float | None]
    ask_rank: list[float]
    previous_order: list[str] | None
    dense: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dense_values: list[tuple[tuple[str, Any], ...]] = field(default_factory=list)
    dependencies: Dependencies | None = None
    broke_rule: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    memory: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def column_of(self, name: str) -> int | None:
        try:
            return self.names.index(name)
        except ValueError:
            return None

    def code_of(self, column: int, value: Any) -> int:
        """Index of ``value`` among the column's values, ``OTHER`` if not there."""
        lookup = {value_key(v): i for i, v in enumerate(self.values[column])}
        return lookup.get(value_key(value), OTHER)


def build_table(observations: Sequence[Observation], structural: StructuralTest) -> Table:
    """Encode ``observations`` (any order) from scratch; see :class:`TableBuilder`."""
    builder = TableBuilder(structural)
    return builder.build(
        [o for o in observations if o.kind != "pending"],
        [o for o in observations if o.kind == "pending"],
    )


class TableBuilder:
    """Encodes observations into a :class:`Table`, reusing the rows of finished trials.

    A finished trial never changes, so its encoded row is kept while the columns (structural
    params and their reference distributions) stay the same; only new trials are encoded on each
    call. The table is the same as a fresh encoding: rows are finished trials by number, then
    pending trials by number; columns are ordered by the (trial number, ask position) where each
    param first appears; a column's reference distribution is that of the latest trial asking it.

    Args:
        structural: Which (name, distribution) pairs are columns.
    """

    def __init__(self, structural: StructuralTest) -> None:
        self._structural = structural
        self._finished: dict[int, Observation] = {}
        self._first_seen: dict[str, tuple[int, int]] = {}
        self._latest: dict[str, tuple[int, BaseDistribution]] = {}
        self._spec: tuple | None = None
        # the columns of ``_spec``, their values and value codes (rebuilt when it changes)
        self._columns: list[str] = []
        self._values: list[list[Any]] = []
        self._lookups: list[dict[Any, int]] = []
        self._rows: dict[int, tuple[np.ndarray, ...]] = {}
        self._dense_ids: dict[tuple[tuple[str, Any], ...], int] = {}
        self._learner = DependencyLearner(0)
        self._clear_stack()
        self._settled = 0

    def _clear_stack(self) -> None:
        self._stacked: list[int] = []  # numbers of the stacked rows, in order
        self._stack: tuple[np.ndarray, ...] | None = None
        self._stacked_kinds: list[str] = []  # kinds and scores of the stacked rows, in order
        self._stacked_scores: list[float | None] = []
        self._stacked_rules: list[bool] = []
        self._stacked_memory: list[float] = []

    @property
    def n_settled(self) -> int:
        """How many trials, from number 0 on, are finished and encoded (a scan can skip them)."""
        return self._settled

    def settle(self, count: int) -> None:
        """Note that trials ``0 .. count - 1`` are all finished and passed in."""
        self._settled = max(self._settled, count)

    def has(self, number: int) -> bool:
        """Whether finished trial ``number`` is already encoded (no need to pass it again)."""
        return number in self._finished

    def build(
        self, finished: Sequence[Observation], pending: Sequence[Observation]
    ) -> Table:
        """The table of all finished trials ever passed in plus today's ``pending`` ones.

        ``finished`` may repeat trials passed before (they are skipped) or hold only new ones.
        """
        for obs in finished:
            if obs.number not in self._finished:
                self._finished[obs.number] = obs
                _note(obs, self._first_seen, self._latest)
        first_seen = dict(self._first_seen)
        latest = dict(self._latest)
        for obs in pending:
            _note(obs, first_seen, latest)
        names = sorted(first_seen, key=first_seen.__getitem__)
        spec = tuple(
            (name, latest[name][1]) for name in names
            if self._structural(name, latest[name][1])
        )
        if spec != self._spec:
            self._spec, self._rows = spec, {}
            self._clear_stack()
            self._dense_ids, self._learner = {}, DependencyLearner(len(spec))
            self._columns = [name for name, _ in spec]
            self._values = [discrete_values(dist) for _, dist in spec]
            self._lookups = [{value_key(v): i for i, v in enumerate(vals)}
                             for vals in self._values]
        # copies: a table is handed out, the lists stay with the builder
        columns, values, lookups = list(self._columns), list(self._values), self._lookups
        distributions = [dist for _, dist in spec]
        index = {name: j for j, name in enumerate(columns)}
        numbers = sorted(self._finished)
        if self._stacked != numbers[: len(self._stacked)]:
            self._clear_stack()  # a trial finished out of order: restack
        new = numbers[len(self._stacked):]
        for number in new:
            if number not in self._rows:
                obs = self._finished[number]
                row = self._rows[number] = _encode(obs, index, lookups, self._dense_ids)
                self._learner.add(row[0], row[1], complete=obs.kind in (REAL, ESTIMATE))
        parts = [self._rows[n] for n in new]
        if parts:
            fresh = tuple(np.stack([p[k] for p in parts]) for k in range(4))
            self._stack = fresh if self._stack is None else tuple(
                np.concatenate([a, b]) for a, b in zip(self._stack, fresh, strict=True)
            )
            self._stacked = numbers
            self._stacked_kinds += [self._finished[n].kind for n in new]
            self._stacked_scores += [self._finished[n].score for n in new]
            for n in new:
                kind, attrs = self._finished[n].kind, self._finished[n].user_attrs
                self._stacked_rules.append(failed_on_a_rule(kind, attrs))
                self._stacked_memory.append(memory_use(kind, attrs))
        pending_sorted = sorted(pending, key=lambda o: o.number)
        blocks = [] if self._stack is None else [self._stack]
        if pending_sorted:
            rows = [_encode(o, index, lookups, self._dense_ids) for o in pending_sorted]
            blocks.append(tuple(np.stack([r[k] for r in rows]) for k in range(4)))
        p = len(columns)
        if blocks:
            codes, positions, relative, dense = (
                np.concatenate([b[k] for b in blocks]) for k in range(4)
            )
        else:
            codes = np.zeros((0, p), dtype=np.int64)
            positions = np.zeros((0, p), dtype=np.int64)
            relative = np.zeros((0, p))
            dense = np.zeros(0, dtype=np.int64)
        counts = (positions >= 0).sum(axis=0)
        sums = np.where(positions >= 0, relative, 0.0).sum(axis=0)
        ask_rank = [float(sums[j] / counts[j]) if counts[j] else 1.0 for j in range(p)]
        previous_order = None
        for number in reversed(numbers):
            order = self._finished[number].user_attrs.get(ORDER_KEY)
            if isinstance(order, list):
                previous_order = [str(name) for name in order]
                break
        return Table(
            names=columns,
            distributions=distributions,
            values=values,
            codes=codes,
            positions=positions,
            kinds=self._stacked_kinds + [obs.kind for obs in pending_sorted],
            scores=self._stacked_scores + [obs.score for obs in pending_sorted],
            ask_rank=ask_rank,
            previous_order=previous_order,
            dense=dense,
            dense_values=list(self._dense_ids),
            dependencies=self._learner.dependencies(),
            broke_rule=np.array(self._stacked_rules + [False] * len(pending_sorted), dtype=bool),
            memory=np.array(self._stacked_memory + [np.nan] * len(pending_sorted), dtype=float),
        )


def _note(obs: Observation, first_seen: dict, latest: dict) -> None:
    for position, (name, dist) in enumerate(obs.distributions.items()):
        if name not in first_seen or (obs.number, position) < first_seen[name]:
            first_seen[name] = (obs.number, position)
        if name not in latest or obs.number > latest[name][0]:
            latest[name] = (obs.number, dist)


def _encode(
    obs: Observation, index: dict[str, int], lookups: list[dict], dense_ids: dict
) -> tuple:
    """The row of ``obs``: codes, ask positions, relative positions, and the id of its
    non-structural params in ``dense_ids`` (added there when new)."""
    p = len(index)
    codes = np.full(p, ABSENT, dtype=np.int64)
    positions = np.full(p, -1, dtype=np.int64)
    relative = np.zeros(p)
    asked = max(len(obs.params) - 1, 1)
    for position, (name, value) in enumerate(obs.params.items()):
        j = index.get(name)
        if j is not None:
            codes[j] = lookups[j].get(value_key(value), OTHER)
            positions[j] = position
            relative[j] = position / asked
    dense = tuple((name, value_key(v)) for name, v in obs.params.items() if name not in index)
    return codes, positions, relative, np.int64(dense_ids.setdefault(dense, len(dense_ids)))
