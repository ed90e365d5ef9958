"""Confirm the winner: run the best configs again and rank them by the mean of their runs.

A search keeps the best of many noisy measurements, and the best of many draws is a lucky one
(the winner's curse): on the reference training study, at 3 % measurement noise, the best
measured value sits 1-4 % above the optimum while its config's truth is up to 2 % below it
(``benchmarks/results/HISTORY.md``, session 42). Whoever ships the config wants to know that it
is as fast as it looked, that it runs every time, and by how much it beats the default over more
than one run of each. :func:`confirm_best` re-runs the top configs and the default config
through the study's own objective, as ordinary trials queued with the user attr
``autoscout:confirms`` (the number of the trial whose config they repeat): stored with the
study, resumed like it, visible to every worker and in optuna-dashboard.
:func:`read_confirmation` then ranks the configs by the mean of their confirmation runs alone
(the runs the search picked them on are drawn from the lucky tail and stay out; the default
config's runs all count, none was picked for its value); a config that failed a run ranks
behind every config that never did.

The core (:func:`confirmation_targets`, :func:`read_confirmation`) reads plain ``FrozenTrial``
lists; only :func:`confirm_best` touches a study.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _keys
from autoscout_optuna._failure import Infeasible
from autoscout_optuna._progress import is_predicted_failure, real_value
from autoscout_optuna._recovery import LOST_RUN_REASONS
from autoscout_optuna._space import config_key


@dataclass(frozen=True)
class ConfirmedConfig:
    """One config and its real runs.

    Attributes:
        number: The first trial that ran these params (what ``autoscout:confirms`` names).
        params: The config.
        values: The runs its mean is taken over: its confirmation runs; for the default config,
            every run (none was picked for its value).
        searched: The values of its other runs, those the search made: the top configs were
            picked on them, so they carry the winner's curse and stay out of the mean.
        failures: The failure reasons of its FAIL trials (a lost worker not counted).
        is_default: Whether this is the study's default config.
    """

    number: int
    params: Mapping[str, Any]
    values: tuple[float, ...]
    searched: tuple[float, ...] = ()
    failures: tuple[str, ...] = ()
    is_default: bool = False

    @property
    def runs(self) -> int:
        """Runs the mean is over."""
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def stderr(self) -> float | None:
        """Standard error of the mean; None with fewer than two runs."""
        if len(self.values) < 2:
            return None
        return statistics.stdev(self.values) / math.sqrt(len(self.values))


@dataclass(frozen=True)
class Confirmation:
    """What the confirmation runs found.

    Attributes:
        direction: ``"maximize"`` or ``"minimize"``.
        candidates: The confirmed configs with a real run, the default config among them when
            it was confirmed, best first: those that never failed before those that did, each
            group by its mean.
        default: The default config's runs, when the study has a default trial (queued with
            the user attr ``autoscout:default_config``) that was confirmed too.
        single_best: The config (its first trial's number) of the best single real value: the
            search's pick before confirmation.
    """

    direction: str
    candidates: tuple[ConfirmedConfig, ...]
    default: ConfirmedConfig | None
    single_best: int | None

    @property
    def best(self) -> ConfirmedConfig | None:
        """The config to ship: the best mean among those that never failed."""
        return self.candidates[0] if self.candidates else None

    @property
    def changed_winner(self) -> bool:
        """Whether the confirmed best is another config than the best single run's."""
        best = self.best
        return best is not None and self.single_best is not None \
            and best.number != self.single_best

    @property
    def gain_over_default(self) -> float | None:
        """Mean over mean, >1 is better than the default; None without both."""
        best, default = self.best, self.default
        if best is None or default is None:
            return None
        return gain_ratio(best.mean, default.mean, self.direction)

    @property
    def gain_stderr(self) -> float | None:
        """Standard error of :attr:`gain_over_default` (first-order: the two means' relative
        errors added in quadrature); None where either mean has fewer than two runs."""
        gain, best, default = self.gain_over_default, self.best, self.default
        if gain is None or best is None or default is None:
            return None
        if best.stderr is None or default.stderr is None:
            return None
        relative = math.hypot(best.stderr / best.mean, default.stderr / default.mean)
        return abs(gain) * relative


def gain_ratio(best: float | None, default: float | None, direction: str) -> float | None:
    """How many times better ``best`` is than ``default`` (>1 is better) in ``direction``;
    None without both, or where the ratio's denominator is not positive."""
    if best is None or default is None:
        return None
    if direction == "maximize":
        return best / default if default > 0 else None
    return default / best if best > 0 else None


def confirm_best(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float],
    *,
    top: int = 3,
    repeats: int = 2,
    include_default: bool = True,
    catch: tuple[type[Exception], ...] = (Infeasible,),
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] | None = None,
    timeout: float | None = None,
) -> Confirmation:
    """Run the ``top`` configs (by the mean of their real runs so far) and the default config
    ``repeats`` times more each, then rank them by the mean of those runs.

    The runs are trials of ``study`` queued with the user attr ``autoscout:confirms``:
    ``AutoScoutSampler`` records them as ``confirm`` (no search decision is taken, none is
    credited to an arm) and ``FidelityPruner`` always lets them run for real. A config's
    confirmation trials count, finished, failed or still queued (not those a dead worker left
    or Ctrl-C stopped, ``worker_died`` and ``interrupted``: those runs were never made), so
    calling it again (after an interruption, or from a worker started later) only tops up what
    is missing and runs what is still queued; workers calling it at the same moment may each
    queue the missing runs (more runs of the same configs, nothing lost). It runs the queue
    until no confirmation trial is left in it and starts no search trial; Optuna's queue is
    first in, first out, so trials queued before the confirmation ones
    (``study.enqueue_trial``) run first. A confirmation run that fails is recorded with its
    reason like any trial and not retried: a config that cannot run every time ranks behind
    those that can.

    Example:

        .. testcode::

            import optuna
            from autoscout_optuna import AutoScoutSampler, confirm_best

            def objective(trial):
                x = trial.suggest_float("x", -3, 3)
                return (x - 1) ** 2

            study = optuna.create_study(sampler=AutoScoutSampler(seed=0))
            study.optimize(objective, n_trials=20)
            confirmation = confirm_best(study, objective, top=2, repeats=2)
            assert [config.runs for config in confirmation.candidates] == [2, 2]

    Args:
        study: A single-objective study with real runs.
        objective: The study's objective (the protocol objective of a multi-fidelity study).
        top: How many of the best configs to confirm.
        repeats: Confirmation runs per config.
        include_default: Confirm the default config too, when the study ran it as a trial
            (queued with the user attr ``autoscout:default_config``, as ``autoscout run``
            does).
        catch: Exceptions that fail a confirmation run without stopping the others.
        callbacks: Passed to ``study.optimize`` (e.g. a progress reporter).
        timeout: Stop starting confirmation runs after this many seconds (``study.optimize``'s
            ``timeout``); the runs not made stay queued, and a later call runs them.

    Returns:
        The :class:`Confirmation` read back from storage (other workers' runs included).
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1, got {top!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if len(study.directions) != 1:
        raise ValueError("confirm_best needs a single-objective study")
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    for target, missing in confirmation_targets(
        study.get_trials(deepcopy=False), maximize=maximize, top=top, repeats=repeats,
        include_default=include_default,
    ):
        for _ in range(missing):
            study.enqueue_trial(dict(target.params), user_attrs={_keys.CONFIRMS: target.number})
    # One trial at a time, the queue read again before each: other workers pop from the same
    # queue, and an optimize call asked for more trials than the queue still holds would start
    # search trials of its own.
    deadline = None if timeout is None else time.monotonic() + timeout
    while _queued_confirmation_runs(study) and (deadline is None or time.monotonic() < deadline):
        study.optimize(objective, n_trials=1, catch=catch, callbacks=callbacks)
    trials = study.get_trials(deepcopy=False)
    found = read_confirmation(trials, maximize=maximize)
    if found is not None:
        return found
    return Confirmation("maximize" if maximize else "minimize", (), None,
                        _single_best(trials, _configs(trials), maximize))


def _queued_confirmation_runs(study: optuna.Study) -> bool:
    """Whether a confirmation trial (this call's or one an earlier call left) waits in the queue.

    Optuna runs its queue in trial order, so trials a user queued before it run first.
    """
    return any(_keys.CONFIRMS in t.user_attrs
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def confirmation_targets(
    trials: Sequence[FrozenTrial], *, maximize: bool, top: int, repeats: int,
    include_default: bool = True,
) -> list[tuple[ConfirmedConfig, int]]:
    """The configs to confirm, with how many confirmation runs each still lacks.

    The ``top`` configs by the mean of the real runs the search made of them, then the default
    config (if ``include_default`` and it has a real run). Its confirmation trials count toward
    ``repeats`` whatever their state (finished, failed, waiting or running), but for those a
    dead worker left or Ctrl-C stopped (``failure_reason`` ``worker_died``, ``interrupted``):
    those runs were never made.
    """
    configs = _configs(trials)
    ranked = sorted((c for c in configs.values() if c.searched or c.values),
                    key=lambda c: _oriented(_search_mean(c), maximize), reverse=True)[:top]
    default = next((c for c in configs.values() if c.is_default), None)
    if include_default and default is not None and default.values and default not in ranked:
        ranked.append(default)
    asked: dict[int, int] = {}
    for trial in trials:
        number = trial.user_attrs.get(_keys.CONFIRMS)
        # a run whose worker died or that Ctrl-C stopped was never made: it is asked for again
        if number is not None and not _lost(trial):
            asked[number] = asked.get(number, 0) + 1
    return [(config, max(0, repeats - asked.get(config.number, 0))) for config in ranked]


def read_confirmation(
    trials: Sequence[FrozenTrial], *, maximize: bool
) -> Confirmation | None:
    """The configs a confirmation run was made of (user attr ``autoscout:confirms``), ranked;
    None before any was made."""
    # Only runs made count: with the runs still queued (a --timeout spent, Ctrl-C, a worker
    # still at it) the default alone has values (all its runs count) and would be shipped as
    # "confirmed" without a single confirmation run.
    confirmed = {t.user_attrs.get(_keys.CONFIRMS) for t in trials if _run_made(t)} - {None}
    if not confirmed:
        return None
    configs = _configs(trials)
    chosen = [c for c in configs.values() if c.number in confirmed and c.values]
    # the default competes too: where it holds its own against every candidate, it is the
    # config to ship (a gain of 1.00x or less says so)
    candidates = sorted(chosen, key=lambda c: (not c.failures, _oriented(c.mean, maximize)),
                        reverse=True)
    default = next((c for c in chosen if c.is_default), None)
    return Confirmation("maximize" if maximize else "minimize", tuple(candidates), default,
                        _single_best(trials, configs, maximize))


def _configs(trials: Sequence[FrozenTrial]) -> dict[tuple, ConfirmedConfig]:
    """Every config that ran (COMPLETE or FAIL with params), keyed by its params."""
    default = next((t for t in trials if t.user_attrs.get(_keys.DEFAULT_CONFIG)), None)
    default_key = None if default is None or not default.params else config_key(default.params)
    first: dict[tuple, FrozenTrial] = {}
    confirming: dict[tuple, list[float]] = {}
    searched: dict[tuple, list[float]] = {}
    failures: dict[tuple, list[str]] = {}
    for trial in trials:
        if not trial.params or not _run_made(trial):
            continue
        key = config_key(trial.params)
        if trial.state == TrialState.COMPLETE:
            # the default's runs were not picked for their value: all of them are fair
            fair = trial.user_attrs.get(_keys.CONFIRMS) is not None or key == default_key
            (confirming if fair else searched).setdefault(key, []).append(real_value(trial))
        else:
            failures.setdefault(key, []).append(
                str(trial.user_attrs.get(_keys.FAILURE_REASON, "error")))
        first.setdefault(key, trial)
    return {
        key: ConfirmedConfig(
            number=trial.number, params=dict(trial.params),
            values=tuple(confirming.get(key, ())), searched=tuple(searched.get(key, ())),
            failures=tuple(failures.get(key, ())), is_default=key == default_key,
        )
        for key, trial in first.items()
    }


def _run_made(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is a run that was made: a real value, or a failure a run was spent on
    (not one a lost worker left, nor one the simulator predicted)."""
    if trial.state == TrialState.COMPLETE:
        return real_value(trial) is not None
    if trial.state != TrialState.FAIL:
        return False  # still queued or running
    return not _lost(trial) and not is_predicted_failure(trial)


def _lost(trial: FrozenTrial) -> bool:
    """A run that was never made: its worker died, or Ctrl-C stopped it."""
    return trial.user_attrs.get(_keys.FAILURE_REASON) in LOST_RUN_REASONS


def _search_mean(config: ConfirmedConfig) -> float | None:
    """What the search measured of a config: the mean the top configs are picked on."""
    values = config.searched + (config.values if config.is_default else ())
    return statistics.fmean(values) if values else None


def _single_best(
    trials: Sequence[FrozenTrial], configs: Mapping[tuple, ConfirmedConfig], maximize: bool
) -> int | None:
    complete = [t for t in trials if real_value(t) is not None]
    if not complete:
        return None
    best = (max if maximize else min)(complete, key=real_value)
    return configs[config_key(best.params)].number


def _oriented(value: float | None, maximize: bool) -> float:
    if value is None:
        return -math.inf
    return value if maximize else -value


