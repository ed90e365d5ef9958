"""What a ready-made study is: a define-by-run space, a cheap simulator, a real evaluator.

Presets in ``studies/`` (importable as ``autoscout_optuna.studies``) each build one
:class:`StudyDefinition`; the CLI, the benchmark and the fidelity layer only see this type.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from autoscout_optuna._failure import Infeasible
from autoscout_optuna._keys import DEFAULT_CONFIG
from autoscout_optuna._space import is_structural

Config = dict[str, Any]


@dataclass(frozen=True)
class StudyDefinition:
    """A study preset.

    Attributes:
        name: Registry name, e.g. ``"llm_training"``.
        direction: ``"maximize"`` or ``"minimize"``.
        metric: What the value measures, with its unit, e.g. ``"tokens/s"``.
        suggest: Define-by-run space: takes an ``optuna.Trial`` (or anything with the same
            ``suggest_*`` methods) and returns the full config (params plus derived values).
        measure: The real measurement, or in benchmarks the reference evaluator playing it:
            ``measure(config, rng)`` returns the value, or raises ``Infeasible``. ``rng`` is None
            for the noiseless value (reference studies) and a generator for seeded noise.
        simulate: A cheap, coarser estimate ``simulate(config)``; raises ``Infeasible`` where
            the simulator predicts failure (e.g. out of memory). None if the study has none.
        default_config: The expert/default configuration, for "gain over default" reports.
        optimum: Best noiseless ``measure`` value, found once by enumeration (benchmarks).
        is_real: True when ``measure`` runs a real job (not a reference model): no noiseless
            value exists and benchmarks skip the study.
        description: One line for ``autoscout run --help`` and reports.
        options: The options the study was built with that change what it measures (JSON
            values; ``n_trials`` is ``autoscout run``'s default budget). ``autoscout run``
            stores them and resumes the study only with the same ones (``n_trials``,
            ``timeout``, ``log_dir`` and ``device`` may change): an option left out of them
            is not compared, and a study resumed with another value of it mixes measurements
            that do not compare.
        measure_trial: Optional real measurement that also gets the trial,
            ``measure_trial(trial, config)``, so a runner can record logs, telemetry and failure
            reasons on it. Objectives use it instead of ``measure`` when set; ``measure`` stays
            the trial-less form (e.g. for the default config).
        memory_use: Optional ``memory_use(config)``: the peak device memory of a config that
            fits, as a fraction of the device's capacity, from the reference model (what a real
            runner measures and reports). Objectives record it as user attr ``memory_use`` on
            each trial that ran; with ``memory_model=True`` the samplers learn from it which
            structures would not fit (:mod:`autoscout_optuna._memory`).
        memory_estimate: Optional ``memory_estimate(params)``: what a memory formula says of
            a structure's peak (a fraction of capacity) from its structural params, before it
            runs; the samplers' ``memory_estimate`` option
            (:mod:`autoscout_optuna.samplers._mcts.estimate`). None where it cannot say.
    """

    name: str
    direction: str
    metric: str
    suggest: Callable[[Any], Config]
    measure: Callable[[Mapping[str, Any], np.random.Generator | None], float]
    simulate: Callable[[Mapping[str, Any]], float] | None = None
    default_config: Mapping[str, Any] | None = None
    optimum: float | None = None
    is_real: bool = False
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    measure_trial: Callable[[Any, Mapping[str, Any]], float] | None = None
    memory_use: Callable[[Mapping[str, Any]], float] | None = None
    memory_estimate: Callable[[Mapping[str, Any]], float | None] | None = None

    def __post_init__(self) -> None:
        if self.direction not in ("maximize", "minimize"):
            raise ValueError(f"direction must be 'maximize' or 'minimize', got {self.direction!r}")

    def enqueue_default(self, study: optuna.Study) -> None:
        """Queue ``default_config`` as the study's next trial, tagged with the user attr
        ``autoscout:default_config`` (the dashboard's and ``FidelityPruner``'s baseline): the
        one way ``autoscout run`` and the benchmarks' "from the expert config" runs start."""
        if self.default_config is None:
            raise ValueError(f"study {self.name!r} has no default config to enqueue")
        study.enqueue_trial(dict(self.default_config), user_attrs={DEFAULT_CONFIG: True})


def expert_default(
    expert: Callable[[], Config], measure: Callable[[Config], Any],
    check_any_runs: Callable[[], None],
) -> Config | None:
    """A study's default config: the expert recipe's where it runs on the setup.

    Where it does not, ``check_any_runs`` raises a ValueError naming why when no config of the
    space can run at all (a study whose every trial fails says nothing); otherwise the default
    is None where the recipe has no valid layout on this setup (``invalid_layout``), else the
    expert config all the same (its failure, an out-of-memory say, is a measurement too).
    Only a recipe that fails pays for ``check_any_runs``.
    """
    try:
        config = expert()
        measure(config)
        return config
    except Infeasible as error:
        failure = error
    check_any_runs()
    return None if failure.reason == "invalid_layout" else expert()


