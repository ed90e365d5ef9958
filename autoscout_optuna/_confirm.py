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
from autoscout_optuna._recovery import LOST_RUN_REASONS, tag_worker
from autoscout_optuna._space import config_key
from autoscout_optuna._storage import (
    claim_waiting_trial,
    fail_trial,
    get_fresh_trial,
    set_system_attr,
    set_user_attr,
)

# The failure reasons of confirmation trials never run: one another worker had queued too
# (retired unrun; the other stands), and a search trial Optuna started for a confirmation call
# that found the queue emptied by another worker (stopped before the objective).
DUPLICATE = "duplicate_confirmation"
QUEUE_EMPTIED = "confirmation_queue_empty"
# Optuna's RetryFailedTrialCallback marks its retries with this system attr: a retry is a run of
# its own, not a second queueing of the run it repeats.
_OPTUNA_RETRY = "failed_trial"


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
    is missing and runs what is still queued. It runs the queue until no confirmation trial is
    left in it and starts no search trial; Optuna's queue is first in, first out, so trials
    queued before the confirmation ones (``study.enqueue_trial``) run first. A confirmation run
    that fails is recorded with its reason like any trial and not retried: a config that cannot
    run every time ranks behind those that can.

    Workers sharing the study's storage may call it at the same moment: the storage alone
    decides, with no lock. Each run is named by its config and slot (user attr
    ``autoscout:confirm_slot``, the first slots the config lacks), so workers that read the
    same trials queue the same runs; after queueing, each worker retires every still-waiting
    trial of a (config, slot) that a lower-numbered trial holds (claimed as Optuna pops its
    queue, then failed unrun with ``failure_reason`` ``duplicate_confirmation``, marked
    orphaned so the search numbers its decisions without it; neither a confirmation run nor a
    lost one). Each run is made once and the answer is the one a single worker gives, unless
    workers start both copies of a run in the instant between queueing and retiring (then both
    runs are made, and count). A worker whose last queued run another worker took meanwhile fails
    the search trial Optuna starts instead (``confirmation_queue_empty``, orphaned, no run
    spent). It returns once the queue holds no confirmation run: a run another worker is still
    making is not in its answer (``autoscout show`` reads the study again). Workers that read
    different trials (one still searching) may pick different top configs: each config is
    confirmed.

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
    _queue_missing_runs(study, maximize=maximize, top=top, repeats=repeats,
                        include_default=include_default)
    # One trial at a time, the queue read again before each: other workers pop from the same
    # queue, and an optimize call asked for more trials than the queue still holds would start
    # search trials of its own.
    deadline = None if timeout is None else time.monotonic() + timeout
    queued_only = _queued_trials_only(objective)
    while _queued_confirmation_runs(study) and (deadline is None or time.monotonic() < deadline):
        study.optimize(queued_only, n_trials=1, catch=(*catch, _QueueEmptied),
                       callbacks=callbacks)
    trials = study.get_trials(deepcopy=False)
    found = read_confirmation(trials, maximize=maximize)
    if found is not None:
        return found
    return Confirmation("maximize" if maximize else "minimize", (), None,
                        _single_best(trials, _configs(trials), maximize))


def _queue_missing_runs(
    study: optuna.Study, *, maximize: bool, top: int, repeats: int, include_default: bool
) -> None:
    """Queue each config's missing confirmation runs, then retire what was queued twice.

    Optuna has no compare-and-set for "queue if nobody has": a worker that read the same
    trials as another one queues the same runs. So each run is named by its config and slot
    (the first free slot numbers of that config, the same for every worker that read the same
    trials), and every worker retires, after queueing, each still-waiting trial of a (config,
    slot) that a lower-numbered trial holds (:func:`_retire_duplicates`).
    """
    trials = study.get_trials(deepcopy=False)
    held = _held_slots(trials)
    for target, missing in confirmation_targets(
        trials, maximize=maximize, top=top, repeats=repeats, include_default=include_default,
    ):
        for slot in _free_slots(held.get(target.number, []), missing):
            study.enqueue_trial(dict(target.params), user_attrs={
                _keys.CONFIRMS: target.number, _keys.CONFIRM_SLOT: slot})
    _retire_duplicates(study)


def _retire_duplicates(study: optuna.Study) -> list[int]:
    """Fail, unrun, every waiting confirmation trial whose (config, slot) a lower-numbered trial
    holds; the numbers of those this worker retired.

    Every worker applies the same rule to the same storage, so they agree on which trial stands
    without talking to each other: the lowest-numbered is never retired (no worker sees a lower
    one of its slot), and a later one is retired by whoever claims it first. The claim is the
    compare-and-set Optuna pops its queue with, so a trial another worker has started is never
    taken from it (then both runs are made: more runs of one config, nothing lost).
    """
    held: set[tuple[Any, Any]] = set()
    retired = []
    for trial in study.get_trials(deepcopy=False):
        slot = trial.user_attrs.get(_keys.CONFIRM_SLOT)
        if slot is None or never_made(trial) or _OPTUNA_RETRY in trial.system_attrs:
            continue
        key = (trial.user_attrs.get(_keys.CONFIRMS), slot)
        if key not in held:
            held.add(key)
        elif trial.state == TrialState.WAITING and claim_waiting_trial(study, trial):
            _fail_unrun(study, trial, DUPLICATE)
            retired.append(trial.number)
    return retired


