"""Optuna adapter for the coordinate descent in ``search.py``: trials in, one plan per trial out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _storage, _validate
from autoscout_optuna._history import Observation, observation_of, simulator_trusted
from autoscout_optuna._keys import ORPHANED, STRUCTURE
from autoscout_optuna._rng import resolve_seed, trial_rng
from autoscout_optuna._space import MAX_STRUCTURAL_LEVELS, contains, from_unit, is_structural
from autoscout_optuna._space import to_unit as _to_unit
from autoscout_optuna.samplers._coordinate import prior, search
from autoscout_optuna.samplers._independent import IndependentSampler

_MAX_OPEN_PLANS = 256  # plans of trials in flight kept in memory (one per running trial)
_KINDS = {"real": search.REAL, "estimate": search.ESTIMATE, "failed": search.FAILED,
          "pending": search.PENDING}
_TRUSTED_KINDS = dict(_KINDS, estimate=search.REAL)  # estimates count as measurements
_LINE_PHASES = ("probe", "step")  # moves along one coordinate from a center


class CoordinateDescentSampler(IndependentSampler):
    """Stochastic coordinate descent on the dense knobs, with the structure held fixed.

    Each trial moves one dense coordinate of the current center (in the unit cube: log knobs in
    log space, integers and stepped floats rounded): a probe along the estimated slope, the
    other side, then the vertex of the parabola through the bracket. Failed trials are walls,
    approached by bisection and never crossed; an apparent improvement within the measurement
    noise is re-measured before the center moves. When every coordinate is resolved the sampler
    follows the center's travel (a pattern move), tries together the probes that tied with the
    center on several lines (a ties move: gains each hidden by the noise), redraws together the
    knobs found flat around the center (a plateau move: the next stair of a staircase), then
    the best point of a quadratic fitted around the center (a model move: curved valleys,
    coupled knobs), then restarts around it.

    Refining several structures in turn (as ``AutoScoutSampler``'s refine arm does), a
    structure's line searches start with the knobs whose moves changed the score most under
    the study's other structures, a knob found flat there last; and until the structure has
    measured a point twice, the relative noise pooled over every configuration the study
    measured more than once tells its steps from ties (``_coordinate/prior.py``).

    The structure kept is the one handed over in the trial's system attr
    ``autoscout_optuna._keys.STRUCTURE`` (``{param: value}``, written by an orchestrator before
    the first suggest call) or else the best trial's structural values. Structural params
    without such an anchor, and every param of a space with no dense knob, go to ``fallback``.

    Every decision is stored on the trial: user attrs ``cd:phase`` (startup / confirm / probe /
    step / slide / pattern / ties / plateau / model / restart / fallback), ``cd:coordinate``
    (None for moves off the axes), ``cd:step`` (signed, unit cube; for ``pattern`` the multiple
    ``t`` of the center's travel, for ``ties`` the number of knobs moved, for ``plateau`` the
    farthest knob's distance, for ``model`` the trust radius), ``cd:slope``, ``cd:center``
    (trial number). Nothing else is kept: a resumed or parallel study rebuilds the same state
    from storage (a memo of finished trials only saves re-reading them).

    Example:
        .. testcode::

            import optuna
            from autoscout_optuna import CoordinateDescentSampler

            def objective(trial):
                x = trial.suggest_float("x", -5, 5)
                lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
                return (x - 1.2) ** 2 + (lr * 1000 - 1) ** 2

            study = optuna.create_study(sampler=CoordinateDescentSampler(seed=0))
            study.optimize(objective, n_trials=40)

    Args:
        seed: Seed of every random choice (derived per trial, so a resume reproduces).
        fallback: Sampler for params with no anchor; None draws them uniformly from ``seed``.
        rule: Which coordinate's line search comes next: ``"cyclic"`` (default), ``"random"``
            or ``"sensitivity"`` (weighted by the score change each coordinate produced).
        initial_step: First probe distance along a coordinate, as a fraction of its range.
        min_step: Resolution below which a coordinate counts as resolved (unit cube).
        confidence: Multiple of the noise a single measurement must beat to move the center.
            1.75 (coordinate suite, 20 seeds, against 2.0: llm_serving 36.5 -> 30 trials to
            99 %, coupled 95.5 -> 94, throughput reaching 99 % in 15 seeds instead of 17;
            1.5: 14; measured before the vertex-gain rule of ``moves.line_proposal``).
        restart_radius: First restart around a resolved center, in multiples of each
            coordinate's last step (doubles per miss, up to 8x, then starts again).
        headroom: Next to a wall, let a point tied with the center (within the noise) but
            farther from the failure take its place. Pays where a score-neutral knob bounds
            another (memory fraction against batch size: ``fn_throughput`` 22 trials to 99 %
            instead of none within 200); costs where the ties hide plateaus a few percent
            lower (``llm_serving``), which is why ``AutoScoutSampler`` turns it off.
        use_estimates: Whether a PRUNED trial's step-0 estimate (a simulator's score, see
            :class:`~autoscout_optuna.FidelityPruner`) counts as a measurement of its point:
            the line search, the center and the noise estimate then use it like a real value,
            while the pruner's newest check finds the simulator as good as a measurement
            (:func:`~autoscout_optuna._history.simulator_trusted`: a FidelityPruner has
            compared it with real runs and found a rank discordance of at most 0.25 and a
            calibrated relative error of at most 5 %).
            With a pruner, most dense moves are judged by the simulator and pruned (the refine
            arm of ``AutoScoutSampler`` gets ~20 real runs in ~120 trials on ``llm_serving``);
            read only as "taken", they taught the line search nothing, and a structure whose
            configs could not beat the best real value never moved its center. Against False,
            99 % of the optimum reached by llm_serving / llm_training with a noiseless
            simulator in 6/8 / 7/8 seeds instead of 2/8 / 3/8 (final best 0.998 / 0.996
            instead of 0.972 / 0.988); at 20 % noise, seeds 0-15, in 5/16 / 7/16 instead of
            4/16 / 7/16 (the error bound keeps most of those estimates out: taken as
            measurements whenever the rank check allowed, only 1/16 / 6/16, as serving's
            plateaus are closer than that noise); at 80 % unchanged. False: an estimate only
            marks its point as judged, never proposed again. Either way the structure
            refined, and the incumbent it starts from, are chosen from real values only.
        max_structural_levels: Discrete domains with at most this many values are structural.
    """

    # Decisions depend only on (seed, decision number, non-orphaned history): after a worker
    # dies, the next trial re-proposes the orphan's configuration (see ``_recovery``).
    reproposes_orphans = True
    # refuse a multi-objective study before the first param (see ``IndependentSampler``)
    single_objective_only = True

    def __init__(
        self,
        *,
        seed: int | None = None,
        fallback: BaseSampler | None = None,
        rule: str = "cyclic",
        initial_step: float = 0.25,
        min_step: float = 1e-3,
        confidence: float = 1.75,
        restart_radius: float = 1.0,
        headroom: bool = True,
        use_estimates: bool = True,
        max_structural_levels: int = MAX_STRUCTURAL_LEVELS,
    ) -> None:
        _validate.reals(initial_step=initial_step, min_step=min_step, confidence=confidence,
                        restart_radius=restart_radius)
        _validate.booleans(headroom=headroom, use_estimates=use_estimates)
        _validate.integers(max_structural_levels=max_structural_levels)
        if fallback is not None and not isinstance(fallback, BaseSampler):
            raise TypeError(f"fallback must be an optuna sampler or None, got {fallback!r}")
        if rule not in search.RULES:
            raise ValueError(f"rule must be one of {search.RULES}, got {rule!r}")
        if not 0.0 < initial_step <= 0.5:
            raise ValueError(f"initial_step must be in (0, 0.5], got {initial_step}")
        if not 0.0 < min_step < initial_step:
            raise ValueError(f"min_step must be in (0, initial_step), got {min_step}")
        if not confidence >= 0.0:
            raise ValueError(f"confidence must be >= 0, got {confidence}")
        if not 0.0 < restart_radius <= 10.0:
            raise ValueError(f"restart_radius must be in (0, 10], got {restart_radius}")
        if max_structural_levels < 0:
            raise ValueError(f"max_structural_levels must be >= 0, got {max_structural_levels}")
        self._seed = resolve_seed(seed)
        self._fallback = fallback
        self._max_levels = int(max_structural_levels)
        self._use_estimates = bool(use_estimates)
        self._settings = search.Settings(
            rule=rule, initial_step=float(initial_step), min_step=float(min_step),
            confidence=float(confidence), restart_radius=float(restart_radius),
            headroom=bool(headroom),
        )
        self._cache: dict[str, dict[int, tuple[Any, _Entry | None]]] = {}  # finished trials
        # The plan of each trial in flight, so its later suggest calls need no storage round
        # trip. Scratch, not state: what later trials learn from is in the cd:* user attrs.
        self._plans: dict[tuple[str, int, Any], dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = {}  # a memo of finished trials: rebuilt from storage on demand
        state["_plans"] = {}
        return state

    # ---- Optuna hooks -------------------------------------------------------------------

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        _validate.single_objective(study, type(self).__name__)
        plan = self.plan_trial(study, trial)
        return self._value(study, trial, plan, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self._fallback is not None:
            self._fallback.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Any
    ) -> None:
        self._plans.pop((study.study_name, trial.number, trial.datetime_start), None)
        if self._fallback is not None:
            self._fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Forwarded to the fallback; the seed is kept (``_rng``'s module doc)."""
        if self._fallback is not None:
            self._fallback.reseed_rng()

    # ---- composition API ----------------------------------------------------------------

    def plan_trial(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        """The plan of ``trial``: decided on the first call, then the same for its other params.

        Returns a JSON dict: ``phase``, ``coordinate``, ``step``, ``slope``, ``center``,
        ``structure`` (values kept), ``params`` (values proposed for the dense knobs and the
        structure), ``decision`` (the number seeding random draws), ``random``. The first five
        are also written to the trial as ``cd:*`` user attrs: that is all later trials read.
        """
        key = (study.study_name, trial.number, trial.datetime_start)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._decide(study, trial)
            for name in ("phase", "coordinate", "step", "slope", "center"):
                _storage.set_user_attr(study, trial, f"cd:{name}", plan[name])
            if len(self._plans) >= _MAX_OPEN_PLANS:  # trials whose after_trial never came
                self._plans.pop(next(iter(self._plans)), None)
            self._plans[key] = plan
        return plan

    # ---- internals ----------------------------------------------------------------------

    def _decide(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        entries, decision = self._history(study, trial)
        history = [entry.observation for entry in entries]
        real = [o for o in history if o.kind == "real"]
        incumbent = max(real, key=lambda o: o.score) if real else None
        handed = trial.system_attrs.get(STRUCTURE)
        if isinstance(handed, Mapping):
            structure = dict(handed)
        elif incumbent is not None:
            structure = {k: v for k, v in incumbent.params.items()
                         if self._structural(incumbent.distributions[k])}
        else:
            structure = {}
        group = [e for e in entries if _shares(e.observation, structure)] if structure else entries
        plan: dict[str, Any] = {"phase": "startup", "coordinate": None, "step": 0.0,
                                "slope": None, "center": None, "structure": structure,
                                "params": {}, "decision": decision, "random": False}
        group_real = [e.observation for e in group if e.observation.kind == "real"]
        if not group_real:
            if group:  # the start is taken (failed, or running on another worker)
                plan["random"] = True
            elif incumbent is not None:  # a new structure starts from the best dense values
                plan["params"] = {k: v for k, v in incumbent.params.items()
                                  if not self._structural(incumbent.distributions[k])}
            return plan
        best = max(group_real, key=lambda o: o.score)
        names = sorted(k for k, d in best.distributions.items() if not self._structural(d))
        if not names:
            plan["phase"] = "fallback"
            plan["structure"] = structure if isinstance(handed, Mapping) else {}
            return plan
        dists = [best.distributions[k] for k in names]
        # Estimates are measurements only while the pruner finds them close to real values.
        kinds = _TRUSTED_KINDS if self._use_estimates and simulator_trusted(study) else _KINDS
        rows, evidence = _evidence(group, names, dists, kinds)
        rng = trial_rng(self._seed, decision, "cd:plan")
        move = search.plan_move(
            evidence, self._settings, rng, snap=_snapper(dists),
            prior=_prior(entries, group, names),
        )
        values = zip(names, dists, move.point, strict=True)
        plan["params"] = {k: from_unit(d, u) for k, d, u in values}
        plan.update(
            phase=move.phase,
            coordinate=names[move.coordinate] if move.coordinate >= 0 else None,
            step=float(move.step),
            slope=None if move.slope is None else float(move.slope),
            center=rows[move.center].number if move.center >= 0 else None,
        )
        return plan

    def _history(self, study: optuna.Study, trial: FrozenTrial) -> tuple[list[_Entry], int]:
        """Every other trial as (observation, float params), and this trial's decision number.

        Finished trials never change, so their entries are memoized (checked against the start
        time, so a recreated study of the same name is not confused with an old one). Trials of
        dead workers (``ORPHANED``) are skipped and not counted, as ``_history`` does.
        """
        cache = self._cache.setdefault(study.study_name, {})
        direction = study.direction
        entries: list[_Entry] = []
        orphans = 0
        for t in _storage.get_trials(study):
            hit = cache.get(t.number)
            if hit is not None and hit[0] == t.datetime_start:
                entry = hit[1]
            else:
                orphaned = t.system_attrs.get(ORPHANED)
                entry = None if orphaned else _Entry(observation_of(t, direction))
                if t.state.is_finished():
                    cache[t.number] = (t.datetime_start, entry)
            if entry is None:
                orphans += t.number < trial.number
            elif t.number != trial.number:
                entries.append(entry)
        return entries, trial.number - orphans

    def _structural(self, dist: BaseDistribution) -> bool:
        return is_structural(dist, self._max_levels)

    def _value(
        self, study: optuna.Study, trial: FrozenTrial, plan: Mapping[str, Any], name: str,
        dist: BaseDistribution,
    ) -> Any:
        structure, params = plan["structure"], plan["params"]
        if name in structure:
            if contains(dist, structure[name]):
                return structure[name]
        elif name in params and not isinstance(dist, CategoricalDistribution):
            value = params[name]
            if contains(dist, value):
                return value
            try:  # the range changed since: the nearest legal value
                return from_unit(dist, _to_unit(dist, value))
            except (TypeError, ValueError):
                pass
        elif plan["phase"] != "fallback" and not self._structural(dist):
            if plan["random"]:
                rng = trial_rng(self._seed, plan["decision"], f"cd:startup:{name}")
                return from_unit(dist, rng.random())
            return from_unit(dist, 0.5)  # a dense knob seen first: the middle of its range
        return self._fallback_value(study, trial, plan, name, dist)

    def _fallback_value(
        self, study: optuna.Study, trial: FrozenTrial, plan: Mapping[str, Any], name: str,
        dist: BaseDistribution,
    ) -> Any:
        if self._fallback is not None:
            return self._fallback.sample_independent(study, trial, name, dist)
        rng = trial_rng(self._seed, plan["decision"], f"cd:fallback:{name}")
        if isinstance(dist, CategoricalDistribution):
            return dist.choices[int(rng.integers(len(dist.choices)))]
        return from_unit(dist, rng.random())




def _prior(entries: list[_Entry], group: list[_Entry], names: list[str]) -> search.Prior:
    """What the other structures say: each dense knob's line moves' effect on the score, and
    the noise of every configuration the study measured more than once."""
    mine = {id(e) for e in group}
    scores = {e.observation.number: e.observation.score for e in entries
              if e.observation.kind == "real"}
    repeats: dict[tuple[tuple[str, Any], ...], list[float]] = {}
    position = {k: i for i, k in enumerate(names)}
    coordinates, changes = [], []
    for entry in entries:
        o = entry.observation
        if o.kind != "real" or o.score is None:
            continue
        repeats.setdefault(entry.config, []).append(o.score)
        attrs = o.user_attrs
        if id(entry) in mine or attrs.get("cd:phase") not in _LINE_PHASES:
            continue
        i = position.get(attrs.get("cd:coordinate"), -1)
        center = scores.get(attrs.get("cd:center"))
        if i >= 0 and center:
            coordinates.append(i)
            changes.append((o.score - center) / abs(center))
    return search.Prior(
        priority=search.largest_change(
            np.array(coordinates, dtype=int), np.array(changes, dtype=float), len(names)
        ),
        noise=prior.relative_noise(repeats.values()),
    )


def _shares(observation: Observation, structure: Mapping[str, Any]) -> bool:
    params = observation.params
    return all(k in params and params[k] == v for k, v in structure.items())


class _Entry:
    """A trial as evidence, with its params as float vectors memoized per coordinate list."""

    __slots__ = ("observation", "config", "_floats", "_vectors")

    def __init__(self, observation: Observation) -> None:
        self.observation = observation
        self.config = tuple(sorted(observation.params.items()))  # groups repeated measurements
        self._floats = {k: _as_float(v) for k, v in observation.params.items()}
        self._vectors: dict[tuple[str, ...], np.ndarray] = {}

    def vector(self, names: tuple[str, ...]) -> np.ndarray:
        vector = self._vectors.get(names)
        if vector is None:
            vector = np.array([self._floats.get(k, math.nan) for k in names], dtype=float)
            self._vectors[names] = vector
        return vector


def _evidence(
    group: list[_Entry], names: list[str], dists: list[BaseDistribution],
    kinds: Mapping[str, int] = _KINDS,
) -> tuple[list[Observation], search.Evidence]:
    """Rows with every coordinate, as unit-cube arrays (vectorized: linear in the history).

    ``kinds`` maps each observation kind to the search's row kind (estimates may count as
    measurements, see ``use_estimates``).
    """
    key = tuple(names)
    raw = np.array([e.vector(key) for e in group], dtype=float).reshape(len(group), len(names))
    points = np.column_stack(
        [_unit_column(dist, raw[:, i]) for i, dist in enumerate(dists)]
    ) if len(group) else raw
    keep = np.all(np.isfinite(points), axis=1)
    rows = [e.observation for e, ok in zip(group, keep, strict=True) if ok]
    points = points[keep]
    index_of = {o.number: r for r, o in enumerate(rows)}
    position = {k: i for i, k in enumerate(names)}
    attrs = [o.user_attrs for o in rows]
    evidence = search.Evidence(
        points=points,
        scores=np.array([np.nan if o.score is None else o.score for o in rows], dtype=float),
        kinds=np.array([kinds[o.kind] for o in rows], dtype=int),
        moved=np.array([search.OFF_AXIS.get(a.get("cd:phase"))
                        or position.get(a.get("cd:coordinate"), -1) for a in attrs], dtype=int),
        centers=np.array([index_of.get(a.get("cd:center"), -1) for a in attrs], dtype=int),
        restarts=np.array([a.get("cd:phase") == "restart" for a in attrs], dtype=bool),
        vertex=np.array([a.get("cd:phase") == "step" for a in attrs], dtype=bool),
        steps=np.array([_as_float(a.get("cd:step", 0.0)) for a in attrs], dtype=float),
    )
    return rows, evidence


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _unit_column(dist: BaseDistribution, values: np.ndarray) -> np.ndarray:
    low, high = float(dist.low), float(dist.high)
    if high == low:
        return np.full(len(values), 0.5)
    if dist.log:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.log(values) - math.log(low)) / (math.log(high) - math.log(low))
    return (values - low) / (high - low)


def _snapper(dists: list[BaseDistribution]) -> search.Snap:
    """Round a unit value to a legal value of its knob and back (ints, steps, bounds)."""

    def snap(i: int, u: float) -> float:
        dist = dists[i]
        value = from_unit(dist, u)
        return float(_unit_column(dist, np.array([float(value)]))[0])

    return snap
