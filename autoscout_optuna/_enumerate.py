"""Enumerate a define-by-run space and find its optimum (benchmarks store it once).

A define-by-run ``suggest`` function has no declared space: we replay it depth-first with a fake
trial that answers each ``suggest_*`` call from a path of choice indices, like an odometer.
Structural knobs (``_space.is_structural``) take every value; dense knobs take ``dense_points``
grid values (log-spaced for log knobs). A suggest that raises ``Infeasible`` part-way prunes
the whole subtree below the choices made so far.

``python -m autoscout_optuna._enumerate llm_training preset=70b-512 --store`` prints the optimum
and stores it in ``studies/_optima.json``; ``--landscape`` instead says how rare good structures
are (how many reach each fraction of the optimum with dense knobs at the middle of their range)
and how rugged the structure space is for a search that changes one choice at a time.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autoscout_optuna._failure import Infeasible
from autoscout_optuna._space import discrete_values, from_unit, is_structural, to_unit
from autoscout_optuna._study_definition import StudyDefinition

Config = dict[str, Any]


def _grid(dist: BaseDistribution, points: int) -> list[Any]:
    if is_structural(dist):
        return discrete_values(dist)
    values: list[Any] = []
    for u in np.linspace(0.0, 1.0, max(points, 1)) if points > 1 else [0.5]:
        value = from_unit(dist, float(u))
        if value not in values:
            values.append(value)
    return values


class _ReplayTrial:
    """Answers suggest calls from a path of indices (or from forced values), recording domains.

    Args:
        path: Index of the value to take at each successive suggest call (0 past its end).
        dense_points: Grid size for dense knobs.
        forced: Values to take for named params instead of the path (refinement).
    """

    def __init__(
        self, path: list[int], dense_points: int, forced: Mapping[str, Any] | None = None
    ) -> None:
        self.path = path
        self.dense_points = dense_points
        self.forced = forced or {}
        self.sizes: list[int] = []
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, BaseDistribution] = {}
        self._grids: dict[tuple, tuple[BaseDistribution, list[Any]]] = {}

    def _take(self, name: str, key: tuple, make: Callable[[], BaseDistribution]) -> Any:
        cached = self._grids.get(key)
        if cached is None:
            dist = make()
            cached = self._grids[key] = (dist, _grid(dist, self.dense_points))
        dist, grid = cached
        if name in self.forced:
            value = self.forced[name]
        else:
            depth = len(self.sizes)
            index = self.path[depth] if depth < len(self.path) else 0
            self.sizes.append(len(grid))
            value = grid[index]
        self.params[name] = value
        self.distributions[name] = dist
        return value

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        key = (name, "categorical", tuple(choices))
        return self._take(name, key, lambda: CategoricalDistribution(list(choices)))

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int:
        key = (name, "int", low, high, step, log)
        return int(
            self._take(name, key, lambda: IntDistribution(low, high, step=step, log=log))
        )

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None,
        log: bool = False,
    ) -> float:
        key = (name, "float", low, high, step, log)
        return float(
            self._take(name, key, lambda: FloatDistribution(low, high, step=step, log=log))
        )

    def set_user_attr(self, key: str, value: Any) -> None:
        """No-op: enumeration records nothing."""

    def report(self, value: float, step: int) -> None:
        """No-op."""

    def should_prune(self) -> bool:
        return False


def _next_path(path: list[int], sizes: list[int]) -> list[int] | None:
    """Advance the odometer at the deepest call that has another value; None when done."""
    taken = [path[i] if i < len(path) else 0 for i in range(len(sizes))]
    for depth in range(len(sizes) - 1, -1, -1):
        if taken[depth] + 1 < sizes[depth]:
            return taken[:depth] + [taken[depth] + 1]
    return None


def _walk(
    suggest: Callable[[Any], Config], dense_points: int
) -> Iterator[tuple[Config, _ReplayTrial]]:
    # Shared grid cache: rebuilding grids per replay would dominate the run time.
    grids: dict[tuple, tuple[BaseDistribution, list[Any]]] = {}
    path: list[int] | None = []
    while path is not None:
        trial = _ReplayTrial(path, dense_points)
        trial._grids = grids
        try:
            config = suggest(trial)
        except Infeasible:
            config = None
        if config is not None:
            yield config, trial
        path = _next_path(path, trial.sizes)


def enumerate_configs(suggest: Callable[[Any], Config], dense_points: int = 5) -> Iterator[Config]:
    """Every config of a define-by-run space, dense knobs on a ``dense_points`` grid.

    Configs whose suggest raises ``Infeasible`` (invalid layouts detected while suggesting) are
    skipped together with everything below the choice that made them invalid.

    Args:
        suggest: A define-by-run function taking a trial-like object and returning a config.
        dense_points: Grid values per dense knob (log-spaced for log knobs); 1 takes the middle.
    """
    if dense_points < 1:
        raise ValueError(f"dense_points must be >= 1, got {dense_points}")
    for config, _ in _walk(suggest, dense_points):
        yield config


def _score(definition: StudyDefinition, config: Config) -> float | None:
    try:
        value = float(definition.measure(config, None))
    except Infeasible:
        return None
    if not math.isfinite(value):
        return None
    return value if definition.direction == "maximize" else -value


def _replay(definition: StudyDefinition, params: Mapping[str, Any]) -> tuple[Config, dict] | None:
    trial = _ReplayTrial([], 1, forced=params)
    try:
        config = definition.suggest(trial)
    except Infeasible:
        return None
    return config, trial


def _refine(
    definition: StudyDefinition, params: dict[str, Any], score: float, fine_points: int
) -> tuple[float, dict[str, Any]]:
    """Coordinate-wise 1-D grid search over the dense params until no coordinate improves."""
    improved = True
    while improved:
        improved = False
        replay = _replay(definition, params)
        if replay is None:
            break
        _, trial = replay
        for name, dist in trial.distributions.items():
            if is_structural(dist) or name not in params:
                continue
            if isinstance(dist, IntDistribution) and dist.high - dist.low < fine_points:
                candidates = list(range(dist.low, dist.high + 1, 1 if dist.log else dist.step))
            else:
                candidates = [from_unit(dist, float(u)) for u in np.linspace(0, 1, fine_points)]
            for value in candidates:
                trial_params = dict(params, **{name: value})
                replayed = _replay(definition, trial_params)
                if replayed is None:
                    continue
                candidate_score = _score(definition, replayed[0])
                if candidate_score is not None and candidate_score > score * (1 + 1e-12):
                    score, params, improved = candidate_score, trial_params, True
    return score, params


# Evaluations of the joint dense search per refined config. On ``llm_serving`` (70B, H100) it
# found 26.044 where coordinate-wise refinement had stopped at 25.320 (2.9 % lower: one more
# concurrent sequence pays only with more batched tokens and more memory at once); SciPy's
# differential evolution on that structure's four dense knobs (3 x ~3,000 evaluations) found
# nothing better. Training's optima moved by less than 1e-5.
POLISH_EVALS = 3000
# The joint search's first step (unit cube), its widest, and the narrowest before a restart
_POLISH_STEPS = (0.1, 0.5, 1e-3)


def _polish(
    definition: StudyDefinition, params: dict[str, Any], score: float,
    rng: np.random.Generator, n_evals: int = POLISH_EVALS,
) -> tuple[float, dict[str, Any]]:
    """A (1+1) evolution strategy on all dense knobs at once, in unit space: it moves where
    knobs trade off against each other, where a one-coordinate search stops. The step widens
    after a success and narrows after a failure, and restarts once it has shrunk to nothing."""
    replay = _replay(definition, params)
    if replay is None:
        return score, params
    dense = [(name, dist) for name, dist in replay[1].distributions.items()
             if not is_structural(dist) and name in params]
    if not dense:
        return score, params
    position = np.array([to_unit(dist, params[name]) for name, dist in dense])
    first, widest, narrowest = _POLISH_STEPS
    step = first
    for _ in range(n_evals):
        moved = np.clip(position + step * rng.standard_normal(len(dense)), 0.0, 1.0)
        candidate = dict(params, **{name: from_unit(dist, float(u))
                                    for (name, dist), u in zip(dense, moved, strict=True)})
        replayed = _replay(definition, candidate)
        candidate_score = _score(definition, replayed[0]) if replayed is not None else None
        if candidate_score is not None and candidate_score > score * (1 + 1e-12):
            score, params, position = candidate_score, candidate, moved
            step = min(widest, step * 1.5)
        else:
            step *= 0.95
            if step < narrowest:
                step = first
    return score, params


def find_optimum(
    definition: StudyDefinition, dense_points: int = 5, refine: bool = True, top: int = 20,
    fine_points: int = 65, polish_evals: int = POLISH_EVALS, seed: int = 0,
) -> tuple[float, Config]:
    """The best noiseless ``measure`` value over the space, and the config reaching it.

    Enumerates the grid, keeps the ``top`` configs, then (``refine``) improves their dense knobs
    one coordinate at a time on a ``fine_points`` grid (every integer for small int ranges),
    then all at once (``polish_evals`` evaluations of a seeded evolution strategy, 0: none),
    then one coordinate at a time again.

    Raises:
        ValueError: when every config is infeasible.
    """
    best: list[tuple[float, int, dict[str, Any]]] = []
    for counter, (config, trial) in enumerate(_walk(definition.suggest, dense_points)):
        score = _score(definition, config)
        if score is None:
            continue
        entry = (score, counter, dict(trial.params))
        if len(best) < top:
            heapq.heappush(best, entry)
        elif score > best[0][0]:
            heapq.heapreplace(best, entry)
    if not best:
        raise ValueError(f"every configuration of {definition.name!r} is infeasible")
    results = [(score, params) for score, _, params in sorted(best, reverse=True)]
    if refine:
        rng = np.random.default_rng(seed)
        refined: dict[str, tuple[float, dict[str, Any]]] = {}
        for score, params in results:
            score, params = _refine(definition, params, score, fine_points)
            key = repr(sorted(params.items()))
            if key in refined:  # grid points that refine to the same config: polished once
                continue
            score, params = _polish(definition, params, score, rng, polish_evals)
            refined[key] = _refine(definition, params, score, fine_points)
        results = list(refined.values())
    score, params = max(results, key=lambda item: item[0])
    config, _ = _replay(definition, params)
    value = score if definition.direction == "maximize" else -score
    return value, config


LANDSCAPE_LEVELS = (0.99, 0.97, 0.95, 0.9, 0.8)
# Local maxima listed by value in ``landscape``'s answer (the rest are counted).
TOP_LOCAL_MAXIMA = 5


def landscape(
    definition: StudyDefinition, levels: Sequence[float] = LANDSCAPE_LEVELS
) -> dict[str, Any]:
    """How hard the study is for a search: its structures, how many are infeasible, how
    many reach each of ``levels`` (fractions of the stored optimum, best/optimum as the
    benchmarks score it) with every dense knob at the middle of its range, and how rugged the
    feasible ones are under one-change moves (:func:`one_change_neighbours`).

    A level no structure reaches untuned says that the dense knobs must be tuned too; one that
    a single structure reaches says the search must find that one. ``local_maxima`` counts the
    feasible structures that no one-change neighbour beats (``top_local_maxima``: the best of
    them), and ``best_basin`` is the share of feasible structures from which always taking the
    best one-change neighbour ends on the best structure: where it is small, a search that
    changes one choice at a time stops short from most starts.

    Raises:
        ValueError: when the definition has no stored optimum.
    """
    if definition.optimum is None:
        raise ValueError(f"{definition.name!r} has no stored optimum to compare with")
    optimum = abs(float(definition.optimum))
    ratios: list[float] = []
    structures: list[dict[str, Any]] = []
    n_infeasible = 0
    for config, trial in _walk(definition.suggest, 1):
        score = _score(definition, config)
        if score is None:
            n_infeasible += 1
            continue
        value = abs(score)
        ratios.append(value / optimum if definition.direction == "maximize" else optimum / value)
        structures.append({name: trial.params[name]
                           for name, dist in trial.distributions.items() if is_structural(dist)})
    reached = np.asarray(ratios, dtype=float)
    ends = steepest_ascent(reached, one_change_neighbours(structures))
    peaks = np.unique(ends)
    best = int(np.argmax(reached)) if reached.size else -1
    return {
        "structures": len(ratios) + n_infeasible,
        "infeasible": n_infeasible,
        "best_untuned": float(reached.max()) if reached.size else None,
        "reaching": {f"{level:g}": int((reached >= level).sum()) for level in levels},
        "local_maxima": int(peaks.size),
        "top_local_maxima": [round(float(v), 4) for v in
                             sorted(reached[peaks], reverse=True)[:TOP_LOCAL_MAXIMA]],
        "best_basin": round(float(np.mean(ends == best)), 4) if reached.size else None,
    }


def one_change_neighbours(structures: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
    """Per structure, the indices of those one structural choice away from it.

    Two structures are one change apart when exactly one of the params both ask differs: a
    param only one of them asks was switched on or off by that change (``pp`` from 1 to 2 asks
    ``vpp``), which a search makes with the same step.
    """
    names = sorted({name for params in structures for name in params})
    lookups: list[dict[str, int]] = [{} for _ in names]
    codes = np.full((len(structures), len(names)), -1, dtype=np.int64)
    for i, params in enumerate(structures):
        for j, name in enumerate(names):
            if name in params:
                codes[i, j] = lookups[j].setdefault(repr(params[name]), len(lookups[j]))
    asked = codes >= 0
    neighbours = []
    for i in range(len(structures)):
        differs = (codes != codes[i]) & asked & asked[i]
        neighbours.append(np.flatnonzero(differs.sum(axis=1) == 1))
    return neighbours


def steepest_ascent(values: np.ndarray, neighbours: Sequence[np.ndarray]) -> np.ndarray:
    """Per structure, where always moving to the best neighbour while it is better ends (the
    structure itself when no neighbour beats it: a local maximum)."""
    step = np.arange(len(values))
    for i, around in enumerate(neighbours):
        if around.size:
            j = int(around[np.argmax(values[around])])
            if values[j] > values[i]:
                step[i] = j
    ends = step.copy()
    while True:  # each move strictly improves, so the walk ends
        following = step[ends]
        if np.array_equal(following, ends):
            return ends
        ends = following


def _parse_option(text: str) -> tuple[str, Any]:
    key, _, raw = text.partition("=")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def main(argv: list[str] | None = None) -> int:
    from autoscout_optuna import studies
    from autoscout_optuna.studies._optima import optimum_key, store_optimum

    parser = argparse.ArgumentParser(prog="python -m autoscout_optuna._enumerate")
    parser.add_argument("study", help="bundled study name, e.g. llm_training")
    parser.add_argument("options", nargs="*", help="study options as key=value (JSON values)")
    parser.add_argument("--dense-points", type=int, default=5)
    parser.add_argument("--store", action="store_true", help="write into studies/_optima.json")
    parser.add_argument("--landscape", action="store_true",
                        help="count the structures reaching each fraction of the optimum")
    args = parser.parse_args(argv)
    definition = studies.load(args.study, **dict(map(_parse_option, args.options)))
    if args.landscape:
        print(json.dumps(landscape(definition), indent=1))
        return 0
    value, config = find_optimum(definition, dense_points=args.dense_points)
    options = dict(definition.options)
    key = optimum_key(definition.name, options)
    default_value = None
    if definition.default_config is not None:
        default_value = _score(definition, dict(definition.default_config))
    print(json.dumps({"key": key, "value": value, "default": default_value, "config": config},
                     indent=1, default=str))
    if args.store:
        store_optimum(key, value, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
