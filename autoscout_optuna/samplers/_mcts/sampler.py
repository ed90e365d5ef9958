"""``MCTSSampler``: the Optuna adapter around the pure tree search in this package."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _validate
from autoscout_optuna._history import (
    decision_number,
    estimate_reliability,
    first_start,
    observation_of,
)
from autoscout_optuna._keys import ORPHANED
from autoscout_optuna._rng import resolve_seed, trial_rng
from autoscout_optuna._space import contains, discrete_values, is_structural, n_levels
from autoscout_optuna._storage import (
    get_fresh_trial,
    get_trials,
    set_user_attr,
    study_id,
)
from autoscout_optuna.samplers._independent import IndependentSampler
from autoscout_optuna.samplers._mcts.descent import TreePolicy
from autoscout_optuna.samplers._mcts.encoding import ORDER_KEY, Table, TableBuilder
from autoscout_optuna.samplers._mcts.estimate import as_estimator
from autoscout_optuna.samplers._mcts.fallback import IncumbentOrUniformSampler
from autoscout_optuna.samplers._mcts.plan import (
    Evidence,
    PlanSettings,
    StructurePlan,
    decide_unplanned,
    gather_evidence,
    make_plan,
)

PATH_KEY = "mcts:path"
UCT_KEY = "mcts:uct"
PHASE_KEY = "mcts:phase"
# {"p_fail": learned failure probability of the path run, "bar": the most it was allowed,
#  "rejected": [[p_fail, bar, path], ...]}.
FEASIBILITY_KEY = "mcts:feasibility"
# System attr a composing sampler may write before the first suggest: {param: value} of the
# non-structural params the trial will take. Then only a trial with the same structure *and*
# those values counts as a repeat (a known structure with new dense values is a new config).
FIXED_KEY = "mcts:fixed"
FALLBACK_PHASE = "fallback"
_MAX_OPEN_RECORDS = 256


@dataclass
class _TrialRecord:
    """Per-trial working memory between the first suggest and ``after_trial``.

    Only a cache: lost (e.g. after unpickling), it is rebuilt from storage on the next call.
    """

    plan: StructurePlan | None = None
    evidence: Evidence | None = None
    scores: dict[str, dict[str, float | None]] = field(default_factory=dict)
    used_fallback: bool = False


class MCTSSampler(IndependentSampler):
    """Monte Carlo tree search over the structural params of a define-by-run space.

    Structural params (categoricals and small discrete domains) are the levels of a tree and a
    trial is a path through it. The tree is rebuilt from the study's trials on every trial: a
    node's statistics are those of the trials that agree with the path to it, so conditional
    knobs are children of the parent value that asks them. Children are chosen by UCB1 on
    rank-normalized rewards, shrunk toward each value's study-wide statistics while a node has
    few visits (RAVE); never-tried values are expanded first. A tournament over level orders
    (feature prioritization) puts the params that explain most of the reward spread at the top,
    never a conditional knob before its parent. FAIL trials penalize their path (and a path
    that would repeat a failed trial's decisions is avoided), PRUNED trials count as
    low-fidelity estimates, RUNNING trials as virtual losses. A logistic model of P(FAIL) over
    the structure, fitted on the trials that failed after asking every param (out of memory and
    the like), re-draws a planned path that is likely to fail (attr ``mcts:feasibility``; the
    bar rises with the path's promise, so a highly rated path may take more risk); a
    monotone rule sharpens it: a path at least as heavy as a known failure along the directions
    the data give each ordinal knob fails, one no heavier than a known success fits. A failure
    whose recorded reason is a broken rule (user attr ``failure_reason`` starting with
    ``invalid`` or ``unsupported``, such as CUDA graphs with ZeRO-3) is read as a rule
    instead: a path that makes every choice two such failures share, where no feasible trial
    made them all, is avoided from then on. With ``memory_model=True``, trials that ran and
    report their peak memory over the device's capacity (user attr ``memory_use``) also teach
    a regression of its log on the structure, whose P(out of memory) raises the path's
    P(FAIL): every run says how far from the memory wall it was, not only the ones that hit
    it. With a ``memory_estimate`` (your memory formula) that regression is fitted to what the
    formula gets wrong instead, and the calibrated formula answers for the out-of-memory failures
    it saw coming in the logistic's place (the others, its blind spots, the logistic keeps):
    near the wall, where the best layouts sit, no additive model of
    past failures can tell the sides apart (``samplers/_mcts/estimate.py``).
    An evaluated configuration is not proposed again.
    A share of trials exploits: greedy along the best result, so the duplicate rule takes a
    local step from the incumbent.

    Dense params (continuous, large ranges) go to ``fallback``.

    Example:
        .. code-block:: python

            import optuna
            from autoscout_optuna import MCTSSampler

            def objective(trial):
                tp = trial.suggest_categorical("tp", [1, 2, 4])
                sp = trial.suggest_categorical("sequence_parallel", [False, True]) if tp > 1 else 0
                mbs = trial.suggest_int("micro_batch", 1, 8)
                return tp * mbs - 3 * (tp * mbs > 16) + int(sp)

            study = optuna.create_study(direction="maximize", sampler=MCTSSampler(seed=0))
            study.optimize(objective, n_trials=30)
            print(study.best_trial.user_attrs["mcts:path"])

    For a composing sampler: pass ``fallback=`` your own dense sampler, and call
    :meth:`propose_structure` to get the structural decisions MCTS would take for a trial
    (the same ones ``sample_independent`` then serves). If your sampler fixes the dense values
    before the first suggest, write them to system attr ``mcts:fixed`` (``{param: value}``):
    a known structure then counts as a repeat only with those same dense values.

    Args:
        seed: Seed; every random choice depends only on (seed, trial number, purpose).
        fallback: Sampler for dense params (``sample_independent`` only). Default:
            reuse the best value seen under the same structure half the time, else uniform.
        exploration: UCB1 exploration constant on rewards in [0, 1].
        rave_equivalence: Node visits at which a node's own statistics and the study-wide
            statistics of the same value weigh the same.
        max_backup: Weight of a child's best reward against its mean reward (we look for the
            best configuration, not the best average).
        rave_visit_share: How much a study-wide visit of a value counts as a visit of the
            node in the exploration bonus (lower: explore values unseen in a node more).
        failure_reward: Reward of a FAIL trial; real rewards are in [0, 1], so below 0.
        estimate_weight: Weight of a PRUNED trial's low-fidelity value, in (0, 1]; scaled by
            how far the pruner's last rank check beats chance (``estimate_reliability``).
        n_orderings: Candidate level orders per tournament.
        tournament_depth: How many top levels an ordering is judged by.
        exploit_probability: Share of trials (after startup) that follow the best result
            greedily instead of UCT: the duplicate rule then changes only the deepest, least
            important decisions of the incumbent, a local step (phase ``"exploit"``).
        feature_prioritization: False keeps the levels in the order the objective asks them
            (no tournament): the ablation of feature prioritization.
        structural: Names of the params to treat as structural (tree levels); None: by
            distribution (``autoscout_optuna._space.is_structural``).
        memory_model: Learn P(out of memory) from the peak memory trials report (user attr
            ``memory_use``, see ``samplers/_mcts/memory.py``). Off by default: in the
            ``autoscout`` benchmark it cut failed runs by a sixth at the same best/optimum at
            100 trials, but past 200 trials on 70B it found less (it can call a layout that
            ran out of memory, when the regression misfits near the wall).
        memory_estimate: ``memory_estimate(params) -> float``: an estimate of a structure's
            peak device memory over the device's capacity (a theoretical memory formula, a
            profiler), given the structure's params (name -> value); None, NaN or an error
            where it has none. It is calibrated on the peaks trials report (user attr
            ``memory_use``) and answers for the out-of-memory failures it saw coming in place
            of the learned models (``samplers/_mcts/estimate.py``); it replaces ``memory_model``.
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
        exploration: float = 0.3,
        rave_equivalence: float = 3.0,
        max_backup: float = 0.0,
        rave_visit_share: float = 0.1,
        failure_reward: float = -0.05,
        estimate_weight: float = 0.5,
        n_orderings: int = 8,
        tournament_depth: int = 2,
        feature_prioritization: bool = True,
        exploit_probability: float = 0.4,
        structural: Container[str] | None = None,
        memory_model: bool = False,
        memory_estimate: Callable[[dict[str, Any]], float | None] | None = None,
    ) -> None:
        _validate.reals(exploration=exploration, rave_equivalence=rave_equivalence,
                        max_backup=max_backup, rave_visit_share=rave_visit_share,
                        failure_reward=failure_reward, estimate_weight=estimate_weight,
                        exploit_probability=exploit_probability)
        _validate.integers(n_orderings=n_orderings, tournament_depth=tournament_depth)
        _validate.booleans(feature_prioritization=feature_prioritization,
                           memory_model=memory_model)
        if structural is not None and (isinstance(structural, str)
                                       or not isinstance(structural, Container)):
            raise TypeError(f"structural must be a collection of param names or None, "
                            f"got {structural!r}")
        _check(exploration >= 0, "exploration", exploration, ">= 0")
        _check(rave_equivalence >= 0, "rave_equivalence", rave_equivalence, ">= 0")
        _check(0 <= exploit_probability <= 1, "exploit_probability", exploit_probability,
               "in [0, 1]")
        _check(0 <= max_backup <= 1, "max_backup", max_backup, "in [0, 1]")
        _check(0 <= rave_visit_share <= 1, "rave_visit_share", rave_visit_share, "in [0, 1]")
        _check(failure_reward < 0, "failure_reward", failure_reward, "< 0")
        _check(0 < estimate_weight <= 1, "estimate_weight", estimate_weight, "in (0, 1]")
        _check(n_orderings >= 1, "n_orderings", n_orderings, ">= 1")
        _check(tournament_depth >= 1, "tournament_depth", tournament_depth, ">= 1")
        if fallback is not None and not isinstance(fallback, BaseSampler):
            raise TypeError(f"fallback must be an optuna BaseSampler, got {type(fallback)}")
        self._seed = resolve_seed(seed)
        self._fallback = fallback or IncumbentOrUniformSampler(seed=self._seed)
        self._structural = structural
        self._settings = PlanSettings(
            policy=TreePolicy(
                exploration=exploration, rave_equivalence=rave_equivalence,
                max_backup=max_backup, rave_visit_share=rave_visit_share,
            ),
            failure_reward=failure_reward,
            estimate_weight=estimate_weight,
            n_orderings=int(n_orderings),
            tournament_depth=int(tournament_depth),
            feature_prioritization=bool(feature_prioritization),
            exploit_probability=float(exploit_probability),
            memory_model=bool(memory_model),
            memory_estimate=as_estimator(memory_estimate),
        )
        # per trial in flight: (study, trial number, start time) -> record; the start time tells
        # a trial of a study recreated under the same name and id (``_trial_key``)
        self._records: OrderedDict[tuple[Any, ...], _TrialRecord] = OrderedDict()
        # cache, equal to a fresh encoding: study -> (start of its trial 0, builder)
        self._builders: dict[tuple[str, int], tuple[Any, TableBuilder]] = {}
        self._lock = threading.Lock()

    # -- pickling: the per-trial records and the lock are a cache, not state ----------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_records"] = OrderedDict()
        state["_builders"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reseed_rng(self) -> None:
        """Forwarded to the fallback; the seed is kept (``_rng``'s module doc)."""
        self._fallback.reseed_rng()

    def is_structural(self, name: str, distribution: BaseDistribution) -> bool:
        """Whether ``name`` is a tree level (else it goes to the dense fallback)."""
        if self._structural is not None:
            return name in self._structural and n_levels(distribution) is not None
        return is_structural(distribution)

    # -- Optuna hooks ----------------------------------------------------------------------

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        _validate.single_objective(study, type(self).__name__)
        if not self.is_structural(param_name, param_distribution):
            self._record(study, trial).used_fallback = True
            return self._fallback.sample_independent(
                study, trial, param_name, param_distribution
            )
        record = self._open_record(study, trial)
        planned = record.plan.values
        if param_name in planned and contains(param_distribution, planned[param_name]):
            record.scores[param_name] = record.plan.scores[param_name]
            return planned[param_name]
        taken = {k: v for k, v in trial.params.items() if k in record.evidence.table.names}
        rng = trial_rng(self._seed, decision_number(study, trial), f"mcts:decide:{param_name}")
        value, score = decide_unplanned(
            record.evidence, param_name, discrete_values(param_distribution), taken, rng,
            self._settings.policy,
        )
        record.scores[param_name] = score
        return value

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Any,
    ) -> None:
        with self._lock:
            record = self._records.pop(_trial_key(study, trial), None)
        self._fallback.after_trial(study, trial, state, values)
        if record is None or (record.plan is None and not record.used_fallback):
            return
        if record.plan is None:
            set_user_attr(study, trial, PHASE_KEY, FALLBACK_PHASE)
            return
        order = record.plan.order + [n for n in record.scores if n not in record.plan.order]
        path = [[name, trial.params[name]] for name in order
                if name in record.scores and name in trial.params]
        phase = record.plan.phase if path else FALLBACK_PHASE
        set_user_attr(study, trial, PATH_KEY, path)
        set_user_attr(study, trial, UCT_KEY, {name: record.scores[name] for name, _ in path})
        set_user_attr(study, trial, ORDER_KEY, order)
        set_user_attr(study, trial, PHASE_KEY, phase)
        if record.plan.feasibility:
            set_user_attr(study, trial, FEASIBILITY_KEY, record.plan.feasibility)

    # -- composition API -------------------------------------------------------------------
    def propose_structure(self, study: optuna.Study, trial: FrozenTrial) -> StructurePlan:
        """The structural decisions MCTS takes for ``trial`` (made once per trial, then served).

        A composing sampler (``AutoScoutSampler``) calls this to see or reuse the structure
        MCTS would explore next; params the objective asks later that the plan does not cover
        are decided on the fly by ``sample_independent``.
        """
        _validate.single_objective(study, type(self).__name__)
        return self._open_record(study, trial).plan

    def _record(self, study: optuna.Study, trial: FrozenTrial) -> _TrialRecord:
        key = _trial_key(study, trial)
        with self._lock:
            record = self._records.get(key)
            if record is None:
                record = self._records[key] = _TrialRecord()
                while len(self._records) > _MAX_OPEN_RECORDS:
                    self._records.popitem(last=False)
        return record

    def _build_table(self, study: optuna.Study, trial: FrozenTrial) -> Table:
        """The history without ``trial``; finished trials are encoded once (see TableBuilder)."""
        direction = study.direction
        finished, pending = [], []
        with self._lock:
            trials = get_trials(study)
            first = first_start(trials)
            key = _study_key(study)
            known = self._builders.get(key)
            if known is None or known[0] != first:  # new, or recreated under its name and id
                known = self._builders[key] = (first, TableBuilder(self.is_structural))
            builder = known[1]
            start = builder.n_settled
            if start > len(trials) or (start and trials[start - 1].number != start - 1):
                start = 0  # not the list we scanned before: look at everything
            settled = start
            for other in trials[start:]:
                number = other.number
                if other.system_attrs.get(ORPHANED):
                    # Failed because its worker died and re-run as a new trial: not evidence.
                    settled += settled == number
                    continue
                if other.state.is_finished():
                    if settled == number:
                        settled += 1
                    if not builder.has(number):
                        finished.append(observation_of(other, direction))
                elif number != trial.number:
                    pending.append(observation_of(other, direction))
            builder.settle(settled)
            return builder.build(finished, pending)

    def _open_record(self, study: optuna.Study, trial: FrozenTrial) -> _TrialRecord:
        record = self._record(study, trial)
        if record.plan is not None:
            return record
        table = self._build_table(study, trial)
        # PRUNED estimates count as much as the pruner's last rank check says they deserve.
        weight = self._settings.estimate_weight * estimate_reliability(study)
        settings = dataclasses.replace(self._settings, estimate_weight=weight)
        evidence = gather_evidence(table, settings)
        number = decision_number(study, trial)
        plan = make_plan(
            evidence,
            trial_rng(self._seed, number, "mcts:order"),
            trial_rng(self._seed, number, "mcts:tree"),
            self._settings,
            fixed=_fixed_values(study, trial),
        )
        # One trial is sampled by one thread; a race would only compute the same plan twice.
        record.evidence, record.plan = evidence, plan
        return record


def _fixed_values(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
    """The trial's ``FIXED_KEY`` (Optuna hands samplers a FrozenTrial read before
    ``before_trial``, so a value written there is read back from storage)."""
    fixed = trial.system_attrs.get(FIXED_KEY)
    if fixed is None:
        try:
            fixed = get_fresh_trial(study, trial).system_attrs.get(FIXED_KEY)
        except (KeyError, AttributeError):
            return None
    return dict(fixed) if isinstance(fixed, dict) else None


def _trial_key(study: optuna.Study, trial: FrozenTrial) -> tuple[Any, ...]:
    """A trial in flight: a trial asked and never told in a study that was then recreated
    under its name (and id) must not hand its plan to the new study's trial of that number."""
    return _study_key(study), trial.number, trial.datetime_start


def _study_key(study: optuna.Study) -> tuple[str, int]:
    """Name and storage id: a study deleted and created again under its name is a new one."""
    return study.study_name, study_id(study)




def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")