def _fail_unrun(study: optuna.Study, trial: FrozenTrial, reason: str) -> None:
    """Fail a trial this worker holds RUNNING before any run was spent on it, with ``reason``.

    Tagged with this worker first (should it die here, ``recover_orphaned_trials`` fails it)
    and marked orphaned, as a dead worker's trial is: the samplers skip it and number their
    decisions without it, so the search goes on as it would have without it.
    """
    tag_worker(study, trial)
    set_system_attr(study, trial, _keys.ORPHANED, True)
    set_user_attr(study, trial, _keys.FAILURE_REASON, reason)
    fail_trial(study, trial)


class _QueueEmptied(Exception):
    """The trial Optuna started is a new search trial: another worker took the last queued one."""


def _queued_trials_only(
    objective: Callable[[optuna.Trial], float]
) -> Callable[[optuna.Trial], float]:
    """``objective`` for the trials that were queued; a new search trial fails unrun.

    Between reading the queue and popping it, another worker may pop the last confirmation
    run, and Optuna then starts a search trial: confirmation starts none of its own, so that
    trial is failed (reason ``confirmation_queue_empty``) before a run is spent on it, marked
    orphaned so the search numbers its decisions as if it never was.
    """
    def run(trial: optuna.Trial) -> float:
        system_attrs = get_fresh_trial(trial.study, trial).system_attrs
        if "fixed_params" not in system_attrs and _OPTUNA_RETRY not in system_attrs:
            trial.set_user_attr(_keys.FAILURE_REASON, QUEUE_EMPTIED)
            set_system_attr(trial.study, trial, _keys.ORPHANED, True)
            raise _QueueEmptied(f"trial {trial.number} is a new search trial: another worker "
                                "took the last queued confirmation run; stopped unrun")
        return objective(trial)

    return run


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

    The ``top`` configs by the mean of the real runs the search made of them (confirmation runs
    left out, the default's too, so the pick does not move as they come in), then every other
    config an earlier call asked confirmation runs of (each confirmed config is ranked on
    ``repeats`` runs, not on fewer), then the default config (if ``include_default`` and it has
    a real run). Its confirmation trials count toward
    ``repeats`` whatever their state (finished, failed, waiting or running), but for those a
    dead worker left or Ctrl-C stopped (``failure_reason`` ``worker_died``, ``interrupted``):
    those runs were never made.
    """
    configs = _configs(trials)
    # Picked on the runs the search made: the default's confirmation runs count toward its
    # mean, and as they came in they moved it down the ranking, so a worker that read them
    # picked another top config than one that did not (a fourth config confirmed in full).
    searched = _configs([t for t in trials if _keys.CONFIRMS not in t.user_attrs])
    order = sorted((key for key, c in searched.items() if c.searched or c.values),
                   key=lambda key: _oriented(_search_mean(searched[key]), maximize),
                   reverse=True)
    ranked = [configs[key] for key in order[:top]]
    held = _held_slots(trials)
    # A config an earlier call confirmed (before the search went on, or a worker that read
    # other trials) competes to be shipped too: its runs are topped up like the top configs',
    # or one lucky run of it outranked configs confirmed on `repeats` runs each.
    ranked += [c for c in configs.values()
               if c.number in held and not c.is_default and c not in ranked]
    default = next((c for c in configs.values() if c.is_default), None)
    if include_default and default is not None and default.values and default not in ranked:
        ranked.append(default)
    return [(config, max(0, repeats - _asked(held.get(config.number, []))))
            for config in ranked]


def _held_slots(trials: Sequence[FrozenTrial]) -> dict[int, list[int | None]]:
    """The slots of each confirmed config's confirmation trials that count (None for one
    queued before slots were recorded), keyed by the config's number.

    A run whose worker died or that Ctrl-C stopped was never made, nor was a duplicate retired
    unrun: they hold no slot, and a lost run is asked for again.
    """
    held: dict[int, list[int | None]] = {}
    for trial in trials:
        number = trial.user_attrs.get(_keys.CONFIRMS)
        if number is not None and not never_made(trial):
            held.setdefault(number, []).append(trial.user_attrs.get(_keys.CONFIRM_SLOT))
    return held


def _asked(slots: Sequence[int | None]) -> int:
    """Runs asked for: one per slot held (twice-queued runs of one slot are one run asked for)
    and one per trial without a slot."""
    return len({s for s in slots if s is not None}) + sum(s is None for s in slots)


def _free_slots(slots: Sequence[int | None], missing: int) -> list[int]:
    """The ``missing`` lowest slot numbers not held: what every worker that read the same
    trials names the runs it queues."""
    taken = set(slots)
    free: list[int] = []
    slot = 1
    while len(free) < missing:
        if slot not in taken:
            free.append(slot)
        slot += 1
    return free


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
    return not never_made(trial) and not is_predicted_failure(trial)


def never_made(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is a run that was never made: its worker died, Ctrl-C stopped it, it
    was queued twice and retired unrun, or it is a search trial stopped unrun for an emptied
    queue (whose params, on a space of few choices, can be a confirmed config's)."""
    reason = trial.user_attrs.get(_keys.FAILURE_REASON)
    return reason in LOST_RUN_REASONS or reason in (DUPLICATE, QUEUE_EMPTIED)


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


