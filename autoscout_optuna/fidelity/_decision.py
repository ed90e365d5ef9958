"""Which fidelity a trial gets: a pure function of the history, no ``optuna.Study``.

Kept apart from the pruner adapter so it is tested with plain numbers, and so that the same
history always gives the same decision (a resumed study, or a second worker, decides alike).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscout_optuna._history import MEASUREMENT_GRADE_ERROR, measurement_grade
from autoscout_optuna.fidelity._error import SimulatorError, _median_ratio, measure_error

SIMULATOR = "simulator"
REAL = "real"
# Reasons for a real run that the trial's own estimate decided: such pairs carry the winner's
# curse and are left out of calibration where it is selection-aware.
COULD_BEAT_BEST = "could_beat_best"
TOP_FRACTION = "top_fraction"
SELECTED_REASONS = frozenset({COULD_BEAT_BEST, TOP_FRACTION})
# A structure already run for real, while the simulator is short of measurement grade: its
# estimate could only mark a dense point as judged (see ``FidelityPruner``)
MEASURED_STRUCTURE = "measured_structure"


@dataclass(frozen=True)
class FidelitySettings:
    """The pruner's knobs (validated by ``FidelityPruner``)."""

    error_threshold: float
    rank_error_threshold: float | None
    rank_tolerance: float
    top_fraction: float | None
    optimism: float
    validation_period: int | None
    n_warmup_real: int
    window: int
    min_pairs: int
    validation_top: float | None = None  # None: validate whatever trial opens a slot
    trust_window: int | None = None  # None: ``window`` alone decides trust
    trust_confidence: float | None = None  # None: the trust window's median error, no bound
    selection_aware: bool = False  # calibrate on pairs whose real run the estimate did not pick
    real_for_measured_structures: bool = False  # see ``MEASURED_STRUCTURE``


@dataclass(frozen=True)
class FidelityDecision:
    """What to do with one trial, and why.

    Attributes:
        fidelity: ``"simulator"`` (trust the estimate, prune) or ``"real"`` (run it).
        reason: ``"no_estimate"``, ``"default_config"``, ``"confirmation"``,
            ``"warm_up"``, ``"simulator_error_high"``,
            ``"periodic_validation"``, ``"could_beat_best"``, ``"top_fraction"``,
            ``"measured_structure"`` or ``"not_promising"``.
        error: The simulator's recent error when the decision was taken.
        estimate_rank: Fraction of earlier estimates better than this one (0 = best so far).
        trust_error: The error over the longer ``trust_window``; None when that window is off
            (or no longer than ``window``).
    """

    fidelity: str
    reason: str
    error: SimulatorError
    estimate_rank: float | None
    trust_error: SimulatorError | None = None