def check_fixed(
    fixed: Mapping[str, Any] | None, domains: Mapping[str, optuna.distributions.BaseDistribution]
) -> dict[str, Any]:
    """``fixed`` checked against a study's knob ``domains``; raises ValueError naming the knob.

    A pinned value skips ``suggest_*`` and so every range check the trial would make: a knob
    name the study does not have was silently ignored, and a value outside the knob's domain
    or of the wrong type (``tp="2"``, ``bucket_size_mb=0``) failed every trial, or crashed the
    study mid-run, for a reason far from the option that caused it.
    """
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(domains))
    if unknown:
        raise ValueError(f"fixed: unknown knob(s) {unknown}; knobs are {sorted(domains)}")
    for name, value in fixed.items():
        dist = domains[name]
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            # type too: True == 1 and 2.0 == 2, but the study's code is written for its choices
            if not any(type(value) is type(c) and value == c for c in dist.choices):
                raise ValueError(f"fixed: {name} must be one of {list(dist.choices)}, "
                                 f"got {value!r}")
            continue
        integral = isinstance(dist, optuna.distributions.IntDistribution)
        kind = numbers.Integral if integral else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
            raise ValueError(f"fixed: {name} must be {'an int' if integral else 'a number'}, "
                             f"got {value!r}")
        if not dist.low <= value <= dist.high:
            raise ValueError(f"fixed: {name} must be in [{dist.low}, {dist.high}], got {value!r}")
    return fixed


class Knobs:
    """A thin wrapper over a trial's ``suggest_*`` that lets presets pin or default knobs.

    Study code calls ``knobs.categorical(...)``, ``knobs.int(...)``, ``knobs.float(...)`` with a
    ``default``, or declares its knobs once in ``space`` and calls ``knobs.suggest(name)``: the
    same ``space`` is then what ``fixed=`` is checked against (:func:`check_fixed`), so the two
    cannot drift apart. A knob named in ``fixed`` takes that value without being suggested (e.g.
    the structure fixed at a good layout); with ``dense_at_defaults=True`` every dense knob takes
    its default (the structural-only benchmark variant). Everything else is suggested as usual.
    With no trial (``None``: a whole config built from ``fixed``, such as an expert recipe with
    a user's pins) a knob ``fixed`` leaves out takes its default, and one without a default is a
    ValueError naming it.

    Args:
        trial: An ``optuna.Trial`` (or an object with the same suggest methods), or None.
        space: Each knob's distribution, for :meth:`suggest`.
        fixed: Knob values that are not searched.
        dense_at_defaults: Hold dense knobs at their defaults.
    """

    def __init__(
        self,
        trial: Any,
        *,
        space: Mapping[str, optuna.distributions.BaseDistribution] | None = None,
        fixed: Mapping[str, Any] | None = None,
        dense_at_defaults: bool = False,
    ) -> None:
        self.trial = trial
        self.space = space or {}
        self.fixed = dict(fixed or {})
        self.dense_at_defaults = dense_at_defaults

    def suggest(self, name: str, *, default: Any = None) -> Any:
        """Knob ``name`` over its distribution in ``space``: the same ``suggest_*`` call that
        :meth:`categorical`, :meth:`int` or :meth:`float` would make with its arguments."""
        dist = self.space.get(name)
        if dist is None:
            raise KeyError(f"knob {name!r} is not in the space; knobs are {sorted(self.space)}")
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            return self.categorical(name, list(dist.choices), default=default)
        if name in self.fixed:
            return self.fixed[name]
        return self._numeric(name, dist, default)

    def categorical(self, name: str, choices: list[Any], *, default: Any = None) -> Any:
        if name in self.fixed:
            return self.fixed[name]
        if self.trial is None:
            return self._default(name, default)
        return self.trial.suggest_categorical(name, choices)

    def int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False,
        default: int | None = None,
    ) -> int:
        if name in self.fixed:
            return self.fixed[name]
        dist = optuna.distributions.IntDistribution(low, high, step=step, log=log)
        return self._numeric(name, dist, default)

    def float(
        self, name: str, low: float, high: float, *, step: float | None = None,
        log: bool = False, default: float | None = None,
    ) -> float:
        if name in self.fixed:
            return self.fixed[name]
        dist = optuna.distributions.FloatDistribution(low, high, step=step, log=log)
        return self._numeric(name, dist, default)

    def _numeric(
        self, name: str,
        dist: optuna.distributions.IntDistribution | optuna.distributions.FloatDistribution,
        default: Any,
    ) -> Any:
        if self.dense_at_defaults and default is not None and not is_structural(dist):
            return default
        if self.trial is None:
            return self._default(name, default)
        suggest = (self.trial.suggest_int if isinstance(dist, optuna.distributions.IntDistribution)
                   else self.trial.suggest_float)
        return suggest(name, dist.low, dist.high, step=dist.step, log=dist.log)

    @staticmethod
    def _default(name: str, default: Any) -> Any:
        if default is None:
            raise ValueError(f"knob {name!r} has no value: with no trial to suggest it, it must "
                             "be fixed or have a default")
        return default
