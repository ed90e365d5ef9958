"""FidelityPruner: trust the simulator where it has proven right, run for real where it matters."""

from __future__ import annotations

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from autoscout_optuna import _keys, _validate
from autoscout_optuna._space import structure_key
from autoscout_optuna._storage import get_fresh_trial, get_trials, set_user_attr
from autoscout_optuna.fidelity._decision import (
    SIMULATOR,
    FidelityDecision,
    FidelitySettings,
    decide,
)
from autoscout_optuna.fidelity._trial_facts import TrialFactsReader, estimate_of

# What of the longer trust window's error goes into a trial's ``autoscout:sim_error_detail``
# (as ``trust_<name>``): what decided trust, not the report-only correlations.
_TRUST_DETAIL = ("relative_error", "relative_error_bound", "discordance", "n_pairs")


class FidelityPruner(BasePruner):
    """Pruner for the multi-fidelity protocol: a pruned trial is one whose estimate was trusted.

    The objective reports a simulator estimate at step 0 and calls ``trial.should_prune()``
    (``autoscout_optuna.fidelity.multi_fidelity_objective`` writes that for you). The pruner
    lets the real run through when

    * the trial runs the default config ``autoscout run`` queued as trial 0 (user attr
      ``autoscout:default_config``): the baseline the gain is measured against, or re-runs a
      config to confirm it (user attr ``autoscout:confirms``, ``autoscout_optuna.confirm_best``),
    * fewer than ``n_warmup_real`` real runs with an estimate (and ``min_pairs``) exist,
    * the simulator's error is above threshold on the last ``window`` trials with both
      fidelities or on the last ``trust_window`` of them (every trial runs for real until the
      error has recovered on both: quick to distrust, slow to trust),
    * periodic validation: each slot of ``validation_period`` trial numbers with no real run
      yet validates its first trial; every second slot only a trial whose estimate ranks in
      the best ``validation_top`` of the ``window`` most recent estimates,
    * the estimate, calibrated and given the benefit of the doubt (``optimism`` times the
      recent relative error), could beat the best real value so far (``could_beat_best``; a
      structure with no real run yet is held to the incumbent structure's first real value
      instead, ``new_structure_control``, on by default),
    * optionally, the estimate ranks in the best ``top_fraction`` of all estimates so far,
    * optionally, the trial's structure (its structural params) already has a real run while
      the simulator is short of measurement grade (``real_for_measured_structures``),

    and prunes otherwise. A trial with no step-0 report always runs for real. The decision, the
    reason, the estimate and the error at that time are recorded as user attrs
    (``autoscout:fidelity``, ``autoscout:fidelity_reason``, ``autoscout:estimate``,
    ``autoscout:sim_error``, ``autoscout:sim_error_detail``; the detail carries the
    ``trust_window`` error as ``trust_relative_error``, ``trust_relative_error_bound``,
    ``trust_discordance`` and ``trust_n_pairs``; a bound too few pairs cannot give, infinite,
    is stored as None, as every non-finite number). All state is read back from storage on
    every call, so a resumed study or a second worker decides alike.

    The error has two parts (see ``autoscout_optuna.fidelity.measure_error``): the calibrated
    relative error (a constant factor between simulator and reality is harmless to a search and
    is calibrated away) and the rank discordance (fraction of wrongly ordered pairs among pairs
    whose real values differ by more than ``rank_tolerance``). ``autoscout:sim_error`` records
    the former.

    Example:

        .. testcode::

            import optuna
            from autoscout_optuna import FidelityPruner
            from autoscout_optuna.fidelity import multi_fidelity_objective

            objective = multi_fidelity_objective(
                suggest=lambda trial: {"x": trial.suggest_float("x", -3, 3)},
                estimate=lambda cfg: (cfg["x"] - 1) ** 2 + 0.1,
                measure=lambda cfg: (cfg["x"] - 1) ** 2,
            )
            study = optuna.create_study(pruner=FidelityPruner())
            study.optimize(objective, n_trials=30)
            assert study.best_trial.user_attrs["autoscout:fidelity"] == "real"

    Args:
        error_threshold: Calibrated relative error above which every trial runs for real.
        rank_error_threshold: Rank discordance above which every trial runs for real, in
            (0, 1]; None switches on the relative error alone.
        rank_tolerance: Real values closer than this fraction count as ties in the rank error.
        optimism: How many recent relative errors an estimate may be short of the best real
            value and still run for real. 0 runs only estimates that beat it outright.
        top_fraction: Also run estimates in this best fraction of all estimates so far; None
            (default) relies on ``could_beat_best`` alone.
        validation_period: Trial numbers per validation slot: a slot in which nothing ran for
            real yet validates its first (well-ranked) trial; None disables validation.
        validation_top: Every second validation slot goes only to an estimate ranking in
            this best fraction of the ``window`` most recent estimates (a config the simulator
            rightly calls poor is a wasted real run); None: every slot validates whatever
            trial opens it.
        n_warmup_real: Real runs (with an estimate) before any estimate is trusted.
        window: How many of the most recent estimate/real pairs the error is measured on.
        trust_window: A longer window the error must also be below threshold on before
            estimates are trusted. A noisy simulator's error over ``window`` pairs dips below
            the threshold now and then by the luck of the draw, and each dip would prune
            trials on the word of a simulator that is no better than before; over twice as
            many pairs (the defaults) such dips are far rarer. The cost: after a genuinely bad
            stretch, trust returns only once the longer window has recovered. None, or not
            longer than ``window``: ``window`` alone.
        trust_confidence: Trust also needs an upper confidence bound (at this confidence,
            distribution-free) on the median relative error over ``trust_window`` below
            ``error_threshold``, not just the median itself: early on, with a few pairs, the
            median of a noisy simulator's errors falls below the threshold by luck far more
            often than over 40. None: the median alone.
        min_pairs: Pairs needed before the error is trusted at all.
        selection_aware: Calibrate estimates (the median ratio ``real / estimate`` that
            ``could_beat_best`` scales them by) only on pairs whose real run the estimate did
            not choose (warm-up, a distrusted simulator, blind validation; not
            ``could_beat_best`` or ``top_fraction``). A real run chosen because its estimate
            looked good is a lucky draw of the simulator's noise, so calibrating on such pairs
            scales every later estimate down (llm_serving, 20 % noise: by a median 13 %).
        new_structure_control: Judge a trial whose structure (its structural params) has no
            real run yet against the incumbent structure's *first* real value instead of the
            best real value: difference-in-differences, a structure at its stage 0 of dense
            tuning against the incumbent at its stage 0, as ``AutoScoutSampler`` credits it.
            Against the best real value, a new structure's estimate (at dense values it
            inherited, untuned) competes with the incumbent's luckiest measurement after its
            dense tuning, and a structure that would win once tuned is pruned before it gets a
            look. ``fidelity-long`` at 20 % noise (training), paired on held-out seeds 32-95:
            99 % of the optimum in 55 of 64 seeds instead of 48, after a median 108.5 real runs
            instead of 124 (mean log ratio per seed -0.167 +- 0.085); level on the tuning seeds
            0-31. False: the best real value.
        real_for_measured_structures: Run for real a trial whose structure already has a real
            run while the simulator is short of measurement grade (calibrated relative error
            above 5 % or rank discordance above 0.25, the limits under which the samplers take
            an estimate as a measurement), both over the recent pairs and over the structure's
            own pairs (a simulator biased per structure can still order one structure's dense
            points). Such a trial tunes the dense knobs of a known structure, and its estimate
            could only mark its point as judged: the dense search learns nothing from it, and
            with most of its probes pruned it stalls short of the optimum. New structures are
            still judged by their estimates, which is where a noisy simulator earns its keep.
            Fidelity suite at 20 % noise: on seeds 0-15, 99 % of the optimum reached in 9/16
            (training) and 12/16 (serving) seeds instead of 3/16 and 4/16, but on held-out
            seeds 16-26 in 5/11 and 6/11 seeds either way, with about twice the real runs
            (median real runs to 99 %, censored seeds counted: 168 and 114 against 87 and 78):
            hence off by default. Only trials with structural params (a study without any has
            one structure, always measured, and would prune nothing). False (default): such
            trials are judged like any other.
    """

    def __init__(
        self,
        *,
        error_threshold: float = 0.3,
        rank_error_threshold: float | None = 0.35,
        rank_tolerance: float = 0.05,
        top_fraction: float | None = None,
        optimism: float = 1.0,
        validation_period: int | None = 10,
        validation_top: float | None = None,
        n_warmup_real: int = 5,
        window: int = 20,
        trust_window: int | None = 40,
        trust_confidence: float | None = 0.9,
        min_pairs: int = 5,
        selection_aware: bool = False,
        new_structure_control: bool = True,
        real_for_measured_structures: bool = False,
    ) -> None:
        _validate.reals(error_threshold=error_threshold, rank_tolerance=rank_tolerance,
                        optimism=optimism)
        _validate.booleans(selection_aware=selection_aware,
                           new_structure_control=new_structure_control,
                           real_for_measured_structures=real_for_measured_structures)
        self._new_structure_control = bool(new_structure_control)
        _validate.optional_reals(rank_error_threshold=rank_error_threshold,
                                 top_fraction=top_fraction, validation_top=validation_top,
                                 trust_confidence=trust_confidence)
        _validate.integers(n_warmup_real=n_warmup_real, window=window, min_pairs=min_pairs)
        _validate.optional_integers(validation_period=validation_period, trust_window=trust_window)
        if not error_threshold > 0:
            raise ValueError(f"error_threshold must be > 0, got {error_threshold}")
        if rank_error_threshold is not None and not 0.0 < rank_error_threshold <= 1.0:
            raise ValueError(
                f"rank_error_threshold must be in (0, 1] or None, got {rank_error_threshold}"
            )
        if not 0.0 <= rank_tolerance < 1.0:
            raise ValueError(f"rank_tolerance must be in [0, 1), got {rank_tolerance}")
        if top_fraction is not None and not 0.0 < top_fraction <= 1.0:
            raise ValueError(f"top_fraction must be in (0, 1] or None, got {top_fraction}")
        if validation_top is not None and not 0.0 < validation_top <= 1.0:
            raise ValueError(f"validation_top must be in (0, 1] or None, got {validation_top}")
        if not optimism >= 0:
            raise ValueError(f"optimism must be >= 0, got {optimism}")
        if validation_period is not None and (
            isinstance(validation_period, bool) or int(validation_period) != validation_period
            or validation_period < 1
        ):
            raise ValueError(
                f"validation_period must be an int >= 1 or None, got {validation_period}"
            )
        if int(n_warmup_real) != n_warmup_real or n_warmup_real < 0:
            raise ValueError(f"n_warmup_real must be an int >= 0, got {n_warmup_real}")
        if int(window) != window or window < 2:
            raise ValueError(f"window must be an int >= 2, got {window}")
        if trust_window is not None and trust_window < 2:
            raise ValueError(f"trust_window must be an int >= 2 or None, got {trust_window}")
        if trust_confidence is not None and not 0.0 < trust_confidence < 1.0:
            raise ValueError(f"trust_confidence must be in (0, 1) or None, got {trust_confidence}")
        if int(min_pairs) != min_pairs or not 2 <= min_pairs <= window:
            raise ValueError(f"min_pairs must be an int in [2, window], got {min_pairs}")
        self._settings = FidelitySettings(
            error_threshold=float(error_threshold),
            rank_error_threshold=(
                None if rank_error_threshold is None else float(rank_error_threshold)
            ),
            rank_tolerance=float(rank_tolerance),
            top_fraction=None if top_fraction is None else float(top_fraction),
            optimism=float(optimism),
            validation_period=None if validation_period is None else int(validation_period),
            n_warmup_real=int(n_warmup_real),
            validation_top=None if validation_top is None else float(validation_top),
            window=int(window),
            min_pairs=int(min_pairs),
            trust_window=None if trust_window is None else int(trust_window),
            trust_confidence=None if trust_confidence is None else float(trust_confidence),
            selection_aware=bool(selection_aware),
            real_for_measured_structures=bool(real_for_measured_structures),
        )
        self._facts = TrialFactsReader(
            track_structures=self._new_structure_control or bool(real_for_measured_structures)
        )

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        _validate.single_objective(study, "FidelityPruner")
        # Asked twice in one trial (the same step-0 value): keep the first answer, Optuna's
        # should_prune contract. The answer is read back from storage: ``Trial.should_prune``
        # hands over the trial as the objective last saw it, without the attrs ``_record``
        # wrote, and a fresh decision on a history that moved on could prune a trial already
        # running for real and overwrite its record.
        attrs = get_fresh_trial(study, trial).user_attrs
        recorded = attrs.get(_keys.FIDELITY)
        if recorded in ("simulator", "real") and _keys.FIDELITY_REASON in attrs and (
            _keys.ESTIMATE not in attrs or attrs[_keys.ESTIMATE] == estimate_of(trial)
        ):
            return recorded == SIMULATOR
        decision = self.decide(study, trial)
        self._record(study, trial, decision)
        return decision.fidelity == SIMULATOR

    def decide(self, study: optuna.Study, trial: FrozenTrial) -> FidelityDecision:
        """The decision ``prune`` would take for ``trial``, without recording it."""
        maximize = study.direction == StudyDirection.MAXIMIZE
        pool, pair_estimates, pair_reals, reals, pair_selected = [], [], [], [], []
        runs: list[tuple[tuple, float]] = []  # (structure, real value), for the DiD bar
        measured: set[tuple] = set()  # structures with a real run
        track_structures = self._facts.tracks_structures
        own = structure_key(trial.params, trial.distributions) if track_structures else None
        own_estimates: list[float] = []  # the pairs of the trial's own structure
        own_reals: list[float] = []
        last_real_number = None
        for other in self._facts.read(get_trials(study)):
            if other.number == trial.number:
                continue
            if other.number < trial.number and other.ran_for_real:
                last_real_number = max(other.number, last_real_number or 0)
            real = other.real
            if real is not None:
                reals.append(real)
                if track_structures:
                    runs.append((other.structure, real))
                    measured.add(other.structure)
            if other.estimate is None:
                continue
            pool.append(other.estimate)
            if real is not None:
                pair_estimates.append(other.estimate)
                pair_reals.append(real)
                pair_selected.append(other.selected)
                if track_structures and other.structure == own:
                    own_estimates.append(other.estimate)
                    own_reals.append(real)
        best_real = (max(reals) if maximize else min(reals)) if reals else None
        if self._new_structure_control and best_real is not None:
            best_real = _structure_control(own, runs, maximize, best_real)
        return decide(
            trial_number=trial.number,
            estimate=estimate_of(trial),
            maximize=maximize,
            pool_estimates=pool,
            pair_estimates=pair_estimates,
            pair_reals=pair_reals,
            best_real=best_real,
            settings=self._settings,
            last_real_number=last_real_number,
            pair_selected=pair_selected,
            # a study without structural params has one structure, always measured: there
            # the rule would prune nothing, so it applies where structure exists
            measured_structure=bool(own) and own in measured,
            structure_pairs=(own_estimates, own_reals),
            baseline=bool(trial.user_attrs.get(_keys.DEFAULT_CONFIG)),
            confirmation=trial.user_attrs.get(_keys.CONFIRMS) is not None,
        )

    def _record(self, study: optuna.Study, trial: FrozenTrial, decision: FidelityDecision) -> None:
        error = decision.error
        set_user_attr(study, trial, _keys.FIDELITY, decision.fidelity)
        set_user_attr(study, trial, _keys.FIDELITY_REASON, decision.reason)
        set_user_attr(study, trial, _keys.ESTIMATE, estimate_of(trial))
        set_user_attr(study, trial, _keys.SIM_ERROR, error.relative_error)
        detail = error.as_dict()
        if decision.trust_error is not None:
            trust = decision.trust_error.as_dict()
            detail.update({f"trust_{name}": trust[name] for name in _TRUST_DETAIL})
        set_user_attr(study, trial, _keys.SIM_ERROR_DETAIL, detail)


def _structure_control(
    own: tuple, runs: list[tuple[tuple, float]], maximize: bool, best_real: float
) -> float:
    """The value a trial's estimate must beat: the best real value, or for a structure
    (``own``) with no real run yet, the incumbent structure's *first* real value
    (difference-in-differences: a new structure at its stage 0 of dense tuning against the
    incumbent at its stage 0). ``runs``: (structure, real value) of the other real runs, oldest
    first."""
    first: dict[tuple, float] = {}
    best: dict[tuple, float] = {}
    sign = 1.0 if maximize else -1.0
    for key, real in runs:
        if key == own:
            return best_real
        first.setdefault(key, real)
        if key not in best or sign * real > sign * best[key]:
            best[key] = real
    if not best:
        return best_real
    incumbent = max(best, key=lambda k: sign * best[k])
    return first[incumbent]