def decide(
    *,
    trial_number: int,
    estimate: float | None,
    maximize: bool,
    pool_estimates: Sequence[float],
    pair_estimates: Sequence[float],
    pair_reals: Sequence[float],
    best_real: float | None,
    settings: FidelitySettings,
    last_real_number: int | None = None,
    pair_selected: Sequence[bool] | None = None,
    measured_structure: bool = False,
    structure_pairs: tuple[Sequence[float], Sequence[float]] = ((), ()),
    baseline: bool = False,
    confirmation: bool = False,
) -> FidelityDecision:
    """Decide the fidelity of one trial (all values raw, as the objective reported them).

    Args:
        trial_number: The trial's number (validation slots are by number, so they survive a
            restart).
        estimate: This trial's estimate; None or non-finite when the simulator gave none.
        maximize: The study's direction.
        pool_estimates: Earlier trials' estimates.
        pair_estimates: Estimates of trials that also have a real value, oldest first.
        pair_reals: Their real values.
        best_real: The best real value so far (None before any).
        settings: The pruner's knobs.
        last_real_number: Number of the latest earlier trial that ran (or runs) for real; None
            before any. A real run since the current validation slot opened fills it.
        pair_selected: Per pair, whether its real run was chosen *because of* its estimate
            (``could_beat_best``, ``top_fraction``); with ``selection_aware`` the calibration
            factor comes from the other pairs (see :func:`selection_free_scale`).
        measured_structure: Whether the trial's structure (its structural params) already has
            a real run; with ``real_for_measured_structures`` such a trial runs for real while
            the simulator is short of measurement grade
            (:func:`autoscout_optuna._history.measurement_grade`) and short of it on the
            structure's own pairs too (see :func:`_grade_within`).
        structure_pairs: ``(estimates, reals)`` of the real runs of the trial's structure
            that have an estimate, oldest first.
        baseline: The trial runs the study's default config, the baseline every gain is
            measured against (``autoscout run`` queues it as trial 0): always real, whatever
            the estimate says.
        confirmation: The trial re-runs a config to confirm it (``autoscout:confirms``):
            always real, its point is the measurement.
    """
    error = measure_error(
        pair_estimates, pair_reals, window=settings.window, rank_tolerance=settings.rank_tolerance
    )
    trust_error = None
    if settings.trust_window is not None and settings.trust_window > settings.window:
        trust_error = measure_error(
            pair_estimates, pair_reals, window=settings.trust_window,
            rank_tolerance=settings.rank_tolerance, confidence=settings.trust_confidence,
        )
    if estimate is None or not math.isfinite(estimate):
        return FidelityDecision(REAL, "no_estimate", error, None, trust_error)
    sign = 1.0 if maximize else -1.0
    pool = sign * np.asarray(pool_estimates, dtype=float)
    pool = pool[np.isfinite(pool)]
    rank = _rank(pool, sign * estimate)
    if baseline:
        return FidelityDecision(REAL, "default_config", error, rank, trust_error)
    if confirmation:
        return FidelityDecision(REAL, "confirmation", error, rank, trust_error)
    n_real = len(pair_reals)
    if n_real < settings.n_warmup_real or error.n_pairs < settings.min_pairs:
        # Until the simulator has been checked against enough real runs, nothing says it can
        # be trusted.
        return FidelityDecision(REAL, "warm_up", error, rank, trust_error)
    # Quick to distrust, slow to trust: the recent window's error above threshold means real
    # runs (the search may have moved where the simulator is wrong), but trust needs the longer
    # window below threshold too, its relative error bounded from above when a confidence is
    # set. A noisy simulator's recent error dips under the threshold now and then by the luck
    # of a few pairs (most easily early on, when there are only a few); a bound over the
    # longer sample rarely does, so that luck does not buy pruned trials. Both are read from
    # the pairs alone: no mode to remember or rebuild.
    if _error_too_high(error, settings) or (
        trust_error is not None and _error_too_high(trust_error, settings, bounded=True)
    ):
        return FidelityDecision(REAL, "simulator_error_high", error, rank, trust_error)
    if _validation_due(trial_number, last_real_number, settings) and (
        not _targeted_slot(trial_number, settings)
        or _rank(pool[-settings.window :], sign * estimate) < settings.validation_top
    ):
        return FidelityDecision(REAL, "periodic_validation", error, rank, trust_error)
    scale = error.scale
    if settings.selection_aware and pair_selected is not None:
        scale = selection_free_scale(
            pair_estimates, pair_reals, pair_selected, window=settings.window,
            min_pairs=settings.min_pairs, fallback=error.scale,
        )
    if best_real is None or _could_beat(
        estimate, best_real, sign, error, settings.optimism, scale
    ):
        return FidelityDecision(REAL, COULD_BEAT_BEST, error, rank, trust_error)
    if settings.top_fraction is not None and rank < settings.top_fraction:
        return FidelityDecision(REAL, TOP_FRACTION, error, rank, trust_error)
    # the same limits, on the same numbers, as the samplers apply to the recorded error detail
    if settings.real_for_measured_structures and measured_structure \
            and not measurement_grade(error.as_dict()) \
            and not _grade_within(*structure_pairs, settings):
        return FidelityDecision(REAL, MEASURED_STRUCTURE, error, rank, trust_error)
    return FidelityDecision(SIMULATOR, "not_promising", error, rank, trust_error)


