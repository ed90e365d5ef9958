"""AutoScoutSampler: a bandit between exploring structure (MCTS) and refining dense knobs (CD)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _keys, _validate
from autoscout_optuna._history import decision_number, estimate_reliability
from autoscout_optuna._recovery import tag_worker
from autoscout_optuna._rng import resolve_seed, trial_rng
from autoscout_optuna._storage import set_system_attr, set_user_attr
from autoscout_optuna.samplers._autoscout import plan as planning
from autoscout_optuna.samplers._autoscout.bandit import alternate, choose_arm
from autoscout_optuna.samplers._autoscout.history_table import HistoryTable
from autoscout_optuna.samplers._autoscout.reader import HistoryReader
from autoscout_optuna.samplers._autoscout.transplant import PLAN_KEY, PlanCache, TransplantSampler
from autoscout_optuna.samplers._mcts.estimate import MemoryEstimator, as_estimator
from autoscout_optuna.samplers._mcts.sampler import FIXED_KEY as EXPLORE_FIXED_KEY

STARTUP, EXPLORE, NEIGHBOUR, MODEL, REFINE = "startup", "explore", "neighbour", "model", "refine"
CONFIRM = "confirm"  # not an arm: a queued re-run of a config (``autoscout_optuna._confirm``)
STATS_KEY = "autoscout:bandit"
DONOR_KEY = "autoscout:donor"
CONDITIONS_KEY = "autoscout:conditions"
TARGET_KEY = "autoscout:refine_target"
MOVE_KEY = "autoscout:move"
MODEL_KEY = "autoscout:model"
# An explore trial MCTS handed on: the P(FAIL) and bar of the path it would have run.
HANDED_ON_KEY = "autoscout:mcts_spent"
# A structure arm is spent when what it would run is expected to FAIL (step 7 of the class
# docstring): the model arm when its least likely untried structure has at least
# SPENT_P_FAIL (its own bar is 0.2), MCTS when every path it drew is over its bar and the one it
# would run has at least MCTS_SPENT_P_FAIL (MCTS_SPENT_P_FAIL_ESTIMATED with a memory estimate).
SPENT_P_FAIL = 0.3
MCTS_SPENT_P_FAIL = 0.9
# With the user's memory estimate, MCTS's P(FAIL) is mostly the calibrated estimate's P(out of
# memory), and its accepted paths over 0.7 failed 91 % (70B, seeds 120-159, trials after 20),
# while the model arm, checking its candidates against the same estimate, fails 10 %. Not lower:
# from 0.5, the risky paths by the memory wall that only MCTS runs (the model arm's bar is 0.2)
# were handed away, and past 100 trials 70B reached 99 % in 35 of 40 seeds instead of 39
# (session 55). Without the estimate the model arm fails about as often as MCTS there (session
# 45). Numbers: the class docstring, step 7.
MCTS_SPENT_P_FAIL_ESTIMATED = 0.7
# System attr: the sub-sampler that serves the trial's params, where it is not the arm's own
# (start-up trials whose structure MCTS proposes). Absent: the arm's sampler.
SERVED_KEY = "autoscout:served_by"
STARTUP_MODES = ("mcts", "coverage")


class AutoScoutSampler(BaseSampler):
    """Explore structure with MCTS, refine dense knobs with coordinate descent, and let a bandit
    credited by difference-in-differences decide which one proposes each trial.

    Each trial starts (``before_trial``) by reading the whole history from storage:

    1. **Start-up** (the first ``n_startup_trials``): the explore arm's MCTS proposes each
       structure before the bandit decides anything. Its tree tries every untried value of a
       level before any value twice, so the start-up covers the structure space, and it steers
       away from failed prefixes and from structures its feasibility model expects to fail.
       Dense knobs are shared (the centre, then the incumbent's), so structures are compared
       fairly. The dependency tree seen so far is recorded (user attr
       ``autoscout:conditions``). Against blind coverage (``startup="coverage"``: each
       structural param its least-tried value), seeds 40-199, 100 trials: the first 8 trials
       cover as many values per param (3.3 against 3.3 on ``llm_training``, 2.4 on
       ``llm_serving``) and fail less often (8B 58 -> 43 %, 70B 85 -> 72 %, serving 75 ->
       45 %); paired best/optimum at 20 trials +0.018 / +0.043 / +0.068 (8B / 70B / serving),
       at 100 trials +0.005 / +0.004 / +0.010.
    2. **Bandit** over the arms that have something to decide: ``explore``
       (:class:`~autoscout_optuna.MCTSSampler`; its dense knobs get the incumbent's values, so
       a new structure starts from the best dense setting known) and ``refine``
       (:class:`~autoscout_optuna.CoordinateDescentSampler` on one structure, handed over in
       system attr ``autoscout:structure``; it takes PRUNED estimates as measurements while
       the pruner finds the simulator close to real runs, see its ``use_estimates``);
       ``model`` (step 6: the untried structure a Thompson draw of a log-additive model of
       all scores ranks first (one only estimated, fewer than three times, counts as
       untried: one noisy look does not write it off; for a simulator that repeats itself,
       only where those estimates had other dense values than the trial's; an estimate the
       pruner judged measurement-grade counts like a real run), among those
       MCTS's feasibility model does not expect to fail:
       :mod:`~autoscout_optuna.samplers._autoscout.surrogate`); optionally
       ``neighbour`` (the incumbent's structure with one structural param changed). Each
       finished trial rewards its arm by difference-in-differences
       (:mod:`~autoscout_optuna.samplers._autoscout.did`)::

           did(t) = (y_t - y*) - (y_c - y*) = y_t - y_c
           r_t    = tanh(max(did(t) - noise, 0) / (0.1 * s))

       with ``y*`` the incumbent, ``s`` the spread of scores, ``noise`` the measurement noise
       seen on repeated configs, and the control ``y_c`` the incumbent structure at a
       comparable stage of dense tuning: its *first* evaluation for a new structure (stage 0
       against stage 0), the structure's own best for a refinement step, the incumbent for an
       explore trial on a known structure (it carries the incumbent's dense values). FAIL
       scores -0.02 (MCTS itself steers away from failing subtrees; a larger penalty starved
       exploration); PRUNED trials (step-0 estimates) count with weight
       ``estimate_weight``; RUNNING trials count as pulls at the arm's mean. Discounted
       Thompson sampling with a floor picks the arm
       (:mod:`~autoscout_optuna.samplers._autoscout.bandit`).
    3. **Refine target**: structures ranked by potential ``b(s) + max(0, gain(s*) - gain(s)
       - 2 noise)`` (``b`` = a structure's best real score less the luck a best of its
       near-best measurements carries, ``noise * E[max of n standard normals]``; ``gain`` = b
       minus first score; ``s*`` the incumbent structure): a structure that beat the incumbent
       at a comparable stage gets dense tuning too, instead of being judged against a tuned
       incumbent, and a structure measured once is not ranked below one whose best is the
       luckiest of many draws. The first of the top ``3`` (within
       a reward scale of the incumbent) that has not used its patience is refined, so a close
       runner-up is tuned before it is written off (attr ``autoscout:refine_target``: rank,
       stale count, patience, potential).
    4. **Patience**: a structure is tuned out after ``5`` refinements per dense knob without a
       gain beyond the noise; once all the top structures are, refine is off the table (reason
       recorded) until a target or its best changes, unless every recent structure proposal
       failed. With no feasible trial after start-up, MCTS (which learns which structures
       fail) explores instead of coverage.
    5. **Structure first**: the refine arm opens only once the structure in the lead has held
       against ``10`` finished structure proposals (start-up, explore, neighbour, model trials;
       failed ones count; fewer where the space has fewer other structures), and closes again
       when a proposal puts a new structure in the lead, unless every recent proposal failed.
       Dense tuning of a structure that is about to be overtaken is wasted, and refinement
       trials crowd out the exploration that decides the structure, the knobs with the larger
       effect (seeds 0-79, 100 trials: best/optimum at 20 trials +0.012 / +0.017 / +0.031 on
       ``llm_training`` 8B / 70B and ``llm_serving``, at 100 trials within the noise).
    6. **The model arm**: it joins the bandit as soon as there is an incumbent, without a
       floor share (it runs only when its Thompson draw wins). MCTS moves one decision at a
       time from what it knows and coordinate descent one knob, so both stall below a
       structure that needs two or three changes at once (``llm_training`` 70B: tp 4 with
       micro-batch 1 and selective recompute, where each change alone is slower or runs out
       of memory; 8B: tp 1 with micro-batch 1 and ZeRO 2, where tp 1 alone runs out of
       memory); the model ranks whole structures. Against the earlier gate (open only once the
       lead structure had held against 30 structure proposals and the refine arm had tuned out
       its targets), 100 trials, paired best/optimum at trial 100 (8B / 70B / serving): seeds
       0-159 +0.015 +- 0.008 / +0.017 +- 0.011 / -0.003 +- 0.008, confirmed on the held-out
       seeds 160-239 +0.014 +- 0.011 / +0.027 +- 0.015 / -0.003 +- 0.012; FAIL trials per
       seed after trial 20 +2.0 / +0.9 / -0.2 (seeds 0-159). Open from the start *with* the
       floor (30 % of recent trials, as the other arms), 8B gained only +0.005 and serving
       lost 0.008: the floor took its trials from dense tuning. ``model_after`` > 0 restores
       the gate. A structural choice no scored trial made (on 8B, tp 1 while every tp 1 trial
       ran out of memory beside a micro-batch above 1) is drawn as good as its param's best
       made choice, not as the average structure (``surrogate.optimistic_unseen``): failures
       are evidence for the feasibility bar, not against speed. Seeds 0-159, 100 trials,
       paired at trial 100 (8B / 70B / serving): +0.004 +- 0.005 / +0.002 +- 0.008 / -0.006 +-
       0.007, seeds at 99 % 29 -> 41 / 31 -> 38 of 160 (8B: 20 seeds gained it, 8 lost it);
       8B at trial 20 -0.011 +- 0.009; FAIL trials per seed unchanged.
    7. **Spent structure arms hand their trial on**: a structure arm whose best option is
       expected to fail does not run it where another arm can take the trial. MCTS is spent
       when every path it drew is over its P(FAIL) bar and the one it would run has
       P(FAIL) >= ``MCTS_SPENT_P_FAIL`` (0.9: at least as heavy as a known failure, or
       nearly): the model arm takes the trial, or refine where the model arm is spent too.
       The model arm is spent when its least likely untried structure has P(FAIL) >=
       ``SPENT_P_FAIL`` (0.3; its own bar is 0.2): refine takes the trial. Past trial 200 of
       500, MCTS had run 35 / 46 / 47 paths over its bar per seed (8B / 70B / serving, 8
       seeds), 91 / 95 / 94 % of them FAILed. With the hand-over, seeds 0-15, 500 trials:
       FAIL trials per seed after trial 20 79.4 -> 56.9 / 102.9 -> 87.6 / 88.7 -> 31.8,
       best/optimum at 500 trials +0.001 +- 0.004 / +0.008 +- 0.014 / +0.002 +- 0.008 (paired;
       at 100 trials, seeds 0-79, it rarely acts: 0.000 / -0.001 / -0.000). Handing both arms'
       trials to refine failed less (45 / 78 / 38) but 8B reached 99 % in 8 of 16 seeds
       instead of 13 (the model arm's structures are where 8B gains late); handing on every
       MCTS path over its bar, whatever its P(FAIL), cost 70B 0.016 at 20 trials (early, a
       third of those paths run). With a ``memory_estimate`` MCTS is spent from P(FAIL)
       ``MCTS_SPENT_P_FAIL_ESTIMATED`` (0.7) on: such paths nearly always fail, and the model
       arm, checking its candidates against the same calibrated estimate, fails less often.
       Against 0.9 (100 trials, paired): FAIL trials per seed after trial 20 4.4 -> 3.9 /
       8.7 -> 7.9 (8B / 70B, seeds 120-239) and 4.4 -> 3.9 / 8.8 -> 7.7 (seeds 240-479),
       best/optimum -0.000 +- 0.000 / +0.001 +- 0.003 and +0.000 +- 0.001 / -0.000 +- 0.002,
       seeds at 99 % 46 -> 46 / 84 -> 85 and 99 -> 100 / 160 -> 162; 70B over 500 trials
       (``autoscout-long``) FAIL 35.8 -> 31.3 per seed, 99 % in 39 of 40 seeds as before.
       Without any other arm the least likely structure still runs (a prediction never closes
       the only route).

    Every hook and ``reseed_rng`` is forwarded to the chosen sub-sampler; the arm is read back
    from the trial's attrs, so any worker can run any hook. Decisions are recorded as user
    attrs ``autoscout:arm``, ``autoscout:reason``, ``autoscout:bandit``, ``autoscout:donor``,
    ``autoscout:refine_target``, ``autoscout:move`` and ``autoscout:model`` (see
    :func:`autoscout_optuna.decisions_table`). No state lives outside storage: all of it is
    rebuilt from the trials, and randomness comes from (seed, trial number).

    Example:

        .. testcode::

            import optuna
            from autoscout_optuna import AutoScoutSampler

            def objective(trial):
                layout = trial.suggest_categorical("layout", ["a", "b"])
                x = trial.suggest_float("x", -5, 5)
                return (x - 1) ** 2 + (0 if layout == "b" else 3)

            study = optuna.create_study(sampler=AutoScoutSampler(seed=0))
            study.optimize(objective, n_trials=30)

    Args:
        seed: Seed of every random choice (None: random).
        n_startup_trials: Start-up trials before the bandit decides (step 1).
        startup: ``"mcts"`` (MCTS proposes the start-up structures, step 1) or
            ``"coverage"`` (the ablation: each structural param takes its least-tried value,
            blind to failures).
        policy: ``"thompson"`` (the bandit) or ``"alternate"`` (ablation: fixed alternation).
        reward: ``"did"`` (difference-in-differences) or ``"naive"`` (ablation: difference to
            the incumbent).
        dense_optimizer: False for the ablation without the ``refine`` arm (dense knobs then
            keep the incumbent's values, i.e. the centre of their domains).
        feature_prioritization: False for the ablation without MCTS's tournament over level
            orders (needs an :class:`~autoscout_optuna.MCTSSampler` with that option).
        estimate_weight: Weight of a PRUNED trial's step-0 estimate relative to a real value:
            in the bandit's credit and MCTS's statistics scaled by how well the pruner's last
            rank check says the simulator orders configs
            (:func:`~autoscout_optuna._history.estimate_reliability`), in the model arm's
            regression as given (scaled there too, the fidelity suite's 20 % noise training
            study reached 99 % in 3 of 16 seeds instead of 8).
        floor: Minimum share of the last 20 trials each arm but the model arm gets (at most
            ``1 / those arms``). 0.3
            rather than 0.1 (seeds 0-119, 100 trials, paired best/optimum at 100 trials):
            ``llm_serving`` +0.016, 8B +0.013, 70B +0.004: once the structure search settles
            (step 5), dense tuning keeps a share of the trials (on serving the bandit had
            given it less than it earns: fixed alternation, half the trials, did better).
        discount: Per-trial discount of old rewards.
        neighbour_arm: Add the ``neighbour`` arm (one structural change of the incumbent).
        model_arm: False for the ablation without the ``model`` arm (step 6).
        model_after: 0 (the default) opens the model arm as soon as there is an incumbent;
            more: only once the lead structure has held against that many structure
            proposals and the refine arm has tuned out its targets (step 6).
        explore_sampler: Replaces the MCTS arm, start-up included (its dense knobs are its
            own business then).
        refine_sampler: Replaces the coordinate-descent arm.
        memory_model: MCTS and the model arm also learn P(out of memory) from the peak memory
            trials report (user attr ``memory_use``; see
            :class:`~autoscout_optuna.MCTSSampler`). Off by default (session 28: a sixth fewer
            failed runs at 100 trials, less found on 70B past 200 trials).
        memory_estimate: ``memory_estimate(params) -> float``: your estimate of a structure's
            peak memory over capacity (a theoretical memory formula), given its structural
            params; MCTS and the model arm calibrate it on the peaks trials report and let it
            answer for out-of-memory failures (:class:`~autoscout_optuna.MCTSSampler`,
            ``samplers/_mcts/estimate.py``). On ``llm_training`` with the study's formula
            (``autoscout`` suite, row ``variant: memory estimate``, seeds 0-39, 100 trials):
            median best/optimum 0.978 -> 0.9893 (8B) and 0.904 -> 0.992 (70B), FAIL trials
            per seed after trial 20 11.8 -> 4.1 and 17.0 -> 7.6. MCTS then hands its trial
            on from P(FAIL) 0.7 (step 7).
    """

    # Decisions depend only on (seed, decision number, non-orphaned history): after a worker
    # dies, the next trial re-proposes the orphan's configuration (see ``_recovery``).
    reproposes_orphans = True

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = 8,
        startup: str = "mcts",
        policy: str = "thompson",
        reward: str = "did",
        dense_optimizer: bool = True,
        feature_prioritization: bool = True,
        estimate_weight: float = 0.5,
        floor: float = 0.3,
        discount: float = 0.95,
        neighbour_arm: bool = False,
        model_arm: bool = True,
        model_after: int = 0,
        explore_sampler: BaseSampler | None = None,
        refine_sampler: BaseSampler | None = None,
        memory_model: bool = False,
        memory_estimate: Callable[[dict[str, Any]], float | None] | None = None,
    ) -> None:
        _validate.reals(estimate_weight=estimate_weight, floor=floor, discount=discount)
        _validate.booleans(dense_optimizer=dense_optimizer, neighbour_arm=neighbour_arm,
                           model_arm=model_arm, feature_prioritization=feature_prioritization,
                           memory_model=memory_model)
        _validate.optional_samplers(explore_sampler=explore_sampler,
                                    refine_sampler=refine_sampler)
        if isinstance(n_startup_trials, bool) or not isinstance(n_startup_trials, int):
            raise TypeError("n_startup_trials must be an int")
        if n_startup_trials < 0:
            raise ValueError(f"n_startup_trials must be >= 0, got {n_startup_trials}")
        _validate.integers(model_after=model_after)
        if model_after < 0:
            raise ValueError(f"model_after must be >= 0, got {model_after}")
        if startup not in STARTUP_MODES:
            raise ValueError(f"startup must be 'mcts' or 'coverage', got {startup!r}")
        if policy not in ("thompson", "alternate"):
            raise ValueError(f"policy must be 'thompson' or 'alternate', got {policy!r}")
        if reward not in ("did", "naive"):
            raise ValueError(f"reward must be 'did' or 'naive', got {reward!r}")
        if not 0.0 <= estimate_weight <= 1.0:
            raise ValueError(f"estimate_weight must be in [0, 1], got {estimate_weight}")
        if not 0.0 <= floor <= 0.5:
            raise ValueError(f"floor must be in [0, 0.5], got {floor}")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount}")
        self._seed = resolve_seed(seed)
        self._n_startup = n_startup_trials
        self._startup_mode = startup
        self._policy = policy
        self._reward = reward
        self._dense_optimizer = dense_optimizer
        self._neighbour_arm = neighbour_arm
        self._model_arm = model_arm
        self._model_after = int(model_after)
        self._memory_model = memory_model
        self._memory_estimate = as_estimator(memory_estimate)
        self._estimate_weight = estimate_weight
        self._floor = floor
        self._discount = discount
        self._cache = PlanCache()
        self._reader = HistoryReader()
        # The model arm's table of the history (a cache; see ``plan.model_proposal``).
        self._model_table = HistoryTable()
        self._startup = TransplantSampler(seed=self._derive("startup"), cache=self._cache)
        # Both sub-samplers hand the knobs they do not decide to a TransplantSampler, which
        # plays this trial's plan (the incumbent's dense values: see transplant.py).
        mcts_fallback = TransplantSampler(seed=self._derive("mcts-dense"), cache=self._cache)
        cd_fallback = TransplantSampler(seed=self._derive("cd-rest"), cache=self._cache)
        self._explore = explore_sampler or _build_mcts(
            self._derive("mcts"), mcts_fallback, feature_prioritization, memory_model,
            self._memory_estimate,
        )
        self._refine = refine_sampler or _build_coordinate(self._derive("coordinate"), cd_fallback)

    def _derive(self, purpose: str) -> int:
        return int(trial_rng(self._seed, 0, purpose).integers(2**31))

    def _arm_sampler(self, arm: str) -> BaseSampler:
        return {EXPLORE: self._explore, REFINE: self._refine}.get(arm, self._startup)

    def reseed_rng(self) -> None:
        """Forwarded to the sub-samplers; the seed is kept (``_rng``'s module doc)."""
        for sampler in (self._startup, self._explore, self._refine):
            sampler.reseed_rng()

    # -- the decision -------------------------------------------------------------------------

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if len(study.directions) > 1:
            return  # the sample hooks raise the ValueError users see
        # Who runs this trial: if that process dies, a resume fails and re-queues the trial.
        tag_worker(study, trial)
        confirms = trial.user_attrs.get(_keys.CONFIRMS)
        if confirms is not None:
            self._confirm(study, trial, confirms)
            return
        number = decision_number(study, trial)
        history, digest, pending = self._reader.read_with_pending(study, exclude=trial)
        space = planning.observed_space(pending, digest)
        incumbent = digest.incumbent()
        moves: list[tuple[str, Any]] = []
        if self._neighbour_arm and incumbent is not None and len(history) >= self._n_startup:
            moves = planning.untried_neighbours(history, space, incumbent)
        choice = planning.refine_choice(pending, digest, space, estimator=self._reward)
        can_model = self._model_open(history, digest, space, choice, incumbent)
        arm, reason, extra = self._decide(
            study, history, pending, digest, space, number, bool(moves), choice, can_model
        )
        can_refine = bool(space.dense) and self._dense_optimizer and choice is not None
        mcts_spent = ""
        explore_plan = None  # an explore trial's plan, made (and its dense values told) once
        if arm == EXPLORE and (can_model or can_refine):
            explore_plan = self._plan(history, digest, space, incumbent, number, EXPLORE)
            self._fix_explore_dense(study, trial, explore_plan, space)
            over = self._mcts_over_the_bar(study, trial)
            if over is not None:
                mcts_spent = (f"MCTS spent: every path it drew is over its P(FAIL) bar "
                              f"({over['p_fail']:.2f} > {over['bar']:.2f})")
                arm = MODEL if can_model else REFINE
                reason = f"{mcts_spent}; {arm}"
                set_user_attr(study, trial, HANDED_ON_KEY,
                              {"p_fail": over["p_fail"], "bar": over["bar"]})
        proposal = None
        if arm == MODEL:
            # Proposed only once chosen: scoring the candidates is the arm's whole cost.
            rng = trial_rng(self._seed, number, "model")
            proposal = planning.model_proposal(history, space, rng, self._model_table,
                                               memory_model=self._memory_model,
                                               memory_estimate=self._memory_estimate,
                                               estimate_weight=self._estimate_weight,
                                               dense=planning.donor_dense_values(
                                                   digest, space, incumbent))
            model_spent = proposal is not None and proposal.p_fail >= SPENT_P_FAIL
            prefix = f"{mcts_spent}; " if mcts_spent else ""
            if (proposal is None and mcts_spent or model_spent) and can_refine:
                why = ("no untried structure among its candidates" if proposal is None else
                       f"its least likely untried structure has P(FAIL) {proposal.p_fail:.2f}")
                arm, reason, proposal = REFINE, f"{prefix}model arm spent: {why}; refine", None
            elif proposal is None:
                arm = EXPLORE
                reason = f"{prefix}model arm: no untried structure among its candidates; MCTS"
            else:
                set_user_attr(study, trial, MODEL_KEY, {"structure": proposal.values,
                                                        **proposal.as_dict()})
        move = None
        if arm == NEIGHBOUR:
            # The best-ranked move, with a random one now and then so ranking errors heal.
            rng = trial_rng(self._seed, number, "neighbour")
            ranked = planning.rank_moves(history, moves)
            move = ranked[0] if rng.random() < 0.8 else ranked[int(rng.integers(len(ranked)))]
            set_user_attr(study, trial, MOVE_KEY, list(move))
        served = self._served_by(arm, space)
        if arm == EXPLORE and explore_plan is not None:
            plan = explore_plan  # still an explore trial: the plan MCTS was told above
        else:
            plan = self._plan(history, digest, space, incumbent, number, served, move=move,
                              proposal=proposal)
            if served == EXPLORE:
                self._fix_explore_dense(study, trial, plan, space)
        set_user_attr(study, trial, _keys.ARM, arm)
        set_user_attr(study, trial, _keys.REASON, reason)
        if extra:
            set_user_attr(study, trial, STATS_KEY, extra)
        if incumbent is not None and arm != REFINE:
            set_user_attr(study, trial, DONOR_KEY, incumbent.number)
        if arm == REFINE and choice is not None:
            structure, why = planning.refine_target(choice, digest, space)
            set_system_attr(study, trial, _keys.STRUCTURE, structure)
            set_user_attr(study, trial, TARGET_KEY, why)
        if number == self._n_startup and history:
            conditions = planning.conditions(history, space)
            set_user_attr(study, trial, CONDITIONS_KEY, conditions)
        set_system_attr(study, trial, PLAN_KEY, plan)
        if served != arm:
            set_system_attr(study, trial, SERVED_KEY, served)
        self._cache.store(trial, PLAN_KEY, plan)
        self._cache.store(trial, _keys.ARM, arm)
        self._cache.store(trial, SERVED_KEY, served)
        self._arm_sampler(served).before_trial(study, trial)

    def _confirm(self, study: optuna.Study, trial: FrozenTrial, confirms: Any) -> None:
        """A queued re-run of a config (``autoscout_optuna._confirm``): no search decision to
        take, and none to credit; the bandit counts only its own arms (``plan.ARMED``)."""
        set_user_attr(study, trial, _keys.ARM, CONFIRM)
        set_user_attr(study, trial, _keys.REASON, f"re-runs trial #{confirms}'s config")
        self._cache.store(trial, _keys.ARM, CONFIRM)
        self._startup.before_trial(study, trial)

    def _fix_explore_dense(
        self, study: optuna.Study, trial: FrozenTrial, plan: dict[str, Any],
        space: planning.ObservedSpace,
    ) -> None:
        """Tell MCTS the dense values its trial runs with (``plan``'s): it then avoids only
        structures already run with these very values. A known structure with the incumbent's
        newer dense values is a new configuration (and often a good one), while the exact
        repeat would waste the trial."""
        dense = {n: v for n, v in plan["values"].items() if n in space.dense}
        set_system_attr(study, trial, EXPLORE_FIXED_KEY, dense)

    def _plan(
        self, history: Sequence[Any], digest: Any, space: planning.ObservedSpace,
        incumbent: Any, number: int, served: str, *, move: tuple[str, Any] | None = None,
        proposal: planning.Proposal | None = None,
    ) -> dict[str, Any]:
        """The trial's plan for the sampler that serves it (a pure function of the history
        and the trial number, so a resumed study or a second worker makes the same one)."""
        return planning.make_plan(
            history, digest, space, incumbent, startup=served == STARTUP,
            rng=trial_rng(self._seed, number, "startup-coverage"), move=move,
            structure=None if proposal is None else proposal.values,
        )

    def _mcts_over_the_bar(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, Any] | None:
        """MCTS's feasibility record of the plan it would explore in ``trial`` where every path
        it drew was over its P(FAIL) bar and the one it would run has at least
        ``MCTS_SPENT_P_FAIL`` (``MCTS_SPENT_P_FAIL_ESTIMATED`` with a memory estimate); None
        otherwise, or for an explore sampler that does not say.

        MCTS must have been told the trial's dense values (``_fix_explore_dense``): the plan it
        proposes here is the one it serves if the trial stays an explore trial."""
        propose = getattr(self._explore, "propose_structure", None)
        if propose is None:
            return None
        feasibility = getattr(propose(study, trial), "feasibility", None) or {}
        p_fail, bar = feasibility.get("p_fail"), feasibility.get("bar")
        spent = MCTS_SPENT_P_FAIL if self._memory_estimate is None else MCTS_SPENT_P_FAIL_ESTIMATED
        if p_fail is None or bar is None or p_fail <= bar or p_fail < spent:
            return None
        return feasibility

    def _served_by(self, arm: str, space: planning.ObservedSpace) -> str:
        """The arm whose sampler serves a trial of ``arm``: start-up structures come from MCTS
        (``startup="mcts"``) once there is a structural param to decide."""
        if arm == STARTUP and self._startup_mode == "mcts" and space.structural:
            return EXPLORE
        return arm

    def _model_open(
        self, history: Sequence[Any], digest: Any, space: planning.ObservedSpace,
        choice: planning.RefineChoice | None, incumbent: Any,
    ) -> bool:
        """Whether the model arm may propose (step 6 of the class docstring)."""
        if not self._model_arm or incumbent is None or len(history) < self._n_startup:
            return False
        if self._model_after == 0:
            return True
        if not planning.structure_settled(history, self._model_after,
                                          best=digest.best.get("real")):
            return False
        refining = bool(space.dense) and self._dense_optimizer and choice is not None
        return not refining or choice.stale >= choice.patience

    def _decide(
        self, study: optuna.Study, history: Sequence[Any], running: Sequence[Any], digest: Any,
        space: planning.ObservedSpace, number: int, has_neighbours: bool,
        choice: planning.RefineChoice | None, can_model: bool,
    ) -> tuple[str, str, dict[str, Any]]:
        started = len(history)
        if started < self._n_startup:
            how = "MCTS proposes the structure" if self._served_by(STARTUP, space) == EXPLORE \
                else "coverage"
            return STARTUP, f"start-up {started + 1}/{self._n_startup}: {how}", {}
        if digest.incumbent() is None:
            if space.structural:
                # Coverage draws each param on its own, blind to what failed; MCTS avoids the
                # prefixes and the structures its feasibility model learned to fail.
                return EXPLORE, "no feasible trial yet: MCTS, steering away from failures", {}
            return STARTUP, "no feasible trial yet: keep covering the structure space", {}
        available = (
            (EXPLORE, bool(space.structural)),
            (NEIGHBOUR, has_neighbours),
            (MODEL, can_model and bool(space.structural)),
            (REFINE, bool(space.dense) and self._dense_optimizer),
        )
        arms = [a for a, ok in available if ok]
        if not arms:
            return EXPLORE, "no params seen yet", {}
        if len(arms) == 1:
            return arms[0], f"only arm with params to decide: {arms[0]}", {}
        if self._policy == "alternate":
            arm, reason = alternate(arms, started - self._n_startup)
            return arm, reason, {}
        # Dense tuning waits until the lead structure has held against a few proposals (unless
        # every recent proposal failed: then refining is the better use of a trial).
        best = digest.best.get("real")
        settle = planning.settle_proposals(space)
        refine_off = ""  # why refine is not among the arms, said in the reason either way
        if REFINE in arms and not planning.structure_settled(history, settle, best=best) \
                and planning.exploring_succeeds(history):
            arms.remove(REFINE)
            refine_off = (f"structure search not settled (the lead structure has held "
                          f"against fewer than {settle} proposals)")
        if REFINE in arms and choice is not None:
            stale, patience = choice.stale, choice.patience
            # Stop refining once the top structures are tuned out, unless every recent
            # structure proposal failed: then refining, even without gains, is the better use
            # of a trial.
            if stale >= patience and planning.exploring_succeeds(history):
                arms.remove(REFINE)
                refine_off = (f"refine target gained nothing in {stale} refinements "
                              f"(patience {patience})")
        if refine_off and len(arms) == 1:
            return arms[0], f"{refine_off}: {arms[0]}", {}
        # PRUNED estimates count as much as the pruner's last rank check says they deserve.
        weight = self._estimate_weight * estimate_reliability(study)
        pulls, pending, recent = planning.bandit_evidence(
            history, digest, reward=self._reward, estimate_weight=weight, running=running
        )
        rng = trial_rng(self._seed, number, "bandit")
        # The model arm has no floor: it runs when its draw wins (step 6 of the docstring).
        floored = [a for a in arms if a != MODEL]
        arm, reason, stats = choose_arm(
            arms, pulls, rng, pending=pending, recent=recent,
            floor=min(self._floor, 1.0 / max(len(floored), 1)),
            discount=self._discount, unfloored=(MODEL,),
        )
        if refine_off:
            reason = f"{reason}; no refine: {refine_off}"
        return arm, reason, {a: s.as_dict() for a, s in stats.items()}

    # -- forwarding ---------------------------------------------------------------------------

    def _chosen(self, study: optuna.Study, trial: FrozenTrial) -> BaseSampler:
        _validate.single_objective(study, type(self).__name__)
        served = self._cache.lookup(study, trial, SERVED_KEY)
        arm = served or self._cache.lookup(study, trial, _keys.ARM)
        return self._arm_sampler(arm or STARTUP)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._chosen(study, trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._chosen(study, trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        sampler = self._chosen(study, trial)
        return sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        if len(study.directions) == 1:
            self._chosen(study, trial).after_trial(study, trial, state, values)
        self._cache.forget(trial)


def _build_mcts(
    seed: int, fallback: BaseSampler, feature_prioritization: bool, memory_model: bool = False,
    memory_estimate: MemoryEstimator | None = None,
) -> BaseSampler:
    from autoscout_optuna.samplers._mcts.sampler import MCTSSampler

    options: dict[str, Any] = {"seed": seed, "fallback": fallback, "memory_model": memory_model,
                               "memory_estimate": memory_estimate}
    if _accepts(MCTSSampler, "feature_prioritization"):
        options["feature_prioritization"] = feature_prioritization
    elif not feature_prioritization:
        raise ValueError(
            "feature_prioritization=False needs an MCTSSampler with a feature_prioritization "
            "option; this one has none"
        )
    return MCTSSampler(**options)


def _build_coordinate(seed: int, fallback: BaseSampler) -> BaseSampler:
    from autoscout_optuna.samplers._coordinate.sampler import CoordinateDescentSampler

    # Without headroom: on llm_serving the orchestrator's dense arm then stays on its best
    # goodput plateau (best/optimum at 100 trials, 10 seeds: median 0.90 without, 0.87 with).
    # Confidence 2 (the standalone default is 1.75): a refine gets a few trials per structure,
    # and a center moved on a smaller margin is more often noise (autoscout suite @100, 10
    # seeds: 8B 0.973 -> 0.976, 70B 0.889 -> 0.900, serving 0.902 -> 0.906).
    return CoordinateDescentSampler(seed=seed, fallback=fallback, headroom=False, confidence=2.0)


def _accepts(cls: type, name: str) -> bool:
    parameters = inspect.signature(cls.__init__).parameters
    return name in parameters
