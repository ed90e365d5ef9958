"""Enumeration of define-by-run spaces and the optimum search used to store study optima."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from autoscout_optuna._enumerate import (
    enumerate_configs,
    find_optimum,
    landscape,
    main,
    one_change_neighbours,
    steepest_ascent,
)
from autoscout_optuna._failure import Infeasible
from autoscout_optuna._study_definition import StudyDefinition


def _conditional(trial):
    kind = trial.suggest_categorical("kind", ["int", "float"])
    if kind == "int":
        return {"kind": kind, "n": trial.suggest_int("n", 1, 3)}
    return {"kind": kind, "x": trial.suggest_float("x", 0.0, 1.0)}


def test_structural_knobs_take_every_value_and_dense_knobs_a_grid():
    configs = list(enumerate_configs(_conditional, dense_points=5))
    assert [c["n"] for c in configs if c["kind"] == "int"] == [1, 2, 3]
    assert [c["x"] for c in configs if c["kind"] == "float"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len(configs) == 8


def test_log_knobs_get_a_log_grid_and_large_int_ranges_are_dense():
    def suggest(trial):
        return {
            "lr": trial.suggest_float("lr", 1e-4, 1e-2, log=True),
            "units": trial.suggest_int("units", 1, 1000),
        }

    configs = list(enumerate_configs(suggest, dense_points=3))
    assert sorted({round(c["lr"], 10) for c in configs}) == [1e-4, 1e-3, 1e-2]
    low, middle, high = sorted({c["units"] for c in configs})
    assert (low, high) == (1, 1000) and abs(middle - 500.5) <= 0.5
    assert len(configs) == 9


def test_single_dense_point_is_the_middle():
    configs = list(enumerate_configs(_conditional, dense_points=1))
    assert [c["x"] for c in configs if c["kind"] == "float"] == [0.5]


def test_infeasible_prefix_prunes_its_subtree():
    calls = []

    def suggest(trial):
        a = trial.suggest_categorical("a", [1, 2, 3])
        if a == 2:
            raise Infeasible("invalid_layout", "a=2")
        b = trial.suggest_categorical("b", ["x", "y"])
        calls.append((a, b))
        return {"a": a, "b": b}

    configs = list(enumerate_configs(suggest))
    assert [(c["a"], c["b"]) for c in configs] == [(1, "x"), (1, "y"), (3, "x"), (3, "y")]
    assert calls == [(1, "x"), (1, "y"), (3, "x"), (3, "y")]


def test_dense_points_is_validated():
    with pytest.raises(ValueError, match="dense_points"):
        list(enumerate_configs(_conditional, dense_points=0))


def _toy_definition(direction="maximize", target=0.37):
    def suggest(trial):
        mode = trial.suggest_categorical("mode", ["good", "bad", "broken"])
        x = trial.suggest_float("x", 0.0, 1.0)
        return {"mode": mode, "x": x}

    def measure(config, rng=None):
        if config["mode"] == "broken":
            raise Infeasible("oom")
        penalty = 0.0 if config["mode"] == "good" else 0.5
        value = 1.0 - (config["x"] - target) ** 2 - penalty
        return value if direction == "maximize" else -value

    return StudyDefinition(name="toy", direction=direction, metric="score",
                           suggest=suggest, measure=measure)


def test_find_optimum_refines_dense_knobs_beyond_the_grid():
    coarse_value, coarse = find_optimum(_toy_definition(), dense_points=5, refine=False)
    assert coarse["mode"] == "good" and coarse["x"] == pytest.approx(0.25)
    value, config = find_optimum(_toy_definition(), dense_points=5, refine=True)
    assert config["mode"] == "good"
    assert abs(config["x"] - 0.37) <= 1 / 64
    assert value > coarse_value
    assert value == pytest.approx(1.0 - (config["x"] - 0.37) ** 2)


def test_find_optimum_minimizes_too():
    value, config = find_optimum(_toy_definition(direction="minimize"), dense_points=5)
    assert config["mode"] == "good"
    assert value == pytest.approx(-(1.0 - (config["x"] - 0.37) ** 2))
    assert value < -0.99


def test_find_optimum_fails_loudly_when_nothing_is_feasible():
    def measure(config, rng=None):
        raise Infeasible("oom")

    definition = StudyDefinition(name="none", direction="maximize", metric="x",
                                 suggest=_conditional, measure=measure)
    with pytest.raises(ValueError, match="infeasible"):
        find_optimum(definition)


def test_find_optimum_never_returns_a_nan():
    def measure(config, rng=None):
        return math.nan if config["kind"] == "int" else config["x"]

    definition = StudyDefinition(name="nan", direction="maximize", metric="x",
                                 suggest=_conditional, measure=measure)
    value, config = find_optimum(definition, dense_points=3)
    assert value == 1.0 and config["kind"] == "float"


def test_landscape_counts_structures_by_how_close_they_come_untuned():
    # x at the middle (0.5): "good" scores 0.98 of the optimum 1.0, "bad" 0.49, "broken" fails
    def measure(config, rng=None):
        if config["mode"] == "broken":
            raise Infeasible("oom")
        return (1.0 if config["mode"] == "good" else 0.5) * (1.0 - (config["x"] - 0.36) ** 2)

    definition = StudyDefinition(
        name="toy", direction="maximize", metric="score", suggest=_toy_definition().suggest,
        measure=measure, optimum=1.0,
    )
    result = landscape(definition, levels=(0.99, 0.95, 0.4))
    assert result["structures"] == 3 and result["infeasible"] == 1
    assert result["best_untuned"] == pytest.approx(1.0 - 0.14**2)
    assert result["reaching"] == {"0.99": 0, "0.95": 1, "0.4": 2}


def test_landscape_scores_a_minimized_metric_as_optimum_over_value():
    def measure(config, rng=None):
        return 2.0 if config["kind"] == "int" else 4.0

    definition = StudyDefinition(name="cost", direction="minimize", metric="s",
                                 suggest=_conditional, measure=measure, optimum=2.0)
    result = landscape(definition, levels=(0.99, 0.5))
    # three int structures (n = 1, 2, 3) reach the optimum, the float one half of it
    assert result["reaching"] == {"0.99": 3, "0.5": 4}


def test_landscape_needs_a_stored_optimum():
    definition = StudyDefinition(name="none", direction="maximize", metric="x",
                                 suggest=_conditional, measure=lambda config, rng=None: 1.0)
    with pytest.raises(ValueError, match="no stored optimum"):
        landscape(definition)


def test_one_change_neighbours_count_only_the_params_both_ask():
    structures = [{"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 2, "b": 2}, {"a": 1, "b": 2}, {"a": 3}]
    neighbours = [list(n) for n in one_change_neighbours(structures)]
    # a=3 does not ask b: it is one change (of a) from every structure
    assert neighbours[0] == [1, 3, 4]
    assert neighbours[2] == [1, 3, 4]
    assert neighbours[4] == [0, 1, 2, 3]


def test_steepest_ascent_ends_on_the_local_maximum_of_each_start():
    values = np.array([0.2, 0.9, 0.5, 1.0, 0.1])
    neighbours = [np.array(n) for n in ([1, 2], [0], [0, 3], [2, 4], [3])]
    assert list(steepest_ascent(values, neighbours)) == [1, 1, 3, 3, 3]


# untuned values: two peaks under one-change moves, (tp 1, a) at 0.9 and (tp 4, b) at 1.0
_RUGGED = {(1, "a"): 0.9, (2, "a"): 0.5, (4, "a"): 0.6, (1, "b"): 0.4, (2, "b"): 0.7,
           (4, "b"): 1.0}


def _rugged_suggest(trial):
    config = {"tp": trial.suggest_categorical("tp", [1, 2, 4]),
              "mode": trial.suggest_categorical("mode", ["a", "b"])}
    config["x"] = trial.suggest_float("x", 0.0, 1.0)  # dense: not part of a structure
    return config


def test_landscape_counts_local_maxima_and_the_best_structures_basin():
    definition = StudyDefinition(
        name="rugged", direction="maximize", metric="score", suggest=_rugged_suggest,
        measure=lambda config, rng=None: _RUGGED[config["tp"], config["mode"]], optimum=1.0,
    )
    result = landscape(definition)
    assert result["local_maxima"] == 2
    assert result["top_local_maxima"] == [1.0, 0.9]
    # (tp 1, a) and (tp 2, a) climb to the 0.9 peak; the other four reach the best
    assert result["best_basin"] == pytest.approx(4 / 6, abs=1e-4)


def test_the_landscape_command_prints_the_counts_for_a_bundled_study(capsys):
    assert main(["llm_serving", "--landscape"]) == 0
    result = json.loads(capsys.readouterr().out)
    feasible = result["structures"] - result["infeasible"]
    assert feasible > 0 and 1 <= result["local_maxima"] <= feasible
    assert result["top_local_maxima"][0] == pytest.approx(result["best_untuned"], abs=1e-4)
    assert 0.0 < result["best_basin"] <= 1.0


def test_find_optimum_moves_knobs_together_where_one_at_a_time_cannot():
    # feasible only along a narrow diagonal (x and y must move together, as vLLM's sequences,
    # batched tokens and memory fraction do) and up to x + y = 1.7: from the grid's best
    # point (0.75, 0.75) no single knob can move, both together can
    def suggest(trial):
        return {"x": trial.suggest_float("x", 0.0, 1.0), "y": trial.suggest_float("y", 0.0, 1.0)}

    def measure(config, rng=None):
        x, y = config["x"], config["y"]
        if abs(x - y) >= 0.01 or x + y > 1.7:
            raise Infeasible("oom")
        return x + y

    definition = StudyDefinition(name="ridge", direction="maximize", metric="x",
                                 suggest=suggest, measure=measure)
    one_at_a_time, _ = find_optimum(definition, polish_evals=0)
    assert one_at_a_time == pytest.approx(1.5)
    value, config = find_optimum(definition)
    assert 1.65 < value <= 1.7 and value == pytest.approx(config["x"] + config["y"])
    assert find_optimum(definition) == (value, config)  # seeded: the stored optimum is stable
