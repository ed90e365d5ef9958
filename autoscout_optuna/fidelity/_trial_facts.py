"""What the fidelity layer reads of each trial, kept for finished trials (a cache, not state).

A pruner decision reads every trial of the study: its estimate, its real value, whether it ran
for real, its structure; the simulator ensemble reads the real runs' params and raw simulator
values at every estimate. At 1,200 trials those walks, with a structure key built per real run,
were about a fifth of a long simulated study's time. Finished trials never change, and the
storage hands back the very same trial objects for them, so their facts are kept, keyed by the
object itself (held, so its id cannot be reused); a trial object not seen before, or a running
trial, is read afresh. Each read keeps only the trials it was given: a reader moved to another
study starts over, and what it answers is always what reading every trial would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _keys
from autoscout_optuna._space import structure_key
from autoscout_optuna.fidelity._decision import REAL, SELECTED_REASONS

ESTIMATE_STEP = 0


class TrialFacts(NamedTuple):
    """One trial as the fidelity layer reads it.

    Attributes:
        number: The trial's number.
        ran_for_real: A real run, finished or still running.
        estimate: Its step-0 estimate (None: none, or not finite).
        real: Its real value (None: not COMPLETE, or not finite).
        structure: Its structural params' key, for a real run when structures are tracked.
        selected: It ran for real because its estimate looked good.
        simulated: The raw simulator value it recorded (user attr ``autoscout:simulated``;
            None: none, or not a finite number).
        params: Its params (the trial's own mapping: read, never change).
    """

    number: int
    ran_for_real: bool
    estimate: float | None
    real: float | None
    structure: tuple | None
    selected: bool
    simulated: float | None
    params: Mapping[str, Any]


class TrialFactsReader:
    """Reads :class:`TrialFacts` of a study's trials, reusing those of finished trials."""

    def __init__(self, *, track_structures: bool) -> None:
        self._track_structures = track_structures
        self._kept: dict[int, tuple[FrozenTrial, TrialFacts]] = {}

    def __getstate__(self) -> dict[str, bool]:
        # a cache: the kept facts are not pickled, a copy reads its trials afresh
        return {"track_structures": self._track_structures}

    def __setstate__(self, state: dict[str, bool]) -> None:
        self.__init__(track_structures=state["track_structures"])

    @property
    def tracks_structures(self) -> bool:
        return self._track_structures

    def read(self, trials: Sequence[FrozenTrial]) -> list[TrialFacts]:
        """The facts of ``trials``, in their order."""
        kept = self._kept  # one read: another thread may replace it meanwhile
        still: dict[int, tuple[FrozenTrial, TrialFacts]] = {}
        facts = []
        for trial in trials:
            entry = kept.get(id(trial))
            fact = entry[1] if entry is not None and entry[0] is trial else self._of(trial)
            if trial.state.is_finished():
                still[id(trial)] = (trial, fact)
            facts.append(fact)
        self._kept = still
        return facts

    def _of(self, trial: FrozenTrial) -> TrialFacts:
        real = real_of(trial)
        return TrialFacts(
            number=trial.number,
            ran_for_real=ran_for_real(trial),
            estimate=estimate_of(trial),
            real=real,
            structure=(structure_key(trial.params, trial.distributions)
                       if self._track_structures and real is not None else None),
            selected=selected_by_estimate(trial.user_attrs),
            simulated=_finite_number(trial.user_attrs.get(_keys.SIMULATED)),
            params=trial.params,
        )


def _finite_number(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def selected_by_estimate(user_attrs: Mapping[str, Any]) -> bool:
    """Whether a trial (its user attrs) ran for real because its estimate looked good."""
    return user_attrs.get(_keys.FIDELITY_REASON) in SELECTED_REASONS


def estimate_of(trial: FrozenTrial) -> float | None:
    """A trial's step-0 estimate (None: none reported, or not finite)."""
    value = trial.intermediate_values.get(ESTIMATE_STEP)
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def ran_for_real(trial: FrozenTrial) -> bool:
    """A real run, finished or still running (decided ``real`` by the pruner or for lack of
    an estimate)."""
    return trial.state == TrialState.COMPLETE or (
        trial.state == TrialState.RUNNING and trial.user_attrs.get(_keys.FIDELITY) == REAL
    )


def real_of(trial: FrozenTrial) -> float | None:
    """A COMPLETE trial's finite value (None otherwise)."""
    if trial.state != TrialState.COMPLETE or trial.value is None or not math.isfinite(trial.value):
        return None
    return float(trial.value)
