"""Read a study's trials into observations every algorithm can use without special cases.

Pruned trials have ``value is None``; conditional params are missing from some trials; failed
trials have no value; RUNNING trials are pending. All four are handled here once, so no sampler
indexes ``t.params[name]`` or ``t.value`` on its own (a known crash class in community samplers).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna._keys import ORPHANED, SIM_ERROR_DETAIL
from autoscout_optuna._storage import get_trials, storage_key

Kind = Literal["real", "estimate", "failed", "pending"]

#: Smallest share of its configured weight a PRUNED estimate keeps, however badly the
#: simulator ranks: a zero weight would leave nodes seen only through estimates weightless.
MIN_RELIABILITY = 0.1
#: Rank discordance up to which estimates keep their full weight (20 % simulator noise on the
#: LLM studies measures ~0.2, 80 % ~0.4).
TRUSTED_DISCORDANCE = 0.25
#: Calibrated median relative error up to which an estimate is as good as a measurement for
#: coordinate descent (:func:`simulator_trusted`): its line searches weigh differences of a few
#: percent. Seeds 0-15 at 20 % simulator noise (the ensemble measures ~0.1-0.15), 99 % reached
#: by llm_serving / llm_training: estimates never measurements 4 / 7 seeds, up to 0.05 5 / 7,
#: up to 0.1 2 / 6, rank check alone 1 / 6; noiseless (~0.02), seeds 0-7: 6 / 7 with any
#: threshold, 2 / 3 never (see ``CoordinateDescentSampler(use_estimates=...)``).
MEASUREMENT_GRADE_ERROR = 0.05
_RELIABILITY_SCAN = 50


@dataclass(frozen=True)
class Observation:
    """One trial as evidence.

    Attributes:
        number: Trial number.
        params: Parameters the trial took (conditional ones may be missing).
        distributions: Their distributions.
        kind: ``"real"`` (COMPLETE), ``"estimate"`` (PRUNED with an intermediate value: a
            low-fidelity observation), ``"failed"`` (FAIL, a NaN/inf result, or a constraint
            above 0 set with ``Trial.set_constraint``) or ``"pending"``
            (RUNNING/WAITING).
        score: The value oriented so that larger is better (negated for minimize); None unless
            ``kind`` is real or estimate.
        user_attrs: The trial's user attrs (decisions recorded by samplers).
    """

    number: int
    params: Mapping[str, Any]
    distributions: Mapping[str, BaseDistribution]
    kind: Kind
    score: float | None
    user_attrs: Mapping[str, Any]
    system_attrs: Mapping[str, Any]


def orient(value: float, direction: StudyDirection) -> float:
    """Make larger better: the identity for maximize, negation for minimize."""
    return value if direction == StudyDirection.MAXIMIZE else -value


def observation_of(trial: FrozenTrial, direction: StudyDirection) -> Observation:
    kind: Kind
    score: float | None = None
    if trial.state == TrialState.COMPLETE:
        value = trial.value
        if value is None or not math.isfinite(value) or _violates_a_constraint(trial):
            kind = "failed"
        else:
            kind, score = "real", orient(float(value), direction)
    elif trial.state == TrialState.PRUNED:
        # A pruned trial's last intermediate value is a low-fidelity estimate. With none (or a
        # NaN one) it taught us nothing we can rank by: count it as failed, never crash.
        last = _last_intermediate(trial)
        if last is None:
            kind = "failed"
        else:
            kind, score = "estimate", orient(last, direction)
    elif trial.state == TrialState.FAIL:
        kind = "failed"
    else:
        kind = "pending"
    return Observation(
        number=trial.number,
        params=trial.params,
        distributions=trial.distributions,
        kind=kind,
        score=score,
        user_attrs=trial.user_attrs,
        system_attrs=trial.system_attrs,
    )


def _violates_a_constraint(trial: FrozenTrial) -> bool:
    """Whether ``trial`` set a constraint (``Trial.set_constraint``) above 0: Optuna's mark of an
    infeasible config, which ``Study.best_trial`` passes over. Like a FAIL, it is no incumbent,
    and its structure is one to learn to avoid (DESIGN section 1)."""
    return any(value > 0.0 for value in trial.constraints.values())


def read_history(
    study: optuna.Study,
    exclude: FrozenTrial | None = None,
    states: Container[TrialState] | None = None,
) -> list[Observation]:
    """Every trial of a single-objective study as an :class:`Observation`, oldest first.

    Args:
        study: The study.
        exclude: The trial being sampled right now (it is RUNNING but is not "another worker").
        states: Only the trials in these states (None: all). A reader that wants the real runs
            alone asks for COMPLETE ones: building an observation of every trial, for each
            estimate, cost the simulator ensemble ~4 ms per estimate at 1,000 trials.
    """
    direction = study.direction
    skip = None if exclude is None else exclude.number
    return [
        observation_of(t, direction)
        for t in get_trials(study, states)
        if t.number != skip and not t.system_attrs.get(ORPHANED)
    ]


def decision_number(study: optuna.Study, trial: FrozenTrial) -> int:
    """The trial's index among non-orphaned trials: what seeds its random choices.

    A trial whose worker died is failed and re-run as a new trial (``_recovery``). Counting it
    would shift every later decision; skipping it makes the resumed study propose exactly what
    the uninterrupted one would have.
    """
    return trial.number - _ORPHANS.before(study, trial.number)


def _is_orphan(trial: FrozenTrial) -> bool:
    # an orphan is marked while RUNNING and failed next: no other state can hold one
    return trial.state in (TrialState.FAIL, TrialState.RUNNING) and bool(
        trial.system_attrs.get(ORPHANED)
    )


class _OrphanCount:
    """Orphans among a study's trials numbered below some trial, counted once per trial.

    Samplers ask this several times per trial, and a scan of every trial costs ~0.6 ms per call
    at 1,000 trials. Trials ``0 .. k - 1``, once all finished, are a settled prefix whose orphan
    count never changes (a finished trial is never marked an orphan), so a call scans only the
    trials after it. A cache, not state: checked against the start time of trial ``k - 1`` (a
    study recreated under the same storage and id starts over) and rebuilt from storage.
    """

    def __init__(self) -> None:
        # (storage, study id) -> (k, start time of trial k - 1, orphans among trials 0 .. k - 1)
        self._prefixes: dict[tuple[int, int], tuple[int, Any, int]] = {}
        self._lock = threading.Lock()

    def before(self, study: optuna.Study, number: int) -> int:
        trials = get_trials(study)
        key = storage_key(study)
        with self._lock:
            known = self._prefixes.get(key, (0, None, 0))
        valid = known[0] == 0 or settled_prefix_holds(trials, known[0], known[1])
        # a prefix past ``number`` counts too much: scan from the start (and keep that prefix)
        k, _, orphans = known if valid and known[0] <= number else (0, None, 0)
        if any(t.number != i for i, t in enumerate(trials[k: number], start=k)):
            # trials not listed in number order: count them all, the plain way
            return sum(1 for t in trials if t.number < number and _is_orphan(t))
        settled, settled_orphans = k, orphans
        for trial in trials[k: number]:
            orphans += _is_orphan(trial)
            if trial.number == settled and trial.state.is_finished():
                settled, settled_orphans = settled + 1, orphans
        if settled > k and (settled > known[0] or not valid):
            with self._lock:
                self._prefixes.pop(key, None)  # re-inserted last: the newest entry
                self._prefixes[key] = (
                    settled, trials[settled - 1].datetime_start, settled_orphans
                )
                if len(self._prefixes) > _MAX_STUDIES:  # a storage object per load_study
                    del self._prefixes[next(iter(self._prefixes))]
        return orphans


def settled_prefix_holds(trials: list[FrozenTrial], k: int, start: Any) -> bool:
    """Whether ``trials`` still begin with the settled prefix ``0 .. k - 1`` read before, whose
    last trial started at ``start`` (a recreated study, or another list, fails this)."""
    return 0 < k <= len(trials) and trials[k - 1].number == k - 1 and (
        trials[k - 1].datetime_start == start
    )


def first_start(trials: list[FrozenTrial]) -> Any:
    """The start time of trial 0 (None before it starts). A cache keyed by a study's name (and
    id) checks it: a study recreated under them, e.g. by a notebook cell that calls
    ``create_study(study_name=...)`` again on a new in-memory storage, has other start times,
    even while its only trial is the one being sampled (which the caches' other checks skip)."""
    return trials[0].datetime_start if trials else None


_MAX_STUDIES = 64
_ORPHANS = _OrphanCount()


def _last_intermediate(trial: FrozenTrial) -> float | None:
    if not trial.intermediate_values:
        return None
    step = max(trial.intermediate_values)
    value = trial.intermediate_values[step]
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def estimate_reliability(study: optuna.Study) -> float:
    """How much PRUNED estimates deserve to steer the search, in [MIN_RELIABILITY, 1].

    From the rank discordance ``d`` the pruner recorded (``autoscout:sim_error_detail``) on the
    newest trial that has one: 1 up to ``TRUSTED_DISCORDANCE``, falling linearly to 0 at a coin
    flip (``d = 0.5``), floored at ``MIN_RELIABILITY``. Samplers scale the weight of PRUNED
    estimates by it, so a simulator the pruner has found useless stops steering the search
    while a usable one keeps its full weight. Fidelity suite, 8 seeds, against a fixed weight:
    at 80 % simulator noise serving's final best 0.977 -> 0.996 (sampler alone 0.995); at 20 %
    training reaches 99 % in 6/8 seeds instead of 3/8. Scaling by ``1 - 2 d`` instead (full
    weight only for a perfect ranking) also fixed 80 % but cost at 20 % (training 95 % in 6/8
    seeds instead of 8/8). 1 while nothing has been measured (no pruner, or too few real
    runs; see :func:`latest_rank_check`).
    """
    check = latest_rank_check(study)
    if check is None:
        return 1.0
    share = (0.5 - check["discordance"]) / (0.5 - TRUSTED_DISCORDANCE)
    return float(min(1.0, max(MIN_RELIABILITY, share)))


def simulator_trusted(study: optuna.Study) -> bool:
    """Whether the pruner's newest check found the simulator as good as a measurement: rank
    discordance at most ``TRUSTED_DISCORDANCE`` and calibrated relative error at most
    ``MEASUREMENT_GRADE_ERROR``. False while nothing has been checked.

    Stricter than :func:`estimate_reliability`, which gives estimates full weight when nothing
    was measured: what uses this treats an estimate as a measurement, which only a simulator
    checked against real runs, and found close to them, has earned.
    """
    return measurement_grade(latest_rank_check(study))


def measurement_grade(detail: Any) -> bool:
    """Whether one error check (an ``autoscout:sim_error_detail``) found the simulator as good
    as a measurement: rank discordance at most ``TRUSTED_DISCORDANCE`` and calibrated relative
    error at most ``MEASUREMENT_GRADE_ERROR``. False for anything else (None, no check)."""
    if not isinstance(detail, Mapping):
        return False
    discordance, error = detail.get("discordance"), detail.get("relative_error")
    return (
        isinstance(discordance, (int, float)) and math.isfinite(discordance)
        and discordance <= TRUSTED_DISCORDANCE
        and isinstance(error, (int, float)) and math.isfinite(error)
        and error <= MEASUREMENT_GRADE_ERROR
    )


def latest_rank_check(study: optuna.Study) -> Mapping[str, Any] | None:
    """The error detail the pruner recorded (``autoscout:sim_error_detail``) on the newest trial
    that has a finite rank discordance; None when none of the newest ``_RELIABILITY_SCAN``
    trials has.

    Only the newest trials are read: the pruner records the detail on every trial it judges, so
    a study with a pruner has one there, and one without costs no full scan.
    """
    for trial in reversed(get_trials(study)[-_RELIABILITY_SCAN:]):
        detail = trial.user_attrs.get(SIM_ERROR_DETAIL)
        discordance = detail.get("discordance") if isinstance(detail, Mapping) else None
        if isinstance(discordance, (int, float)) and math.isfinite(discordance):
            return detail
    return None
