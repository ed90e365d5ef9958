"""Fuzzing: hypothesis-generated conditional spaces and misbehaving objectives, every sampler.

A space is a small tree: each node suggests one param; a categorical node's value picks the
child subtree. Names are reused across branches with different ranges (Optuna allows a dynamic
range per trial), and objectives return NaN/inf, raise, prune (with or without an estimate) or
fail. Required: the samplers never crash, every value lies inside its distribution.
"""

from __future__ import annotations

import math
import zlib

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autoscout_optuna import AutoScoutSampler, CoordinateDescentSampler, MCTSSampler

SAMPLERS = {
    "autoscout": AutoScoutSampler,
    "mcts": MCTSSampler,
    "coordinate": CoordinateDescentSampler,
}
NAMES = ["a", "b", "c"]  # few names: branches reuse them, numeric ones with other ranges


@st.composite
def distributions(draw):
    kind = draw(st.sampled_from(["cat", "int", "intlog", "intstep", "float", "floatlog", "step"]))
    if kind == "cat":
        # Optuna requires one choice list per name across trials: the tag names the list.
        n = draw(st.integers(1, 4))
        option = draw(st.integers(0, 3))
        choices = [[f"v{i}" for i in range(n)], list(range(n)), [True, False][:n],
                   [None, 1, "x", 2.5][:n]][option]
        return f"cat{option}{len(choices)}", CategoricalDistribution(choices)
    low = draw(st.integers(-20, 20))
    span = draw(st.integers(0, 200))
    if kind == "int":
        return kind, IntDistribution(low, low + span)
    if kind == "intlog":
        return kind, IntDistribution(1 + abs(low), 1 + abs(low) + span, log=True)
    if kind == "intstep":
        step = draw(st.integers(1, 7))
        return kind, IntDistribution(low, low + step * draw(st.integers(0, 20)), step=step)
    if kind == "float":
        return kind, FloatDistribution(float(low), float(low + span) + draw(st.floats(0, 1)))
    if kind == "floatlog":
        lo = draw(st.floats(1e-6, 10))
        return kind, FloatDistribution(lo, lo * draw(st.floats(1.0, 1e4)), log=True)
    step = draw(st.sampled_from([0.1, 0.25, 0.5, 1.0]))
    return f"step{step}", FloatDistribution(
        float(low), float(low) + step * draw(st.integers(0, 30)), step=step)


@st.composite
def spaces(draw, depth=0):
    """A list of (name, distribution, {choice_index: subspace}) nodes."""
    nodes = []
    for _ in range(draw(st.integers(1, 3))):
        tag, dist = draw(distributions())
        children = {}
        if isinstance(dist, CategoricalDistribution) and depth < 2:
            for i in range(len(dist.choices)):
                if draw(st.booleans()):
                    children[i] = draw(spaces(depth=depth + 1))
        nodes.append((f"{draw(st.sampled_from(NAMES))}_{tag}", dist, children))
    return nodes


def walk(trial, nodes, seen):
    for name, dist, children in nodes:
        if name in seen:  # one name per trial: a second suggest would have to agree
            continue
        seen[name] = dist
        value = trial._suggest(name, dist)
        assert dist._contains(dist.to_internal_repr(value)), (name, dist, value)
        if children and isinstance(dist, CategoricalDistribution):
            sub = children.get(dist.choices.index(value))
            if sub:
                walk(trial, sub, seen)


OUTCOMES = ["value", "value", "value", "nan", "inf", "raise", "prune", "prune_no_report", "fail"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The distribution is specified by")  # generated odd steps
@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    space=spaces(),
    sampler_name=st.sampled_from(sorted(SAMPLERS)),
    outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=4, max_size=30),
    direction=st.sampled_from(["minimize", "maximize"]),
    seed=st.integers(0, 2**16),
)
def test_samplers_survive_fuzzed_spaces(space, sampler_name, outcomes, direction, seed):
    study = optuna.create_study(direction=direction, sampler=SAMPLERS[sampler_name](seed=seed))

    def objective(trial):
        walk(trial, space, {})
        outcome = outcomes[trial.number % len(outcomes)]
        value = sum(zlib.crc32(str(v).encode()) % 97 for v in trial.params.values()) / 97.0
        if outcome == "nan":
            return math.nan
        if outcome == "inf":
            return math.inf
        if outcome == "raise":
            raise RuntimeError("objective crashed")
        if outcome == "prune":
            trial.report(value, 0)
            raise optuna.TrialPruned()
        if outcome == "prune_no_report":
            raise optuna.TrialPruned()
        if outcome == "fail":
            return None  # a wrong return type: Optuna records FAIL
        return value

    study.optimize(objective, n_trials=len(outcomes), catch=(RuntimeError,))
    assert len(study.trials) == len(outcomes)
    assert all(t.state != TrialState.RUNNING for t in study.trials)
