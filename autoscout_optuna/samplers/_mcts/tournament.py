"""Pure feature prioritization: which structural params go at the top of the tree.

Dependencies are learned from the history table (see ``tree.py`` for its encoding): a
conditional param (absent from some rows) must follow every param whose value decides whether
it is asked, or, when no single such param explains it, every param always asked before it.
Candidate orderings (the last winner, greedy by single-feature impact, the ask order, and
randomized ones) all respect these constraints; a tournament on bootstrap resamples of the
history eliminates the half that explains the least of the reward spread in their top levels,
round after round, until one is left.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscout_optuna.samplers._mcts.tree import OTHER, row_keys, unique_rows


@dataclass(frozen=True)
class Dependencies:
    """What the history says about conditional params.

    Attributes:
        must_follow: ``{child: parents}``: columns that must come before ``child``.
        inactive_under: ``{child: {parent: codes}}``: parent values under which the child
            was never asked (so a plan that picks them skips the child).
    """

    must_follow: dict[int, frozenset[int]]
    inactive_under: dict[int, dict[int, frozenset[int]]]


def learn_dependencies(
    codes: np.ndarray, positions: np.ndarray, complete: np.ndarray | None = None
) -> Dependencies:
    """Infer parent constraints from which rows ask which params, and in which order.

    Args:
        codes: History table, ``ABSENT`` where a row did not ask the param.
        positions: Same shape: the index of the param in the row's ask order (-1 if absent).
        complete: Per row, whether it ran to the end (default: all). A failed trial stops
            asking early: its missing params count as skipped only if it asked a param that
            comes after them elsewhere, else the failure would make every param look
            conditional.
    """
    learner = DependencyLearner(codes.shape[1])
    for i in range(len(codes)):
        learner.add(codes[i], positions[i], True if complete is None else bool(complete[i]))
    return learner.dependencies()


class DependencyLearner:
    """:func:`learn_dependencies` over rows added one at a time (the history grows by a row
    per trial; relearning from every row is O(history) per trial). The rows' order does not
    matter: every fact kept is an "any" or an "all" over rows, or a set of codes.

    For each child column (a param that might be conditional):

    - ``later[child, j]``: some row asking the child asked ``j`` after it;
    - ``always[child, j]`` / ``before[child, j]``: every row asking the child asked ``j``,
      and before it (``j`` is an ancestor when both hold);
    - ``with_[child][j]``: the codes ``j`` took in rows asking the child; ``without[child][j]``
      the codes ``j`` took in rows that skipped it.

    A row that lacks the child skipped it when it ran to the end, or asked a param that comes
    after the child elsewhere; a failed row that did neither may still turn out to have skipped
    it when ``later`` grows, so it waits in ``_unsure``.
    """

    def __init__(self, n_columns: int) -> None:
        p = n_columns
        self._asked_child = np.zeros(p, dtype=bool)
        self._skipped_child = np.zeros(p, dtype=bool)
        self._later = np.zeros((p, p), dtype=bool)
        self._always = np.ones((p, p), dtype=bool)
        self._before = np.ones((p, p), dtype=bool)
        self._with: list[list[set[int]]] = [[set() for _ in range(p)] for _ in range(p)]
        self._without: list[list[set[int]]] = [[set() for _ in range(p)] for _ in range(p)]
        self._unsure: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(p)]
        self._learned: Dependencies | None = None  # what ``dependencies`` gave since the last row

    def add(self, codes: np.ndarray, positions: np.ndarray, complete: bool = True) -> None:
        """One row: its codes and ask positions (-1: not asked), and whether it ran to the end."""
        self._learned = None
        asked = positions >= 0
        values = codes.tolist()
        for child in np.flatnonzero(asked).tolist():
            self._asked_child[child] = True
            later = positions > positions[child]
            grew = bool((later & ~self._later[child]).any())
            self._later[child] |= later
            self._always[child] &= asked
            self._before[child] &= positions < positions[child]
            for j, code in enumerate(values):
                self._with[child][j].add(code)
            if grew:  # failed rows that asked one of the new later params did skip the child
                unsure, self._unsure[child] = self._unsure[child], []
                for row in unsure:
                    self._file_skip(child, *row)
        for child in np.flatnonzero(~asked).tolist():
            if complete:
                self._skip(child, values, asked)
            else:
                self._file_skip(child, values, asked)

    def _file_skip(self, child: int, values: list[int], asked: np.ndarray) -> None:
        if asked[self._later[child]].any():
            self._skip(child, values, asked)
        else:
            self._unsure[child].append((values, asked))

    def _skip(self, child: int, values: list[int], asked: np.ndarray) -> None:
        self._skipped_child[child] = True
        for j in np.flatnonzero(asked).tolist():
            self._without[child][j].add(values[j])

    def dependencies(self) -> Dependencies:
        """What the rows so far say (kept until the next row: a plan asks for it every trial,
        and most trials add no finished row in between). Callers only read it."""
        if self._learned is None:
            self._learned = self._learn()
        return self._learned

    def _learn(self) -> Dependencies:
        must_follow: dict[int, frozenset[int]] = {}
        inactive_under: dict[int, dict[int, frozenset[int]]] = {}
        for child in np.flatnonzero(self._asked_child & self._skipped_child).tolist():
            ancestors = np.flatnonzero(self._always[child] & self._before[child]).tolist()
            deciding: dict[int, frozenset[int]] = {}
            for parent in ancestors:
                seen_without = self._without[child][parent]
                if seen_without and seen_without.isdisjoint(self._with[child][parent]):
                    deciding[parent] = frozenset(seen_without)
            if deciding:
                must_follow[child] = frozenset(deciding)
                inactive_under[child] = deciding
            elif ancestors:
                must_follow[child] = frozenset(ancestors)
        return Dependencies(must_follow, inactive_under)


def topological_order(
    n_columns: int, must_follow: dict[int, frozenset[int]], priority: Sequence[float]
) -> list[int]:
    """The order that takes, at each level, the highest-priority column whose parents are placed.

    Constraints learned from noisy data could in principle form a cycle; then the column with
    the fewest unplaced parents goes next, so an order always exists.
    """
    waiting = {c: len(must_follow.get(c, ())) for c in range(n_columns)}
    children: dict[int, list[int]] = {}
    for child, parents in must_follow.items():
        for parent in parents:
            children.setdefault(parent, []).append(child)
    ready = [(-priority[c], c) for c in range(n_columns) if waiting[c] == 0]
    heapq.heapify(ready)
    placed: list[int] = []
    done: set[int] = set()
    while len(placed) < n_columns:
        if ready:
            _, best = heapq.heappop(ready)
        else:  # a cycle: take the column closest to ready
            best = min(
                (c for c in range(n_columns) if c not in done),
                key=lambda c: (waiting[c], -priority[c], c),
            )
        if best in done:
            continue
        placed.append(best)
        done.add(best)
        for child in children.get(best, ()):
            waiting[child] -= 1
            if waiting[child] == 0 and child not in done:
                heapq.heappush(ready, (-priority[child], child))
    return placed


def explained_spread(
    codes: np.ndarray, rewards: np.ndarray, weights: np.ndarray, columns: Sequence[int]
) -> float:
    """Adjusted R^2 of the rewards grouped by the values of ``columns`` (absent is a value).

    The adjustment charges each extra group, so a param with many values does not win by
    splitting the rows finely by chance.
    """
    return SpreadOfRows(codes, rewards, weights)(columns)


class SpreadOfRows:
    """:func:`explained_spread` of column sets on the same rows: the rows' weighted mean and
    total spread are computed once, and each column set's answer once (a tournament round
    scores several orderings that share their top levels on one resample)."""

    def __init__(self, codes: np.ndarray, rewards: np.ndarray, weights: np.ndarray) -> None:
        self._codes, self._weights, self._n = codes, weights, len(rewards)
        self._total = 0.0  # nothing to explain
        if not (self._n < 3 or weights.sum() <= 0):
            self._mean = float(np.dot(weights, rewards) / weights.sum())
            self._total = float(np.sum(weights * (rewards - self._mean) ** 2))
            self._weighted = weights * rewards
        self._answers: dict[tuple[int, ...], float] = {}

    def __call__(self, columns: Sequence[int]) -> float:
        key = tuple(columns)
        if key not in self._answers:
            self._answers[key] = self._explained(key)
        return self._answers[key]

    def each_column(self) -> np.ndarray:
        """``self([c])`` of every column ``c``, the group sums of all columns counted at once.

        One column's groups are its codes, so the columns' groups are numbered apart (column
        ``c``'s after ``c`` times the widest column's) and one ``bincount`` per sum serves all
        of them. Each group still adds its rows in row order, so every answer is the very
        number ``self([c])`` gives (a plan asks this every trial: ~0.6 ms at 1,000 rows as one
        call per column).
        """
        n_columns = self._codes.shape[1]
        if self._total <= 1e-12 or n_columns == 0 or self._n == 0:
            return np.array([self((c,)) for c in range(n_columns)])
        width = int(self._codes.max()) + 3  # codes start at OTHER = -2
        groups = ((self._codes + 2) + np.arange(n_columns) * width).T.ravel()
        size = n_columns * width
        w_groups = np.bincount(groups, weights=np.tile(self._weights, n_columns), minlength=size)
        s_groups = np.bincount(groups, weights=np.tile(self._weighted, n_columns), minlength=size)
        rows = np.bincount(groups, minlength=size)
        w_groups, s_groups, rows = (a.reshape(n_columns, width) for a in (w_groups, s_groups, rows))
        answers = np.empty(n_columns)
        for column in range(n_columns):
            answers[column] = self._answers.setdefault((column,), self._adjusted(
                w_groups[column], s_groups[column], int(np.count_nonzero(rows[column]))
            ))
        return answers

    def _explained(self, columns: tuple[int, ...]) -> float:
        if self._total <= 1e-12:
            return 0.0
        groups = group_ids(self._codes, columns)
        k_max = int(groups.max()) + 1
        w_group = np.bincount(groups, weights=self._weights, minlength=k_max)
        s_group = np.bincount(groups, weights=self._weighted, minlength=k_max)
        k = int(np.count_nonzero(np.bincount(groups, minlength=k_max)))
        return self._adjusted(w_group, s_group, k)

    def _adjusted(self, w_group: np.ndarray, s_group: np.ndarray, k: int) -> float:
        """Adjusted R^2 from the groups' weight and weighted-reward sums (``k`` groups)."""
        n, mean = self._n, self._mean
        nonzero = w_group > 0
        between = float(
            np.sum(w_group[nonzero] * (s_group[nonzero] / w_group[nonzero] - mean) ** 2)
        )
        r2 = between / self._total
        if n - k <= 0:
            return -1.0
        return 1.0 - (1.0 - r2) * (n - 1) / (n - k)


