"""The study's trials as the orchestrator reads them, with per-trial keys memoized.

Reading and classifying every trial on every ``before_trial`` is O(n) Python work per trial; at
thousands of trials that alone would blow the per-trial budget. Finished trials never change, so
their :class:`Seen` records are memoized (keyed by study name and trial number, checked against
the start time so a recreated study is not confused with an old one). The memo is a cache, not
state: it is dropped on pickling and rebuilt from storage on demand.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from autoscout_optuna import _keys
from autoscout_optuna._history import (
    Kind,
    Observation,
    first_start,
    measurement_grade,
    observation_of,
    settled_prefix_holds,
)
from autoscout_optuna._space import config_key, structure_key
from autoscout_optuna._storage import get_trials
from autoscout_optuna.samplers._autoscout.did import ArmOutcome, Ledger, pooled_noise, score_scale


@dataclass(frozen=True, eq=False)
class Seen:
    """A trial as evidence (see :class:`~autoscout_optuna._history.Observation` for the
    fields), plus the keys the orchestrator groups trials by: ``structure`` (its structural
    params), ``config`` (all its params) and ``arm``; ``gains`` is the raw difference to its
    control per estimator (:mod:`~autoscout_optuna.samplers._autoscout.did`), None for a failed
    trial, computed once when the trial is first read finished.
    """

    number: int
    params: Mapping[str, Any]
    distributions: Mapping[str, BaseDistribution]
    kind: Kind
    score: float | None
    user_attrs: Mapping[str, Any]
    structure: tuple[tuple[str, str], ...]
    config: tuple[tuple[str, str], ...]
    arm: str
    gains: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def graded(self) -> bool:
        """An estimate the pruner judged as good as a measurement when it was made
        (:func:`autoscout_optuna._history.measurement_grade` of its recorded error check)."""
        return self.kind == "estimate" and measurement_grade(
            self.user_attrs.get(_keys.SIM_ERROR_DETAIL))


def seen_of(obs: Observation, gains: Mapping[str, float | None] | None = None) -> Seen:
    arm = obs.user_attrs.get(_keys.ARM)
    return Seen(
        number=obs.number, params=obs.params, distributions=obs.distributions, kind=obs.kind,
        score=obs.score, user_attrs=obs.user_attrs,
        structure=structure_key(obs.params, obs.distributions),
        config=config_key(obs.params),
        arm=arm if isinstance(arm, str) else "startup",
        gains=dict(gains or {}),
    )


class StudyDigest:
    """What the finished trials add up to, updated one trial at a time.

    Attributes:
        ledger: First/best score per structure and the incumbent structure (DiD controls).
        examples: One trial per structure key (to recover its param values).
        scores: Every finished trial's score (real or estimate).
        repeats: Real scores grouped by config (measurement noise).
    """

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.examples: dict[Hashable, Seen] = {}
        self.scores: list[float] = []
        self.repeats: dict[tuple[tuple[str, str], ...], list[float]] = {}
        self.distributions: dict[str, BaseDistribution] = {}
        self.best: dict[str, Seen] = {}  # kind ("real"/"estimate") -> best trial of that kind
        self.best_with: dict[tuple[str, str], Seen] = {}  # (kind, param) -> best trial having it
        # structure -> (number, gains) of its finished refinements, oldest first
        self.refinements: dict[Hashable, list[tuple[int, dict[str, float | None]]]] = {}
        self._noise: float | None = None
        self._scale: tuple[int, float] | None = None  # (how many scores it saw, the scale)
        # The configs measured more than once, by their place in ``repeats`` (the noise sums
        # them in that order), so the noise need not look at the configs measured once.
        self._places: dict[tuple[tuple[str, str], ...], int] = {}
        self._repeated: list[tuple[int, tuple[tuple[str, str], ...]]] = []

    def add(self, seen: Seen) -> dict[str, float | None]:
        """Record a finished trial; returns its gains, computed before it joins the ledger."""
        # An estimate the pruner judged measurement-grade when it was made counts as a real
        # value (as coordinate descent takes it); any other stands in only for structures
        # never run for real (see ``Ledger``).
        estimate = seen.kind == "estimate" and not seen.graded
        outcome = ArmOutcome(seen.arm, seen.structure, seen.score, estimate)
        gains = {e: self.ledger.gain(outcome, e) for e in ("did", "naive")}
        self.ledger.add(outcome)
        if seen.arm == "refine":
            bisect.insort(self.refinements.setdefault(seen.structure, []), (seen.number, gains),
                          key=_number)
        if seen.score is not None:
            self.scores.append(seen.score)
            self.examples.setdefault(seen.structure, seen)
        if seen.kind == "real":
            group = self.repeats.setdefault(seen.config, [])
            if not group:
                self._places[seen.config] = len(self._places)
            group.append(seen.score)
            if len(group) == 2:
                bisect.insort(self._repeated, (self._places[seen.config], seen.config))
            if len(group) > 1:  # a config measured once says nothing about the noise
                self._noise = None
        self.distributions.update(seen.distributions)
        if seen.score is not None:
            if _beats(seen, self.best.get(seen.kind)):
                self.best[seen.kind] = seen
            for name in seen.params:
                if _beats(seen, self.best_with.get((seen.kind, name))):
                    self.best_with[(seen.kind, name)] = seen
        return gains

    def incumbent(self) -> Seen | None:
        """Best real trial; the best estimate while no real value exists."""
        return self.best.get("real") or self.best.get("estimate")

    def best_having(self, name: str) -> Seen | None:
        return self.best_with.get(("real", name)) or self.best_with.get(("estimate", name))

    def scale(self) -> float:
        """``score_scale`` of every finished score (recomputed when a score arrives: several
        rules read it per trial, and a quantile of thousands of scores is not free)."""
        if self._scale is None or self._scale[0] != len(self.scores):
            self._scale = (len(self.scores), score_scale(self.scores))
        return self._scale[1]

    def noise(self) -> float:
        """Pooled standard deviation of repeated real measurements (recomputed on change)."""
        if self._noise is None:
            self._noise = pooled_noise([self.repeats[c] for _, c in self._repeated])
        return self._noise


def _number(entry: tuple[int, Any]) -> int:
    return entry[0]


def _beats(seen: Seen, other: Seen | None) -> bool:
    return other is None or (seen.score, -seen.number) > (other.score, -other.number)


class HistoryReader:
    """Reads a study into :class:`Seen` records, oldest first, memoizing finished trials and
    keeping a :class:`StudyDigest` of them per study.

    The trials ``0 .. k - 1``, once all finished, are a settled prefix: their records are kept
    as a list too, so a read walks only the trials after it (the running and the newest ones)
    instead of looking every trial up in the memo.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple[str, int], tuple[Any, Seen]] = {}
        self._digests: dict[str, StudyDigest] = {}
        # study -> (k, start time of trial k - 1, records of trials 0 .. k - 1)
        self._prefixes: dict[str, tuple[int, Any, list[Seen]]] = {}
        # study -> start time of its trial 0 (``first_start``): tells a recreated study
        self._firsts: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (HistoryReader, ())

    def read(
        self, study: optuna.Study, exclude: FrozenTrial | None = None
    ) -> tuple[list[Seen], StudyDigest]:
        return self.read_with_pending(study, exclude)[:2]

    def read_with_pending(
        self, study: optuna.Study, exclude: FrozenTrial | None = None
    ) -> tuple[list[Seen], StudyDigest, list[Seen]]:
        """:meth:`read`, plus the running trials' records (found without a scan of the
        settled prefix, which holds none)."""
        with self._lock:
            return self._read(study, exclude)

    def _read(
        self, study: optuna.Study, exclude: FrozenTrial | None
    ) -> tuple[list[Seen], StudyDigest, list[Seen]]:
        direction = study.direction
        skip = None if exclude is None else exclude.number
        name = study.study_name
        trials = get_trials(study)
        if self._firsts.get(name, first_start(trials)) != first_start(trials):
            self._forget(name)  # a study recreated under the same name
        self._firsts[name] = first_start(trials)
        digest = self._digests.get(name)
        if digest is None:
            digest = self._digests[name] = StudyDigest()
        known, history = self._prefix(name, trials, skip)
        settled, start, n_records = known, None, len(history)
        pending = []
        for trial in trials[settled:]:
            if trial.number == skip:
                continue
            # an orphan (its worker died) was re-run as a new trial: not evidence
            if not trial.system_attrs.get(_keys.ORPHANED):
                key = (name, trial.number)
                hit = self._memo.get(key)
                if hit is not None and hit[0] != trial.datetime_start:
                    # A study recreated under the same name: forget everything about the old one.
                    self._forget(name)
                    return self._read(study, exclude)
                if hit is not None:
                    seen = hit[1]
                else:
                    seen = seen_of(observation_of(trial, direction))
                    if trial.state.is_finished():
                        seen = seen_of(observation_of(trial, direction), digest.add(seen))
                        self._memo[key] = (trial.datetime_start, seen)
                history.append(seen)
                if seen.kind == "pending":
                    pending.append(seen)
            if trial.number == settled and trial.state.is_finished():
                settled, start, n_records = settled + 1, trial.datetime_start, len(history)
        if settled > known:
            self._prefixes[name] = (settled, start, history[:n_records])
        return history, digest, pending

    def _forget(self, name: str) -> None:
        self._memo = {k: v for k, v in self._memo.items() if k[0] != name}
        self._prefixes.pop(name, None)
        self._digests.pop(name, None)

    def _prefix(
        self, name: str, trials: list[FrozenTrial], skip: int | None
    ) -> tuple[int, list[Seen]]:
        """The settled prefix of ``trials`` (k, a copy of its records), if still the same."""
        k, start, records = self._prefixes.get(name, (0, None, []))
        if (skip is not None and skip < k) or not settled_prefix_holds(trials, k, start):
            return 0, []  # not the list read before: walk it all (the memo still helps)
        return k, list(records)
