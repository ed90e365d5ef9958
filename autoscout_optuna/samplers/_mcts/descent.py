"""Pure descent of the tree: one planned path per trial, top level first.

Each level's child is chosen by the UCT rule of ``tree.py`` at the node the path has reached;
children that would repeat a failed trial's decisions are avoided, and a path that repeats an
evaluated configuration is revised at its deepest levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscout_optuna.samplers._mcts.tree import (
    ABSENT,
    ChildScores,
    child_scores,
    narrow,
    node_rows,
    pick,
    value_statistics,
)


@dataclass(frozen=True)
class Step:
    """One planned decision: param ``column`` takes value ``code``; its UCT numbers."""

    column: int
    code: int
    score: float
    value: float
    visits: float


@dataclass(frozen=True)
class TreePolicy:
    """The constants of the tree policy (see :func:`child_scores`)."""

    exploration: float = 0.3
    rave_equivalence: float = 3.0
    rave_visit_share: float = 0.1
    max_backtracks: int = 8
    max_backup: float = 0.0


def plan_path(
    codes: np.ndarray,
    n_values: Sequence[int],
    rewards: np.ndarray,
    weights: np.ndarray,
    order: Sequence[int],
    inactive_under: dict[int, dict[int, frozenset[int]]],
    rng: np.random.Generator,
    policy: TreePolicy = TreePolicy(),
    failed: np.ndarray | None = None,
    partial: np.ndarray | None = None,
    repeatable: np.ndarray | None = None,
) -> list[Step]:
    """Descend the tree level by level in ``order``, choosing each child by UCT.

    Args:
        codes: History table (see the module docstring).
        n_values: Number of values of each column.
        rewards: Normalized rewards per row.
        weights: Weights per row (failed and pending rows included).
        order: Columns, top level first (a dependency-respecting order).
        inactive_under: ``{child: {parent: codes}}``: the child is skipped when its parent was
            planned to one of these codes (history shows the child is not asked there).
        rng: Tie-breaking.
        policy: UCT constants.
        failed: Boolean mask of failed rows: a child that would repeat all the decisions of
            one of them is avoided while another child is left (see ``_DeadEnds``).
        partial: Boolean mask of rows that may lack params they would have asked (failed or
            still running); None: the failed rows. See :func:`_is_duplicate`.
        repeatable: Boolean mask of the rows this trial could repeat at all (None: every row);
            e.g. a composing sampler that gives the trial other dense values than a row had
            does not repeat that row by taking its structure.

    Returns:
        The planned steps, top level first. If the path repeats a configuration already in the
        history, the deepest decisions are revised (best other child, then down again greedily)
        so a trial is not spent on a known point; at most ``policy.max_backtracks`` revisions,
        then a bounded depth-first search for the best path that repeats nothing.
    """
    if partial is None:
        partial = failed
    known, known_partial = codes, partial
    if repeatable is not None:
        known = codes[repeatable]
        known_partial = None if partial is None else partial[repeatable]
    stats = _ScoreMemo()
    steps = _descend(
        codes, n_values, rewards, weights, order, inactive_under, rng, policy, [], stats, failed
    )
    if not _is_duplicate(known, steps, known_partial):
        return steps
    # The revisions below ask the same question again and again, and the search after them
    # walks the same rows: both use the bit masks of one _UnseenPaths.
    unseen = _UnseenPaths(known, known_partial, n_values, order, inactive_under)
    budget = policy.max_backtracks
    # The revisions' descents draw from a stream of their own, so skipping a revision that can
    # only repeat (below) changes neither the choices of the others nor what comes after.
    revision_rng = np.random.default_rng(int(rng.integers(2**63)))
    failed_codes = codes[failed] if failed is not None else codes[:0]
    for level in range(len(steps) - 1, -1, -1):
        head = steps[:level]
        column = steps[level].column
        scores = _scores_at(codes, n_values, rewards, weights, head, column, policy, stats)
        tried = np.zeros(n_values[column], dtype=bool)
        tried[steps[level].code] = True
        # A child that completes a failed prefix is never a revision: once the other children
        # are tried, the revision moves a level up (taking it would propose a known failure
        # again, as serving's explore arm did past 300 trials). ``alive`` is None where every
        # child completes one: the descent's rule, a prefix never closes the only route left.
        alive = _DeadEnds(failed_codes, {s.column: s.code for s in head}).allowed(
            column, n_values[column]
        )
        if alive is not None:
            tried |= ~alive
        while budget > 0 and not tried.all():
            budget -= 1
            alt = pick(scores.score, rng, allowed=~tried)
            tried[alt] = True
            first = Step(
                column, alt, float(scores.score[alt]), float(scores.value[alt]),
                float(scores.visits[alt]),
            )
            candidate = head + [first]
            if not unseen.below(*unseen.node_of(candidate)):
                continue  # every completion of this child was taken: it can only repeat
            candidate += _descend(
                codes, n_values, rewards, weights, order, inactive_under, revision_rng, policy,
                candidate, stats, failed,
            )
            if not unseen.repeats(candidate):
                return candidate
        if budget <= 0:
            break
    # Every bounded revision landed on a known configuration (a well-trodden part of the tree,
    # typical once pruned trials fill it): search the tree in preference order for the first
    # configuration no trial took. Without this, the duplicate is proposed again and again.
    if not unseen.below({}, unseen.every_row):
        return steps  # every path was taken: nothing better than the planned one
    fresh = _first_unseen_path(
        codes, n_values, rewards, weights, order, inactive_under, rng, policy, stats, failed,
        known, known_partial, unseen,
    )
    return steps if fresh is None else fresh


class _UnseenPaths:
    """Whether some path below a node repeats no row of ``known``: the walk of
    :func:`_first_unseen_path` without scores, a fraction of its cost per node. The scored
    search asks it before entering a child, so it never scores its way through a subtree
    whose paths were all taken (common in small spaces after some hundreds of trials).
    Answers True once ``max_nodes`` nodes were walked (then the scored search decides).

    A node's rows are a set of rows of ``known`` held as an int bit mask (bit ``i``: row
    ``i``): the walk visits hundreds of nodes of a few rows each, where a numpy call per
    step would cost more than the work, while narrowing a bit mask to a child is one ``&``.
    """

    def __init__(self, known, known_partial, n_values, order, inactive_under,
                 max_nodes: int = 2048) -> None:
        self._n_values, self._order, self._inactive_under = n_values, order, inactive_under
        self._left = max_nodes
        # a node's rows follow from its decisions, which both searches make in ``order``, so
        # the decisions as a tuple name the node, and the next column is looked for after them
        self._answers: dict[tuple, bool] = {}
        self._position = {column: i for i, column in enumerate(order)}
        self.every_row = (1 << len(known)) - 1
        absent = known == ABSENT
        self._absent = _bit_rows(absent.T)
        # rows that took ``code`` or lack the column: those that reach that child (one
        # packbits per column: a plan builds these for every value of every column)
        self._open = [
            _bit_rows((known[:, column] == np.arange(n)[:, None]) | absent[:, column])
            for column, n in enumerate(n_values)
        ]
        # Leaves are most of the walk: their duplicate test (:func:`_is_duplicate` on the rows
        # that reached them) is one ``&`` with the rows that repeat a leaf of their decided
        # columns, found from the patterns of present columns once per set of columns.
        partial = (np.zeros(len(known), dtype=bool) if known_partial is None
                   else np.asarray(known_partial, dtype=bool))
        patterns = (~absent * (1 << np.arange(known.shape[1], dtype=object))).sum(axis=1) \
            if known.shape[1] > 62 else (~absent * (1 << np.arange(known.shape[1]))).sum(axis=1)
        self._leaf_rows: dict[int, int] = {}
        self._patterns = [
            (int(pattern), _bits((patterns == pattern) & ~partial),
             _bits((patterns == pattern) & partial))
            for pattern in np.unique(patterns)
        ]

    def child(self, reached: int, column: int, code: int) -> int:
        """The rows of ``reached`` that reach the child ``code`` of a node at ``column``."""
        return reached & self._open[column][code]

    def node_of(self, steps: Sequence[Step]) -> tuple[dict[int, int], int]:
        """The decisions of the path ``steps`` and the rows that reach its end: the arguments
        :meth:`below` takes for that node."""
        rows = self.every_row
        for step in steps:
            rows &= self._open[step.column][step.code]
        return {step.column: step.code for step in steps}, rows

    def repeats(self, steps: Sequence[Step]) -> bool:
        """:func:`_is_duplicate` of the path ``steps`` on ``known``."""
        decided, rows = self.node_of(steps)
        return bool(rows & self._repeaters(sum(1 << column for column in decided)))

    def below(self, decided: dict[int, int], reached: int) -> bool:
        start = max((self._position[c] + 1 for c in decided), default=0)
        return self._below(decided, reached, start, sum(1 << c for c in decided))

    def _below(self, decided: dict[int, int], reached: int, start: int, mask: int) -> bool:
        """``below``, told where in ``order`` to look for the next column (after the last
        decided one) and the decided columns as a bit mask (the walk keeps both as it goes)."""
        if not reached:
            return True  # no row took this prefix: any completion is new
        key = tuple(decided.items())
        if key not in self._answers:
            self._answers[key] = self._walk(decided, reached, start, mask)
        return self._answers[key]

    def _walk(self, decided: dict[int, int], reached: int, start: int, mask: int) -> bool:
        column = self._next_column(decided, start)
        if column is None:
            return not reached & self._repeaters(mask)
        self._left -= 1
        if self._left < 0:
            return True
        children = [reached & rows for rows in self._open[column]]
        if not reached & self._absent[column] and not all(children):
            return True  # a child no row took
        start, mask = self._position[column] + 1, mask | 1 << column
        if self._next_column(decided, start) is None:
            # Nothing is left to ask even before this column's value is known (a value only
            # skips more), so every child is a leaf: its answer depends on its rows alone and
            # costs no budget, so it needs no entry in the memo.
            repeaters = self._repeaters(mask)
            return any(not rows & repeaters for rows in children)
        return any(self._below({**decided, column: code}, rows, start, mask)
                   for code, rows in enumerate(children))

    def _next_column(self, decided: dict[int, int], start: int) -> int | None:
        """The column a node asks next: the first one from ``start`` on in the order (every
        decided column comes before it) that the decisions do not skip."""
        for column in self._order[start:]:
            if not _inactive(column, decided, self._inactive_under):
                return column
        return None

    def _repeaters(self, mask: int) -> int:
        """The rows a leaf with decided columns ``mask`` repeats if they reach it (they agree
        with every decision or lack the column): a finished row that has no other column, a
        partial one that has exactly these."""
        rows = self._leaf_rows.get(mask)
        if rows is None:
            rows = 0
            for pattern, finished, partial in self._patterns:
                if pattern & ~mask == 0:
                    rows |= finished
                if pattern == mask:
                    rows |= partial
            self._leaf_rows[mask] = rows
        return rows


def _bits(mask: np.ndarray) -> int:
    """A boolean row mask as an int with bit ``i`` set for row ``i``."""
    return int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")


def _bit_rows(masks: np.ndarray) -> list[int]:
    """:func:`_bits` of each row of a 2-D boolean array."""
    packed = np.packbits(masks, axis=1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in packed]


def _first_unseen_path(
    codes, n_values, rewards, weights, order, inactive_under, rng, policy, stats, failed,
    known, known_partial, unseen: _UnseenPaths, max_nodes: int = 512,
) -> list[Step] | None:
    """Depth-first search, children in UCT order, for a path that repeats no row.

    Only nodes some row reached are searched (below any other node every completion is new, so
    the usual descent completes the path), and only children with an unseen path below them
    (``unseen``), so the search is bounded by the history, and by ``max_nodes`` besides.
    None when every path of the tree was taken.
    """
    failed_codes = codes[failed] if failed is not None else codes[:0]
    visited = [0]

    # ``node``: rows of the whole history at this node (for the scores); ``reached``: the
    # repeatable rows there (only they can make the path a duplicate; a bit mask of
    # ``unseen``). Both are narrowed on the way down rather than recomputed.
    def search(head: list[Step], node: np.ndarray, reached: int) -> list[Step] | None:
        if not reached:  # no row took this prefix: complete it the usual way
            return head + _descend(
                codes, n_values, rewards, weights, order, inactive_under, rng, policy, head,
                stats, failed,
            )
        decided = {s.column: s.code for s in head}
        column = next(
            (c for c in order if c not in decided and not _inactive(c, decided, inactive_under)),
            None,
        )
        if column is None:  # a leaf: ``unseen`` tests it exactly (and has, before entering)
            return head if unseen.below(decided, reached) else None
        visited[0] += 1
        if visited[0] > max_nodes:
            return None
        scores = _child_scores(
            codes, n_values, rewards, weights, node, column, policy, stats, decided
        )
        # Children that complete a failed prefix are left out, not ranked last: every path
        # below one is unseen (it failed before asking the rest), so entering one proposes
        # the failure again with other deeper values.
        allowed = _DeadEnds(failed_codes, decided).allowed(column, n_values[column])
        ranking = sorted(
            (c for c in range(n_values[column]) if allowed is None or allowed[c]),
            key=lambda c: (-scores.score[c], c),
        )
        for code in ranking:
            below = unseen.child(reached, column, code)
            if not unseen.below({**decided, column: code}, below):
                continue
            step = Step(column, code, float(scores.score[code]), float(scores.value[code]),
                        float(scores.visits[code]))
            found = search(head + [step], narrow(codes, node, column, code), below)
            if found is not None or visited[0] > max_nodes:
                return found
        return None

    return search([], np.arange(len(codes)), unseen.every_row)


class _ScoreMemo:
    """What one :func:`plan_path` call scores more than once: each column's statistics over
    all rows, and each node's child scores (the revisions and the search after them go back
    through nodes the first descent scored). Valid for one table of rows only."""

    def __init__(self) -> None:
        self.columns: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.nodes: dict[tuple[frozenset, int], ChildScores] = {}


def _scores_at(codes, n_values, rewards, weights, head, column, policy, stats) -> ChildScores:
    decided = {s.column: s.code for s in head}
    return _child_scores(codes, n_values, rewards, weights, None, column, policy, stats, decided)


def _child_scores(codes, n_values, rewards, weights, rows, column, policy, stats, decided):
    """The child scores of the node ``decided`` at ``column``; ``rows``: the node's rows, if
    the caller has them (None: found from ``decided`` unless the memo answers)."""
    key = (frozenset(decided.items()), column)
    if key in stats.nodes:
        return stats.nodes[key]
    if rows is None:
        rows = node_rows(codes, decided)
    if column not in stats.columns:
        stats.columns[column] = value_statistics(
            codes, column, n_values[column], rewards, weights, with_best=policy.max_backup > 0
        )
    scores = stats.nodes[key] = child_scores(
        codes, column, n_values[column], rewards, weights, rows,
        exploration=policy.exploration, rave_equivalence=policy.rave_equivalence,
        rave_visit_share=policy.rave_visit_share, global_stats=stats.columns[column],
        max_backup=policy.max_backup,
    )
    return scores


def _descend(
    codes, n_values, rewards, weights, order, inactive_under, rng, policy, head, stats, failed
):
    decided = {s.column: s.code for s in head}
    rows = node_rows(codes, decided)
    dead_ends = _DeadEnds(codes[failed] if failed is not None else codes[:0], decided)
    steps: list[Step] = []
    for column in order:
        if column in decided or _inactive(column, decided, inactive_under):
            continue
        scores = _child_scores(
            codes, n_values, rewards, weights, rows, column, policy, stats, decided
        )
        code = pick(scores.score, rng, dead_ends.allowed(column, n_values[column]))
        dead_ends.decide(column, code)
        steps.append(
            Step(column, code, float(scores.score[code]), float(scores.value[code]),
                 float(scores.visits[code]))
        )
        decided[column] = code
        rows = narrow(codes, rows, column, code)
    return steps


class _DeadEnds:
    """Children that would complete the decisions of a failed trial.

    A trial that failed after asking params P with values V (an invalid layout is found as
    soon as its last offending choice is made) says the prefix V fails: a child that would make
    the path contain all of V is not taken while another child is left. Tracked incrementally:
    for each failed row, how many of its decisions the path has not matched yet.
    """

    def __init__(self, failed_codes: np.ndarray, decided: dict[int, int]) -> None:
        self._codes = failed_codes
        self._left = (failed_codes != ABSENT).sum(axis=1).astype(float)
        for column, code in decided.items():
            self.decide(column, code)

    def decide(self, column: int, code: int) -> None:
        if len(self._codes) == 0:
            return
        col = self._codes[:, column]
        self._left[col == code] -= 1
        self._left[(col != code) & (col != ABSENT)] = np.inf

    def allowed(self, column: int, n_values: int) -> np.ndarray | None:
        if len(self._codes) == 0:
            return None
        last = self._codes[self._left == 1, column]
        last = last[last >= 0]
        if last.size == 0:
            return None
        allowed = np.ones(n_values, dtype=bool)
        allowed[last] = False
        return allowed if allowed.any() else None


def _inactive(column: int, decided: dict[int, int], inactive_under) -> bool:
    for parent, codes_ in inactive_under.get(column, {}).items():
        if parent in decided and decided[parent] in codes_:
            return True
    return False


def _is_duplicate(
    codes: np.ndarray, steps: Sequence[Step], partial: np.ndarray | None = None
) -> bool:
    """Whether running this path would repeat a row.

    A row that ran to its end is repeated when the path takes every value the row took: a
    column the row lacks was not asked under those values, so a value the path plans for it is
    never asked either (the tree may not know that dependency yet, e.g. when the column comes
    first in the level order). A ``partial`` row (failed, or still running) may not have asked
    all its params yet, so it is repeated only by the path that takes exactly its decisions.
    """
    if len(codes) == 0:
        return False
    planned = np.full(codes.shape[1], ABSENT)
    for s in steps:
        planned[s.column] = s.code
    present = codes != ABSENT
    covers = np.all(~present | (codes == planned), axis=1)
    exact = np.all(codes == planned, axis=1)
    if partial is None:
        return bool(covers.any())
    return bool(np.any(np.where(partial, exact, covers)))
