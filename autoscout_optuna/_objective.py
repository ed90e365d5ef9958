"""Objectives built from a :class:`StudyDefinition`, sharing one failure-recording path."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from autoscout_optuna._failure import FAILURE_REASON_KEY, Infeasible, clip_detail
from autoscout_optuna._keys import MEMORY_USE as MEMORY_USE_KEY
from autoscout_optuna._keys import PINS_UNUSED
from autoscout_optuna._keys import TRUE_VALUE as TRUE_VALUE_KEY
from autoscout_optuna._rng import trial_rng
from autoscout_optuna._study_definition import StudyDefinition


def record_failure(trial: optuna.Trial, error: Infeasible) -> None:
    """Write why a trial failed where optuna-dashboard and ``trials_dataframe`` show it."""
    trial.set_user_attr(FAILURE_REASON_KEY, error.reason)
    if error.detail:
        trial.set_user_attr("failure_detail", clip_detail(error.detail))


def call_recording_failure(trial: optuna.Trial, fn: Callable[[], Any]) -> Any:
    """Call ``fn``; an :class:`Infeasible` is recorded on the trial and re-raised."""
    try:
        return fn()
    except Infeasible as error:
        record_failure(trial, error)
        raise


def suggest_recording(definition: StudyDefinition, trial: optuna.Trial) -> Any:
    """The config ``definition`` suggests for ``trial`` (an :class:`Infeasible` recorded).

    A knob pinned by the study's ``fixed`` that the config holds another value of was never
    asked by the trial's structure (``vpp`` at ``pp=1``, ``tf32`` with bf16): its names go to
    user attr ``autoscout:pins_unused``, so the config to ship leaves the pin out rather than
    claim a value that did not run.
    """
    config = call_recording_failure(trial, lambda: definition.suggest(trial))
    pins = definition.options.get("fixed") or {}
    if isinstance(config, Mapping) and isinstance(pins, Mapping):
        unused = sorted(k for k, v in pins.items() if k in config and config[k] != v)
        if unused:
            trial.set_user_attr(PINS_UNUSED, unused)
    return config


def reference_objective(
    definition: StudyDefinition, *, noise_seed: int | None = 0
) -> Callable[[optuna.Trial], float]:
    """Objective that scores each config with the study's reference (or real) evaluator.

    With ``noise_seed`` set, each trial sees seeded measurement noise derived from
    (noise_seed, trial number); the noiseless value is stored as user attr ``true_value`` so
    benchmarks score what was found, not how lucky its measurement was.
    """

    def objective(trial: optuna.Trial) -> float:
        config = suggest_recording(definition, trial)
        return call_recording_failure(
            trial, lambda: measure_definition(definition, trial, config, noise_seed)
        )

    return objective


def measure_definition(
    definition: StudyDefinition, trial: optuna.Trial, config: Any, noise_seed: int | None
) -> float:
    """A study's real run; for reference studies also records the noiseless ``true_value`` and,
    where the study models memory, the peak memory over capacity (``memory_use``, as a real
    runner reports it: see :mod:`autoscout_optuna._memory`)."""
    if definition.is_real and definition.measure_trial is not None:
        return measured_number(definition.measure_trial(trial, config))
    if definition.is_real:
        return measured_number(definition.measure(config, None))
    true_value = measured_number(definition.measure(config, None))
    trial.set_user_attr(TRUE_VALUE_KEY, true_value)
    if definition.memory_use is not None:
        trial.set_user_attr(MEMORY_USE_KEY, float(definition.memory_use(config)))
    if noise_seed is None:
        return true_value
    rng = trial_rng(noise_seed, trial.number, "measurement-noise")
    return measured_number(definition.measure(config, rng))


def measured_number(value: Any) -> float:
    """A real measurement as a float, or the :class:`Infeasible` that says why it is none.

    Something that is not a number (None, a dict) fails as ``no_metric`` rather than a
    ``TypeError`` that stops ``study.optimize``; NaN and infinities fail as ``nan``: Optuna
    fails a NaN without a reason (shown as ``error``) and keeps an infinity as a COMPLETE
    value, which the progress line then counted a real run with best "inf" while the summary,
    which ranks finite values only, counted it failed with no reason to read. Like Optuna, a
    value ``float()`` accepts (a numpy scalar, the string ``"1.5"``) counts as its number.
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Infeasible("no_metric", f"the run returned {value!r}, not a number"[:500]) from None
    if not math.isfinite(number):
        raise Infeasible("nan", f"the run measured {number}")
    return number


def simulator_objective(definition: StudyDefinition) -> Callable[[optuna.Trial], float]:
    """Objective that scores each config with the study's cheap simulator only."""
    if definition.simulate is None:
        raise ValueError(f"study {definition.name!r} has no simulator")

    def objective(trial: optuna.Trial) -> float:
        config = suggest_recording(definition, trial)
        return float(call_recording_failure(trial, lambda: definition.simulate(config)))

    return objective
