"""Benchmark suites, one module per topic; each module defines ``suites(quick=False)``.

A module here is found by name: add ``<topic>.py`` with a ``suites`` function returning
``list[Suite]`` and ``python -m autoscout_optuna.benchmark`` picks it up. Import errors are not
swallowed: a broken suite module fails loudly, naming itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from pathlib import Path

from autoscout_optuna.benchmark._harness import Suite


def module_names() -> list[str]:
    """Names of the suite modules in this package."""
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def module_suites(module_name: str, *, quick: bool = False) -> list[Suite]:
    """The suites one module defines."""
    module = importlib.import_module(f"{__name__}.{module_name}")
    if not hasattr(module, "suites"):
        raise ValueError(f"suite module {module_name!r} has no suites(quick=False) function")
    return list(module.suites(quick=quick))


def all_suites(*, quick: bool = False) -> list[Suite]:
    """Every suite of every module, in module-name order."""
    return [suite for name in module_names() for suite in module_suites(name, quick=quick)]


def find(names: Sequence[str], *, quick: bool = False) -> list[Suite]:
    """Suites by suite name or by module name (a module name selects all of its suites, unless
    a suite has that name too: ``autoscout`` is the suite, not also ``autoscout-overhead``).

    Raises:
        ValueError: a name that matches no suite and no module.
    """
    modules = module_names()
    everything: list[Suite] | None = None
    chosen: list[Suite] = []
    for name in names:
        suites_of_module = module_suites(name, quick=quick) if name in modules else []
        exact = [suite for suite in suites_of_module if suite.name == name]
        if suites_of_module:
            chosen.extend(exact or suites_of_module)
            continue
        if everything is None:
            everything = all_suites(quick=quick)
        matches = [suite for suite in everything if suite.name == name]
        if not matches:
            known = sorted({s.name for s in everything} | set(modules))
            raise ValueError(f"unknown suite {name!r}; known: {', '.join(known)}")
        chosen.extend(matches)
    unique: dict[str, Suite] = {}
    for suite in chosen:
        unique.setdefault(suite.name, suite)
    return list(unique.values())
