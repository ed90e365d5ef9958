"""Adapter: a SimulatorEnsemble refitted from a study's real results at every estimate."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autoscout_optuna import _validate
from autoscout_optuna._storage import get_trials
from autoscout_optuna.fidelity._ensemble import SimulatorEnsemble
from autoscout_optuna.fidelity._trial_facts import TrialFactsReader

# configs, raw simulator values, real values, chosen for their estimate: oldest first
_TrainingData = tuple[list[dict[str, Any]], list[float], list[float], list[bool]]


class StudyEnsembleEstimator:
    """Corrects a raw simulator value with an ensemble trained on the study's real runs.

    Training data is every COMPLETE trial that recorded its raw simulator output (user attr
    ``autoscout:simulated``) and its params: nothing lives outside storage, so every worker and
    a resumed study fit the same ensemble.

    Args:
        selection_aware: Tell the ensemble which real runs the pruner chose because of their
            estimate (``autoscout:fidelity_reason`` ``could_beat_best`` or ``top_fraction``),
            so their winner's curse does not pull every estimate down (see
            :meth:`SimulatorEnsemble.fit`).
        ensemble_options: Keyword arguments of :class:`SimulatorEnsemble` (``simulate`` aside).
    """

    def __init__(self, *, selection_aware: bool = False, **ensemble_options: Any) -> None:
        _validate.booleans(selection_aware=selection_aware)
        self._selection_aware = bool(selection_aware)
        if "simulate" in ensemble_options:
            raise ValueError("ensemble_options must not contain simulate: values are recorded")
        SimulatorEnsemble(**ensemble_options)  # validate now, not at the first trial
        self._options = ensemble_options
        self._last: tuple[_TrainingData, SimulatorEnsemble] | None = None
        self._facts = TrialFactsReader(track_structures=False)

    def fit(self, study: optuna.Study, exclude: int | None = None) -> SimulatorEnsemble:
        """The ensemble fitted on ``study``'s real runs (trial ``exclude`` left out)."""
        return self._fit(self._training_data(study, exclude))

    def _training_data(self, study: optuna.Study, exclude: int | None) -> _TrainingData:
        configs, simulated, real, selected = [], [], [], []
        for facts in self._facts.read(get_trials(study, states=(TrialState.COMPLETE,))):
            if facts.real is None or facts.simulated is None or facts.number == exclude:
                continue
            configs.append(dict(facts.params))
            simulated.append(facts.simulated)
            real.append(facts.real)
            selected.append(facts.selected)
        return configs, simulated, real, selected

    def _fit(self, data: _TrainingData) -> SimulatorEnsemble:
        configs, simulated, real, selected = data
        ensemble = SimulatorEnsemble(simulate=_recorded_only, **self._options)
        return ensemble.fit(
            configs, real, simulated, selected if self._selection_aware else None
        )

    def _fitted(self, study: optuna.Study, exclude: int | None) -> SimulatorEnsemble:
        """:meth:`fit`, reusing the last fit while its training data is unchanged.

        Only a finished real run changes the data, and most trials are not one (at 20 %
        noise about three trials in four end on the estimate), so refitting at every estimate
        was a fifth of a long study's time. The reuse is a pure memo: the fit is a function of
        the data, compared whole, so workers and a resumed study still fit what storage holds.
        """
        data = self._training_data(study, exclude)
        last = self._last  # one read: another thread may replace it meanwhile
        if last is not None and last[0] == data:
            return last[1]
        ensemble = self._fit(data)
        self._last = (data, ensemble)
        return ensemble

    def estimate(self, trial: optuna.Trial, params: Mapping[str, Any], simulated: float) -> float:
        """The ensemble's estimate for a trial's params, given its raw simulator value.

        Falls back to the raw value if the fit fails numerically, or the fitted features
        cannot read the params (a categorical ``None`` where the real runs so far had only
        numbers): a bad correction must never cost the trial its estimate.
        """
        try:
            ensemble = self._fitted(trial.study, exclude=trial.number)
            value = ensemble.predict_one(params, simulated)
        except (ValueError, TypeError, ArithmeticError, np.linalg.LinAlgError):
            return simulated
        return value if math.isfinite(value) else simulated


def _recorded_only(config: Mapping[str, Any]) -> float:
    raise RuntimeError("the study ensemble is always given recorded simulator values")