def _grade_within(
    estimates: Sequence[float], reals: Sequence[float], settings: FidelitySettings
) -> bool:
    """Whether one structure's own pairs, calibrated with a factor of their own, are within
    measurement grade: a simulator biased per structure (wrong between structures) can still
    order one structure's dense points as well as a measurement, and then its estimates
    judge them as a real run would (fidelity suite, biased simulator: without this test the
    rule cost llm_serving 99 % in 3 of 16 seeds)."""
    if len(estimates) < settings.min_pairs:
        return False
    error = measure_error(estimates, reals, window=settings.window,
                          rank_tolerance=settings.rank_tolerance)
    return error.relative_error is not None and error.relative_error <= MEASUREMENT_GRADE_ERROR


def _rank(oriented_pool: np.ndarray, oriented_estimate: float) -> float:
    """Fraction of the pool better than the estimate (0 = best); both oriented larger-better."""
    return float(np.mean(oriented_pool > oriented_estimate)) if oriented_pool.size else 0.0


def _validation_due(
    trial_number: int, last_real_number: int | None, settings: FidelitySettings
) -> bool:
    """Whether the current validation slot (one per ``validation_period`` trial numbers) has
    seen no real run yet."""
    if settings.validation_period is None:
        return False
    slot_start = trial_number - trial_number % settings.validation_period
    return last_real_number is None or last_real_number < slot_start


def _targeted_slot(trial_number: int, settings: FidelitySettings) -> bool:
    """Whether this validation slot goes only to a well-ranked estimate.

    Every second slot: a validation on a config the simulator rightly calls poor costs a real
    run and teaches the search nothing, while the upper ranks (of the *recent* estimates, what
    the search proposes now; not the winners alone, the luckiest draws of the noise) are where
    a wrongly trusted estimate would hide the optimum. The other slots stay blind, taking
    whatever trial opens them: a simulator that turns bad may rate exactly the good configs
    poorly, and only blind validations catch that quickly.
    """
    assert settings.validation_period is not None
    slot = trial_number // settings.validation_period
    return settings.validation_top is not None and slot % 2 == 1


def selection_free_scale(
    pair_estimates: Sequence[float],
    pair_reals: Sequence[float],
    pair_selected: Sequence[bool],
    *,
    window: int,
    min_pairs: int,
    fallback: float | None,
) -> float | None:
    """Median ``real / estimate`` over the last ``window`` pairs the estimate did not select.

    A pair whose real run was chosen because its estimate looked good is a draw from the upper
    tail of the simulator's noise: among such pairs the real value falls short of the estimate
    by the winner's curse (on llm_serving at 20 % noise, by a median 13 % against +7 % on
    blind validations), and a factor calibrated on them scales every later estimate down,
    so a good new structure would look worse than it is exactly when it is judged. The pairs
    run for other reasons (warm-up, a distrusted simulator, blind validation) are a fair
    sample. Fewer than ``min_pairs`` of them: ``fallback``.
    """
    est = np.asarray(pair_estimates, dtype=float)
    real = np.asarray(pair_reals, dtype=float)
    free = ~np.asarray(pair_selected, dtype=bool)
    est, real = est[free][-window:], real[free][-window:]
    finite = np.isfinite(est) & np.isfinite(real)
    est, real = est[finite], real[finite]
    if np.count_nonzero(est != 0) < min_pairs:
        return fallback
    ratio = _median_ratio(est, real)  # the scale ``measure_error`` reports, on these pairs
    return fallback if ratio is None else ratio


def _could_beat(
    estimate: float, best_real: float, sign: float, error: SimulatorError, optimism: float,
    scale: float | None = None,
) -> bool:
    """Whether the calibrated estimate, given the benefit of the doubt, beats the best real.

    Comparing an estimate with the best *real* value (rather than with other estimates) avoids
    the winner's curse: the best estimates so far are the luckiest draws of the simulator's
    noise, so a good config with average noise would rarely rank among them.
    """
    calibrated = estimate * (scale if scale is not None else 1.0)
    doubt = abs(calibrated) * optimism * (error.relative_error or 0.0)
    return sign * calibrated + doubt >= sign * best_real


def _error_too_high(
    error: SimulatorError, settings: FidelitySettings, *, bounded: bool = False
) -> bool:
    relative = error.relative_error_bound if bounded else None
    relative = error.relative_error if relative is None else relative
    if relative is not None and relative > settings.error_threshold:
        return True
    return (
        settings.rank_error_threshold is not None
        and error.discordance is not None
        and error.discordance > settings.rank_error_threshold
    )
