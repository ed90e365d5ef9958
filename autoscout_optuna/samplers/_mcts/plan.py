"""From the history table to the structural decisions of one trial (no Optuna objects here).

A plan is made once per trial: rewards are normalized, dependencies learned, the tournament
picks the level order, and the tree is descended in that order. Params the plan does not cover
(new ones, or ones whose domain changed) are decided when the objective asks them, by the same
UCT rule at the node the trial has actually reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autoscout_optuna.samplers._mcts.descent import Step, TreePolicy, plan_path
from autoscout_optuna.samplers._mcts.encoding import Table, value_key
from autoscout_optuna.samplers._mcts.estimate import MemoryEstimator
from autoscout_optuna.samplers._mcts.feasibility import fit_feasibility, numeric_values
from autoscout_optuna.samplers._mcts.tournament import (
    Dependencies,
    candidate_orders,
    learn_dependencies,
    run_tournament,
    topological_order,
)
from autoscout_optuna.samplers._mcts.tree import (
    ABSENT,
    ESTIMATE,
    FAILED,
    PENDING,
    REAL,
    child_scores,
    node_rows,
    normalize_rewards,
    pick,
)

STARTUP, UCT, EXPLOIT = "startup", "uct", "exploit"


@dataclass(frozen=True)
class StructurePlan:
    """The structural decisions MCTS takes for one trial.

    Attributes:
        values: ``{param: value}`` in tree order (the top level first).
        order: Every known structural param in the level order the tournament chose.
        scores: ``{param: {"uct", "value", "visits"}}`` of each chosen child (``uct`` is None
            for an untried child, which is expanded first).
        phase: ``"startup"`` (too little history for a tournament: ask order) or ``"uct"``.
        feasibility: ``{"p_fail": ..., "bar": ..., "rejected": [[p_fail, bar, {param: value}],
            ...]}``: the learned failure probability of the plan, the most it was allowed
            (:func:`fail_bar`), and the paths re-drawn before it with theirs; with
            ``memory_model`` on and trials reporting their peak memory, or a
            ``memory_estimate``, also ``"memory_use"``: the plan's predicted peak over
            capacity (``memory.py``, ``estimate.py``).
    """

    values: dict[str, Any]
    order: list[str]
    scores: dict[str, dict[str, float | None]]
    phase: str
    feasibility: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanSettings:
    """Tuning constants of the planner (see ``MCTSSampler`` for their meaning)."""

    policy: TreePolicy = field(default_factory=TreePolicy)
    failure_reward: float = -0.05
    estimate_weight: float = 0.5
    n_orderings: int = 8
    tournament_depth: int = 2
    min_tournament_rows: int = 8
    feature_prioritization: bool = True
    exploit_probability: float = 0.4
    max_fail_probability: float = 0.3
    fail_promise_slack: float = 0.3
    max_redraws: int = 8
    memory_model: bool = False
    memory_estimate: MemoryEstimator | None = None


@dataclass(frozen=True)
class Evidence:
    """What a plan was made from, kept to decide unplanned params the same way."""

    table: Table
    rewards: np.ndarray
    weights: np.ndarray


def gather_evidence(table: Table, settings: PlanSettings) -> Evidence:
    rewards, weights = normalize_rewards(
        table.scores, table.kinds, failure_reward=settings.failure_reward,
        estimate_weight=settings.estimate_weight,
    )
    return Evidence(table, rewards, weights)


def choose_order(
    evidence: Evidence, rng: np.random.Generator, settings: PlanSettings
) -> tuple[list[int], str, dict[int, dict[int, frozenset[int]]]]:
    """The level order (column indices), the phase, and the learned inactivity map."""
    table = evidence.table
    n_columns = len(table.names)
    dependencies = learn_dependencies_of(table)
    finished = np.array([kind != PENDING for kind in table.kinds], dtype=bool)
    startup = finished.sum() < settings.min_tournament_rows
    if startup or n_columns <= 1 or not settings.feature_prioritization:
        ask_order = topological_order(
            n_columns, dependencies.must_follow, [-r for r in table.ask_rank]
        )
        return ask_order, STARTUP if startup else UCT, dependencies.inactive_under
    codes = table.codes[finished]
    rewards = evidence.rewards[finished]
    weights = evidence.weights[finished]
    previous = None
    if table.previous_order:
        previous = [c for c in map(table.column_of, table.previous_order) if c is not None]
    candidates = candidate_orders(
        codes, rewards, weights, dependencies, table.ask_rank, previous, rng,
        settings.n_orderings,
    )
    winner, _ = run_tournament(
        codes, rewards, weights, candidates, rng, depth=settings.tournament_depth
    )
    return candidates[winner], UCT, dependencies.inactive_under


def learn_dependencies_of(table: Table) -> Dependencies:
    """Dependencies from finished rows; failed rows count only where they skipped a param."""
    if table.dependencies is not None:
        return table.dependencies  # learned as the rows came in
    finished = np.array([kind != PENDING for kind in table.kinds], dtype=bool)
    complete = np.array([kind in (REAL, ESTIMATE) for kind in table.kinds], dtype=bool)
    return learn_dependencies(
        table.codes[finished], table.positions[finished], complete[finished]
    )


def make_plan(
    evidence: Evidence,
    rng_order: np.random.Generator,
    rng_tree: np.random.Generator,
    settings: PlanSettings,
    fixed: Mapping[str, Any] | None = None,
) -> StructurePlan:
    """Choose the level order, then descend the tree in it.

    ``fixed``: the values the trial's non-structural params will take, when a composing sampler
    knows them: then only rows with those same values can be repeated (a known structure met
    with other dense values is a new configuration). None: any row with the path's structure.
    """
    table = evidence.table
    order, phase, inactive_under = choose_order(evidence, rng_order, settings)
    policy = settings.policy
    if phase == UCT and rng_order.random() < settings.exploit_probability:
        # Follow the best result greedily; the duplicate rule then moves its deepest
        # (least important) decisions: a local step next to the incumbent.
        policy, phase = replace(policy, exploration=0.0, max_backup=1.0), EXPLOIT
    steps, feasibility = _feasible_path(
        evidence, order, inactive_under, rng_tree, policy, settings,
        repeatable=_same_dense_values(table, fixed),
    )
    values = {}
    scores = {}
    for step in steps:
        name = table.names[step.column]
        values[name] = table.values[step.column][step.code]
        scores[name] = _score_record(step.score, step.value, step.visits)
    rejected = [[p, bar, {table.names[st.column]: table.values[st.column][st.code]
                          for st in path}]
                for p, bar, path in feasibility.pop("rejected")]
    return StructurePlan(
        values=values, order=[table.names[c] for c in order], scores=scores, phase=phase,
        feasibility={**feasibility, "rejected": rejected},
    )


def _feasible_path(
    evidence: Evidence, order: list[int], inactive_under: dict[int, dict[int, frozenset[int]]],
    rng: np.random.Generator, policy: TreePolicy, settings: PlanSettings,
    repeatable: np.ndarray | None,
) -> tuple[list[Any], dict[str, Any]]:
    """Descend the tree; re-draw a path the feasibility model expects to FAIL.

    A path is kept when its P(FAIL) is at most :func:`fail_bar` of its steps. A rejected path
    joins the table as a virtual failed row, so the next descent both scores its branch lower
    and, by the dead-end rule, does not complete it again. After ``max_redraws`` rejections
    the least likely to fail of the paths drawn is taken (every recorded rejection was above
    its own bar). Where the trial's dense values are known (``repeatable``: the rows run with
    them), P(FAIL) is the higher of the model fitted on every row and the one fitted on those.
    """
    table = evidence.table
    n_values = [len(v) for v in table.values]
    kinds = np.array(table.kinds, dtype=object)
    failed = kinds == FAILED
    feasible = (kinds == REAL) | (kinds == ESTIMATE)
    numeric = [numeric_values(values) for values in table.values]

    estimator = settings.memory_estimate
    estimate = None if estimator is None else estimator.for_columns(table.names, table.values)
    reads_memory = settings.memory_model or estimate is not None

    def fit(rows: Any) -> Any:
        return fit_feasibility(
            table.codes[rows], n_values, failed[rows], feasible[rows], numeric=numeric,
            positions=table.positions[rows], broke_rule=table.broke_rule[rows],
            memory=table.memory[rows] if reads_memory else None, estimate=estimate,
        )

    model = fit(slice(None))
    same_model = None
    if repeatable is not None and (feasible & repeatable).any() and (failed & repeatable).any():
        # The trial runs with these dense values: a structure that fails with them fails
        # whatever other values once made it run. Fitted on all rows, the model sees those
        # successes and forgives it (serving past 300 trials: every structure without chunked
        # prefill fails with the incumbent's max_num_batched_tokens, and the explore arm
        # proposed one in every other trial); fitted on the rows with these values, it does
        # not. It can only raise P(FAIL): the higher of the two counts.
        same_model = fit(repeatable)
    codes, rewards, weights = table.codes, evidence.rewards, evidence.weights
    partial = failed | (kinds == PENDING)
    drawn: list[tuple[float, float, list[Any], np.ndarray]] = []  # ..., the path as a row
    for _ in range(settings.max_redraws + 1):
        steps = plan_path(
            codes, n_values, rewards, weights, order, inactive_under, rng, policy,
            failed=failed, partial=partial, repeatable=repeatable,
        )
        row = np.full(len(n_values), ABSENT)
        for step in steps:
            row[step.column] = step.code
        p_fail, bar = float(model.p_fail(row)[0]), fail_bar(steps, settings)
        if same_model is not None:
            p_fail = max(p_fail, float(same_model.p_fail(row)[0]))
        drawn.append((p_fail, bar, steps, row))
        if p_fail <= bar:
            # accepted: an earlier, rejected path may be less likely to fail, but it is also
            # less promising
            best = len(drawn) - 1
            break
        codes = np.vstack([codes, row])
        rewards = np.append(rewards, settings.failure_reward)
        weights = np.append(weights, 1.0)
        failed, partial = np.append(failed, True), np.append(partial, True)
        if repeatable is not None:
            repeatable = np.append(repeatable, True)
    else:
        best = min(range(len(drawn)), key=lambda i: (drawn[i][0], i))
    rejected = [(round(p, 3), round(bar, 3), path)
                for i, (p, bar, path, _) in enumerate(drawn) if i != best]
    p_fail, bar, steps, row = drawn[best]
    record = {"p_fail": round(p_fail, 3), "bar": round(bar, 3), "rejected": rejected}
    if model.predicts_memory:  # what the memory model or estimate expects of the path it runs
        record["memory_use"] = round(float(model.memory_use(row)[0]), 3)
    if model.calibration is not None:  # how the measured peaks read the user's formula
        record["memory_calibration"] = model.calibration.as_dict()
    return steps, record


def fail_bar(steps: Sequence[Step], settings: PlanSettings) -> float:
    """The P(FAIL) a planned path may have: ``max_fail_probability + slack * promise``.

    ``promise`` is the mean UCT value (blended reward in [0, 1], negative values clipped) of
    the path's steps. A fixed bar trades against the best structures where they sit at a
    feasibility wall (8B training: the optimum is the least sharded layout that still fits, and
    a model that extrapolates along ``tp`` calls its whole neighbourhood risky); a path the tree
    rates highly may therefore take more risk than an unpromising one. Against a fixed bar,
    over 80 seeds of the ``autoscout`` suite, a slack of 0.3 moved AutoScout's best/optimum at
    100 trials by +0.014 (8B), -0.001 (70B) and +0.010 (serving), paired means, for +1.3 to
    +1.9 FAIL trials per seed after trial 20; a slack of 0.15 gained less and lost 0.012 on 70B.
    """
    if not steps:
        return settings.max_fail_probability
    promise = float(np.mean([max(step.value, 0.0) for step in steps]))
    return settings.max_fail_probability + settings.fail_promise_slack * promise


def _same_dense_values(table: Table, fixed: Mapping[str, Any] | None) -> np.ndarray | None:
    """Rows whose every non-structural param has the value ``fixed`` gives it (None: all)."""
    if fixed is None or len(table.dense) != len(table.codes):
        return None
    wanted = {name: value_key(value) for name, value in fixed.items()}
    # each distinct set of dense values is compared once, then looked up per row
    same = np.array([all(wanted.get(name, _MISSING) == key for name, key in values)
                     for values in table.dense_values], dtype=bool)
    return same[table.dense]


_MISSING = object()


def decide_unplanned(
    evidence: Evidence,
    name: str,
    candidates: Sequence[Any],
    taken: Mapping[str, Any],
    rng: np.random.Generator,
    policy: TreePolicy,
) -> tuple[Any, dict[str, float | None]]:
    """Choose a value of ``name`` among ``candidates`` by UCT at the node ``taken`` reached."""
    table = evidence.table
    column = table.column_of(name)
    if column is None or len(table.codes) == 0:
        index = int(rng.integers(len(candidates)))
        return candidates[index], _score_record(np.inf, 0.0, 0.0)
    decided = {}
    for param, value in taken.items():
        j = table.column_of(param)
        if j is not None and j != column:
            decided[j] = table.code_of(j, value)
    rows = node_rows(table.codes, decided)
    scores = child_scores(
        table.codes, column, len(table.values[column]), evidence.rewards, evidence.weights,
        rows, exploration=policy.exploration, rave_equivalence=policy.rave_equivalence,
        rave_visit_share=policy.rave_visit_share, max_backup=policy.max_backup,
    )
    lookup = {value_key(v): i for i, v in enumerate(table.values[column])}
    codes = [lookup.get(value_key(v), -1) for v in candidates]
    candidate_scores = np.array([scores.score[c] if c >= 0 else np.inf for c in codes])
    index = pick(candidate_scores, rng)
    code = codes[index]
    if code < 0:
        return candidates[index], _score_record(np.inf, 0.0, 0.0)
    return candidates[index], _score_record(
        scores.score[code], scores.value[code], scores.visits[code]
    )


def _score_record(score: float, value: float, visits: float) -> dict[str, float | None]:
    return {
        "uct": float(score) if np.isfinite(score) else None,
        "value": float(value),
        "visits": float(visits),
    }
