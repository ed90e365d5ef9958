"""Smooth test functions with a known optimum, as :class:`StudyDefinition` presets.

Dense knobs only (floats, log floats, large int ranges), 2-10 dimensions, optimum off the middle
of the box so that no sampler gets it for free. Values are positive with the optimum known
exactly, so "99% of the optimum" is well defined in both directions. ``measure(config, rng)``
adds multiplicative Gaussian noise of relative size ``noise`` when ``rng`` is given.

Example:
    >>> from autoscout_optuna.benchmark import functions
    >>> sphere = functions.definition("sphere")
    >>> sphere.measure({"x": 1.7, "y": -2.1, "lr": 10 ** -3.4, "layers": 37}, None)
    1.0
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from autoscout_optuna._failure import Infeasible
from autoscout_optuna._space import to_unit
from autoscout_optuna._study_definition import Knobs, StudyDefinition

NOISE = 0.005  # relative measurement noise of the default presets

# (name, kind, low, high, log) per knob; "int" knobs have more than 16 values (dense).
_SPHERE = [("x", "float", -5.0, 5.0, False), ("y", "float", -5.0, 5.0, False),
           ("lr", "float", 1e-5, 1e-1, True), ("layers", "int", 1, 64, False)]
_ELLIPSOID = [("a", "float", 0.0, 10.0, False), ("wd", "float", 1e-6, 1e-1, True),
              ("width", "int", 16, 4096, True), ("b", "float", -1.0, 1.0, False),
              ("warmup", "int", 0, 2000, False), ("dropout", "float", 0.0, 0.5, False)]
_COUPLED = [(f"k{i}", "float", 0.0, 1.0, False) for i in range(8)] + [
    ("lr", "float", 1e-6, 1e-2, True), ("batch", "int", 8, 1024, True)]
_ROSENBROCK = [("x", "float", -1.5, 2.5, False), ("y", "float", -0.5, 3.5, False)]
_THROUGHPUT = [("micro_batch", "int", 1, 128, False), ("mem_fraction", "float", 0.5, 0.99, False),
               ("bucket_mb", "float", 1.0, 1000.0, True), ("loader_workers", "int", 1, 64, False)]


def _unit_target(knobs: list, values: Mapping[str, Any]) -> np.ndarray:
    """Unit-cube position of a configuration (the functions are defined in these coordinates)."""
    import optuna

    out = []
    for name, kind, low, high, log in knobs:
        dist = (optuna.distributions.IntDistribution(low, high, log=log) if kind == "int"
                else optuna.distributions.FloatDistribution(low, high, log=log))
        out.append(to_unit(dist, values[name]))
    return np.array(out)


# Optima, given in each knob's own units (ints exactly on the grid, so the optimum is reachable).
_SPHERE_BEST = {"x": 1.7, "y": -2.1, "lr": 10 ** -3.4, "layers": 37}
_ELLIPSOID_BEST = {"a": 6.8, "wd": 10 ** -3.7, "width": 512, "b": -0.35, "warmup": 600,
                   "dropout": 0.12}
_COUPLED_BEST = {**{f"k{i}": 0.2 + 0.07 * i for i in range(8)}, "lr": 10 ** -3.5, "batch": 128}


def _sphere(u: np.ndarray) -> float:
    return 1.0 + 10.0 * float(np.sum((u - _SPHERE_U) ** 2))


def _ellipsoid(u: np.ndarray) -> float:
    weights = 10.0 ** np.linspace(0.0, 2.0, len(u))  # condition number 100
    return 1.0 + float(np.sum(weights * (u - _ELLIPSOID_U) ** 2))


def _coupled(u: np.ndarray) -> float:
    delta = u - _COUPLED_U
    weights = 10.0 ** np.linspace(0.0, 1.0, len(u))
    return 1.0 + 5.0 * float(np.sum(weights * delta**2) + 0.5 * np.sum(delta) ** 2)


def _rosenbrock(config: Mapping[str, Any]) -> float:
    x, y = float(config["x"]), float(config["y"])
    return 1.0 + 100.0 * (y - x * x) ** 2 + (1.0 - x) ** 2


def _throughput(config: Mapping[str, Any]) -> float:
    """Samples/s of a training step: saturating in batch and workers, an OOM wall in memory."""
    batch, fraction = int(config["micro_batch"]), float(config["mem_fraction"])
    needed_gb = 12.0 + 0.55 * batch
    if needed_gb > 80.0 * fraction + 1e-9:
        raise Infeasible("oom", f"needs {needed_gb:.1f} GB, {80.0 * fraction:.1f} GB allowed")
    compute = batch / (batch + 8.0)
    allocator = 1.0 - 0.25 * max(0.0, fraction - 0.9) / 0.09  # fragmentation near the limit
    comm = 1.0 - 0.06 * math.log10(float(config["bucket_mb"]) / 200.0) ** 2
    workers = int(config["loader_workers"])
    loader = 1.0 - 0.3 * math.exp(-workers / 6.0) - 0.002 * workers  # CPU contention
    return 2000.0 * compute * allocator * comm * loader


def _throughput_optimum() -> float:
    best = 0.0
    for batch in range(1, 129):
        fraction = max(0.5, (12.0 + 0.55 * batch) / 80.0)
        if fraction > 0.99:
            break
        for workers in range(1, 65):
            config = {"micro_batch": batch, "mem_fraction": fraction, "bucket_mb": 200.0,
                      "loader_workers": workers}
            best = max(best, _throughput(config))
    return best


_SPHERE_U = _unit_target(_SPHERE, _SPHERE_BEST)
_ELLIPSOID_U = _unit_target(_ELLIPSOID, _ELLIPSOID_BEST)
_COUPLED_U = _unit_target(_COUPLED, _COUPLED_BEST)

#: name -> (knobs, value of a config, direction, optimum, description)
FUNCTIONS: dict[str, tuple[list, Callable[[Mapping[str, Any]], float], str, float, str]] = {
    "sphere": (_SPHERE, lambda c: _sphere(_unit_target(_SPHERE, c)), "minimize", 1.0,
               "shifted sphere, 4-D (2 float, 1 log float, 1 int)"),
    "ellipsoid": (_ELLIPSOID, lambda c: _ellipsoid(_unit_target(_ELLIPSOID, c)), "minimize", 1.0,
                  "axis-aligned ellipsoid, 6-D, condition 100, log and int knobs"),
    "coupled": (_COUPLED, lambda c: _coupled(_unit_target(_COUPLED, c)), "minimize", 1.0,
                "10-D ellipsoid with a rank-one coupling of all knobs (not separable)"),
    "rosenbrock": (_ROSENBROCK, _rosenbrock, "minimize", 1.0,
                   "Rosenbrock, 2-D: a curved valley (hard for coordinate moves)"),
    "throughput": (_THROUGHPUT, _throughput, "maximize", _throughput_optimum(),
                   "saturating throughput, 4-D, optimum against an OOM wall (Infeasible)"),
}


def names() -> list[str]:
    """Names accepted by :func:`definition`."""
    return list(FUNCTIONS)


def definition(name: str, *, noise: float = NOISE) -> StudyDefinition:
    """One test function as a study (``noise``: relative std of the measurement noise)."""
    if name not in FUNCTIONS:
        raise ValueError(f"name must be one of {names()}, got {name!r}")
    if not noise >= 0.0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    _, _, direction, optimum, description = FUNCTIONS[name]
    # Module-level functions under functools.partial: a definition pickles (worker processes).
    suggest = functools.partial(_suggest, name)
    measure = functools.partial(_measure, name, float(noise))
    return StudyDefinition(
        name=f"fn_{name}", direction=direction, metric="value", suggest=suggest,
        measure=measure, optimum=float(optimum), description=description,
        options={"noise": noise} if noise != NOISE else {},
    )


def _suggest(name: str, trial: Any) -> dict[str, Any]:
    pick = Knobs(trial)
    return {
        knob: (pick.int(knob, low, high, log=log) if kind == "int"
               else pick.float(knob, low, high, log=log))
        for knob, kind, low, high, log in FUNCTIONS[name][0]
    }


def _measure(
    name: str, noise: float, config: Mapping[str, Any], rng: np.random.Generator | None
) -> float:
    value = FUNCTIONS[name][1](config)
    if rng is not None and noise > 0.0:
        value *= 1.0 + noise * float(rng.standard_normal())
    return float(value)
