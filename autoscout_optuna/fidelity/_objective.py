"""Objectives that follow the multi-fidelity protocol, so nobody writes report/prune by hand.

Protocol (DESIGN section 1): report the estimate at step 0, ask ``trial.should_prune()``, raise
``optuna.TrialPruned`` when the estimate is trusted, else do the real run. Special cases:

* a simulator that raises (anything but :class:`Infeasible`) or returns NaN/inf gives *no
  estimate*: nothing is reported, the trial runs for real, and why is recorded;
* an estimate that raises :class:`Infeasible` (e.g. predicted out of memory) ends the trial FAIL
  with its reason, without a real run;
* a real measurement that is not a number fails the trial as ``no_metric``, a NaN or an
  infinity as ``nan`` (recorded, as for any :class:`Infeasible`);
* a trial that re-runs a config to confirm it (user attr ``autoscout:confirms``, see
  ``autoscout_optuna.confirm_best``) skips the estimate and runs for real.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from autoscout_optuna import _keys
from autoscout_optuna._failure import Infeasible
from autoscout_optuna._objective import (
    call_recording_failure,
    measure_definition,
    measured_number,
    record_failure,
    suggest_recording,
)
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.fidelity._study_ensemble import StudyEnsembleEstimator
from autoscout_optuna.fidelity._trial_facts import ESTIMATE_STEP

Config = Mapping[str, Any]


def run_protocol(
    trial: optuna.Trial,
    estimate: Callable[[], float],
    measure: Callable[[], float],
) -> float:
    """Run one trial of the protocol with already-bound estimate and measure calls.

    The building block of :func:`multi_fidelity_objective`, for callers whose estimate needs
    more than the config (e.g. the benchmark's per-trial simulator noise).
    """
    if trial.user_attrs.get(_keys.CONFIRMS) is not None:
        # a confirmation re-run is there for its measurement: an estimate could only be
        # ignored, or, where the simulator calls a config that ran fine infeasible, fail it
        trial.set_user_attr(_keys.FIDELITY, "real")
        trial.set_user_attr(_keys.FIDELITY_REASON, "confirmation")
        return _measured(trial, measure)
    value = _safe_estimate(trial, estimate)
    if value is not None:
        trial.report(value, step=ESTIMATE_STEP)
        if trial.should_prune():
            raise optuna.TrialPruned(f"simulator estimate {value:.6g} trusted")
    return _measured(trial, measure)


def multi_fidelity_objective(
    suggest: Callable[[optuna.Trial], Config],
    estimate: Callable[[Config], float],
    measure: Callable[[Config], float],
) -> Callable[[optuna.Trial], float]:
    """Wrap config -> estimate and config -> real measurement into a protocol objective.

    Use with ``FidelityPruner`` and ``study.optimize(..., catch=(Infeasible,))``.

    Example:

        .. testcode::

            import optuna
            from autoscout_optuna import FidelityPruner
            from autoscout_optuna.fidelity import multi_fidelity_objective

            objective = multi_fidelity_objective(
                suggest=lambda trial: {"x": trial.suggest_float("x", 0, 1)},
                estimate=lambda cfg: 1.2 * cfg["x"],  # cheap and biased, but ordered right
                measure=lambda cfg: cfg["x"],  # the expensive real run
            )
            study = optuna.create_study(direction="maximize", pruner=FidelityPruner())
            study.optimize(objective, n_trials=20)

    Args:
        suggest: Define-by-run space: trial -> config.
        estimate: Cheap estimate of a config; may raise ``Infeasible`` (the trial fails without
            a real run) or fail in any other way (the trial runs for real).
        measure: The real measurement of a config; may raise ``Infeasible``. A result that is
            not a number (None, say) ends the trial ``Infeasible("no_metric")``, a NaN or an
            infinity ``Infeasible("nan")``, each recorded as the trial's ``failure_reason``.
    """

    def objective(trial: optuna.Trial) -> float:
        config = call_recording_failure(trial, lambda: suggest(trial))
        return run_protocol(trial, lambda: estimate(config), lambda: measure(config))

    return objective


def from_definition(
    definition: StudyDefinition,
    *,
    use_ensemble: bool = True,
    noise_seed: int | None = None,
    simulate: Callable[[optuna.Trial, Config], float] | None = None,
    ensemble_options: Mapping[str, Any] | None = None,
) -> Callable[[optuna.Trial], float]:
    """The multi-fidelity objective of a ready-made study (what ``autoscout run`` uses).

    The estimate is the study's analytic simulator corrected by a :class:`SimulatorEnsemble`
    refitted, at every trial, on the real results the study has so far (read from storage, so
    several workers and a resumed study see the same evidence). The raw simulator value is
    recorded as user attr ``autoscout:simulated``. The real run is the study's ``measure``; for
    reference studies the noiseless value is also recorded as ``true_value``, on real runs only
    (a pruned trial never counts as found).

    Example:

        .. testcode::

            import optuna
            from autoscout_optuna import FidelityPruner, Infeasible, studies
            from autoscout_optuna.fidelity import from_definition

            definition = studies.load("llm_serving")
            study = optuna.create_study(direction=definition.direction, pruner=FidelityPruner())
            study.optimize(from_definition(definition), n_trials=10, catch=(Infeasible,))

    Args:
        definition: A study with a ``simulate`` function.
        use_ensemble: False reports the raw simulator instead of the ensemble.
        noise_seed: Seed of the per-trial measurement noise of reference studies; None
            measures noiselessly. Ignored for real studies.
        simulate: Replaces the study's simulator, ``(trial, config) -> estimate`` (the trial is
            passed so a benchmark can seed simulator noise per trial).
        ensemble_options: Keyword arguments of :class:`StudyEnsembleEstimator`:
            ``selection_aware`` and those of :class:`SimulatorEnsemble`.

    Raises:
        ValueError: the study has no simulator and none is given.
    """
    if simulate is None:
        if definition.simulate is None:
            raise ValueError(
                f"study {definition.name!r} has no simulator: use its reference objective instead"
            )
        study_simulate = definition.simulate

        def simulate(trial: optuna.Trial, config: Config) -> float:
            return study_simulate(config)

    estimator = StudyEnsembleEstimator(**dict(ensemble_options or {})) if use_ensemble else None

    def objective(trial: optuna.Trial) -> float:
        config = suggest_recording(definition, trial)

        def estimate() -> float:
            raw = float(simulate(trial, config))
            if estimator is None or not math.isfinite(raw):
                return raw
            trial.set_user_attr(_keys.SIMULATED, raw)
            return estimator.estimate(trial, trial.params, raw)

        return run_protocol(
            trial, estimate, lambda: measure_definition(definition, trial, config, noise_seed)
        )

    return objective


def _measured(trial: optuna.Trial, measure: Callable[[], Any]) -> float:
    """The real measurement as a float; one that is not a number or not finite fails the trial
    (``no_metric`` / ``nan``, recorded: see :func:`measured_number`)."""
    return call_recording_failure(trial, lambda: measured_number(measure()))


def _safe_estimate(trial: optuna.Trial, estimate: Callable[[], float]) -> float | None:
    """The estimate, or None (recorded) when the simulator has nothing usable to say."""
    try:
        value = float(estimate())
    except Infeasible as error:
        record_failure(trial, error)
        trial.set_user_attr(_keys.FIDELITY, "simulator")
        trial.set_user_attr(_keys.FIDELITY_REASON, f"predicted_infeasible: {error.reason}")
        raise
    except Exception as error:  # noqa: BLE001 - any simulator bug means "no estimate"
        _record_no_estimate(trial, f"simulator raised {type(error).__name__}: {error}")
        return None
    if not math.isfinite(value):
        _record_no_estimate(trial, f"simulator returned {value}")
        return None
    return value


def _record_no_estimate(trial: optuna.Trial, why: str) -> None:
    trial.set_user_attr(_keys.FIDELITY, "real")
    trial.set_user_attr(_keys.FIDELITY_REASON, f"no_estimate: {why}"[:500])