def group_ids(codes: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """A non-negative int per row, equal for rows with equal codes in ``columns``."""
    n = len(codes)
    if not columns:
        return np.zeros(n, dtype=np.int64)
    chosen = codes[:, list(columns)]
    base = int(chosen.max()) - OTHER + 1  # codes start at OTHER
    if base ** len(columns) > 1_000_000:  # too many cells for a dense count: compress
        return unique_rows(chosen)[1]
    return row_keys(chosen, OTHER, base)


def ordering_score(spread: SpreadOfRows, order: Sequence[int], depth: int) -> float:
    """Sum over the top 1..``depth`` levels of the spread they explain on ``spread``'s rows
    (top level counts most)."""
    return sum(spread(order[:level]) for level in range(1, min(depth, len(order)) + 1))


def candidate_orders(
    codes: np.ndarray,
    rewards: np.ndarray,
    weights: np.ndarray,
    dependencies: Dependencies,
    ask_rank: Sequence[float],
    previous: Sequence[int] | None,
    rng: np.random.Generator,
    n_candidates: int,
) -> list[list[int]]:
    """Distinct dependency-respecting orderings to enter the tournament.

    The last winner (if any) comes first, so it keeps its place on ties; then the order of
    single-feature impact, the order the objective asks, and randomized ones (impact plus noise,
    and uniform shuffles) to keep trying alternatives.
    """
    n_columns = codes.shape[1]
    follow = dependencies.must_follow
    spread = SpreadOfRows(codes, rewards, weights)
    impact = spread.each_column()
    orders: list[list[int]] = []

    def add(priority: Sequence[float]) -> None:
        order = topological_order(n_columns, follow, priority)
        if order not in orders:
            orders.append(order)

    if previous:
        rank = {c: i for i, c in enumerate(previous)}
        add([-rank.get(c, n_columns + ask_rank[c]) for c in range(n_columns)])
    add(impact)
    add([-r for r in ask_rank])
    spread = float(impact.std()) if n_columns > 1 else 0.0
    attempts = 0
    while len(orders) < n_candidates and attempts < 4 * n_candidates:
        attempts += 1
        if attempts % 2:
            add(impact + rng.normal(0.0, max(spread, 1e-3), n_columns))
        else:
            add(rng.random(n_columns))
    return orders[: max(n_candidates, 1)]


def run_tournament(
    codes: np.ndarray,
    rewards: np.ndarray,
    weights: np.ndarray,
    candidates: Sequence[Sequence[int]],
    rng: np.random.Generator,
    depth: int = 2,
) -> tuple[int, float]:
    """Successive halving of ``candidates`` on bootstrap resamples of the rows.

    Each round draws a fresh resample, scores the survivors with :func:`ordering_score` and
    keeps the better half (ties keep the earlier candidate). A resample per round means an
    ordering must explain the spread again and again, not just on one lucky split.

    Returns:
        ``(index of the winner in candidates, its score in the last round)``.
    """
    alive = list(range(len(candidates)))
    last_score = 0.0
    n = len(rewards)
    if len(alive) == 1:
        return 0, ordering_score(SpreadOfRows(codes, rewards, weights), candidates[0], depth)
    while len(alive) > 1:
        rows = rng.integers(0, n, n) if n > 0 else np.arange(0)
        spread = SpreadOfRows(codes[rows], rewards[rows], weights[rows])
        scores = [ordering_score(spread, candidates[i], depth) for i in alive]
        keep = math.ceil(len(alive) / 2) if len(alive) > 2 else 1
        ranked = sorted(range(len(alive)), key=lambda j: (-scores[j], alive[j]))[:keep]
        last_score = scores[ranked[0]]
        alive = sorted(alive[j] for j in ranked)
    return alive[0], float(last_score)
