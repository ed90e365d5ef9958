"""The MCTS table builder: a table built trial by trial equals one encoded from scratch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from optuna.distributions import CategoricalDistribution, FloatDistribution

from autoscout_optuna._history import Observation
from autoscout_optuna._space import is_structural
from autoscout_optuna.samplers._mcts.encoding import Table, TableBuilder
from autoscout_optuna.samplers._mcts.plan import learn_dependencies_of


def _observation(number: int, rng: np.random.Generator, kind: str) -> Observation:
    params = {"layout": str(rng.choice(["a", "b", "c"]))}
    distributions = {"layout": CategoricalDistribution(["a", "b", "c"])}
    if params["layout"] != "a":
        params["tile"] = int(rng.choice([1, 2]))
        distributions["tile"] = CategoricalDistribution([1, 2])
    params["x"] = float(rng.choice([0.25, 0.5]))  # repeated dense values
    distributions["x"] = FloatDistribution(0.0, 1.0)
    if number >= 12:  # a new structural param appears: the columns change
        params["mode"] = bool(rng.random() < 0.5)
        distributions["mode"] = CategoricalDistribution([False, True])
    score = float(rng.random()) if kind in ("real", "estimate") else None
    attrs = {"memory_use": float(rng.uniform(0.2, 1.0))} if kind == "real" else {}
    if kind == "failed":
        attrs["failure_reason"] = str(rng.choice(["oom", "invalid_layout"]))
    return Observation(number, params, distributions, kind, score, attrs, {})


def _summary(table: Table) -> tuple:
    dense = [table.dense_values[i] for i in table.dense]
    return (table.names, table.codes.tolist(), table.positions.tolist(), table.kinds,
            table.scores, table.ask_rank, dense, table.dependencies, table.broke_rule.tolist(),
            np.nan_to_num(table.memory, nan=-1.0).tolist())


def test_a_table_built_trial_by_trial_equals_a_fresh_encoding():
    rng = np.random.default_rng(0)
    kinds = ["real", "failed", "estimate", "real"]
    observations = [_observation(n, rng, kinds[n % 4]) for n in range(20)]
    # trials finish out of order: 3 and 9 stay running for a while
    finish_order = [0, 1, 2, 4, 5, 6, 3, 7, 8, 10, 11, 12, 13, 9, 14, 15, 16, 17, 18, 19]
    builder = TableBuilder(lambda name, dist: is_structural(dist))
    done: list[Observation] = []
    for number in finish_order:
        done.append(observations[number])
        finished_numbers = {o.number for o in done}
        pending = [
            Observation(o.number, o.params, o.distributions, "pending", None, {}, {})
            for o in observations[: max(finished_numbers) + 2]
            if o.number not in finished_numbers
        ]
        table = builder.build(list(done), pending)
        fresh = TableBuilder(lambda name, dist: is_structural(dist)).build(list(done), pending)
        assert _summary(table) == _summary(fresh)
        # the dependencies learned row by row are those of the whole table
        assert table.dependencies == learn_dependencies_of(replace(table, dependencies=None))
    assert table.names == ["layout", "tile", "mode"]
    # the memory evidence lines up with the rows: finished by number, then running
    real = [o for o in sorted(done, key=lambda o: o.number) if o.kind == "real"]
    assert sorted(table.memory[np.isfinite(table.memory)]) == sorted(
        o.user_attrs["memory_use"] for o in real
    )
    assert table.dependencies.inactive_under == {1: {0: frozenset({0})}}
