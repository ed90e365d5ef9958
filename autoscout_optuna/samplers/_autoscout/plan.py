"""From trials to what the orchestrator needs: space, incumbent, plan, bandit evidence.

Works on :class:`~autoscout_optuna.samplers._autoscout.reader.Seen` lists only (no
``Study``), so every rule here is testable with hand-made histories.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution

from autoscout_optuna._space import discrete_values, is_structural
from autoscout_optuna.samplers._autoscout.bandit import Pull
from autoscout_optuna.samplers._autoscout.did import (
    IMPROVEMENT_SCALE,
    potential_values,
    reward_of,
)
from autoscout_optuna.samplers._autoscout.history_table import HistoryTable
from autoscout_optuna.samplers._autoscout.reader import Seen, StudyDigest
from autoscout_optuna.samplers._autoscout.relook import settling_estimates
from autoscout_optuna.samplers._autoscout.startup import infer_conditions, least_covered
from autoscout_optuna.samplers._autoscout.surrogate import (
    ESTIMATE_WEIGHT,
    Proposal,
    propose_encoded,
    weighted_gram,
)
from autoscout_optuna.samplers._mcts.estimate import MemoryEstimator

ARMED = ("explore", "neighbour", "model", "refine")
# Arms that propose a structure (refine keeps one and moves dense knobs).
STRUCTURE_ARMS = ("startup", "explore", "neighbour", "model")
# Refinement trials per dense knob a structure gets without a gain before it counts as tuned
# out. Three (a probe either way along every coordinate, then one step) wrote structures off
# too early: on llm_serving (4 dense knobs, noisy) gains kept coming after 12 flat trials.
PATIENCE_PER_KNOB = 5
WINDOW = 200
RECENT = 20
# Structures by potential that get refinement trials in turn before the refine arm rests.
TOP_STRUCTURES = 3


@dataclass(frozen=True)
class ObservedSpace:
    """Every param seen so far with its latest distribution, split structural / dense."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    structural: tuple[str, ...] = ()
    dense: tuple[str, ...] = ()


def observed_space(history: Sequence[Seen], digest: StudyDigest) -> ObservedSpace:
    """The finished trials' space (``digest``) with the running trials' of ``history`` (the
    running trials alone are enough)."""
    distributions = dict(digest.distributions)
    for obs in history:
        if obs.kind == "pending":
            distributions.update(obs.distributions)
    structural = tuple(n for n, d in distributions.items() if is_structural(d))
    dense = tuple(n for n, d in distributions.items() if not is_structural(d))
    return ObservedSpace(distributions, structural, dense)


def structure_of(obs: Seen, space: ObservedSpace) -> dict[str, Any]:
    return {n: obs.params[n] for n in space.structural if n in obs.params}


def untried_neighbours(
    history: Sequence[Seen], space: ObservedSpace, best: Seen
) -> list[tuple[str, Any]]:
    """``(param, value)`` changes of one structural param of ``best`` no trial has made yet.

    A neighbour counts as tried when some trial agrees with ``best`` on every other structural
    param ``best`` has and takes ``value`` there (failed and running trials count too).
    """
    base = structure_of(best, space)
    tried: set[tuple[str, str]] = set()
    for obs in history:
        diff = [n for n in base if n in obs.params and obs.params[n] != base[n]]
        same = all(n in obs.params for n in base)
        if len(diff) == 1 and (same or obs.kind == "failed"):
            tried.add((diff[0], repr(obs.params[diff[0]])))
    moves = []
    for name, current in base.items():
        for value in discrete_values(space.distributions[name]):
            if value != current and (name, repr(value)) not in tried:
                moves.append((name, value))
    return moves


def rank_moves(
    history: Sequence[Seen], moves: Sequence[tuple[str, Any]]
) -> list[tuple[str, Any]]:
    """Moves best first by how trials with that value did anywhere in the study.

    Each value scores the mean of its trials' score ranks in [0, 1] (a FAIL counts -0.5), with
    one pseudo-trial at 0.5 so an unseen value is neither favoured nor shunned.
    """
    scored = sorted(o.score for o in history if o.score is not None)
    def rank(obs: Seen) -> float:
        if obs.kind == "failed" or obs.score is None:
            return -0.5
        return float(np.searchsorted(scored, obs.score)) / max(len(scored) - 1, 1)
    def merit(move: tuple[str, Any]) -> float:
        name, value = move
        values = [
            rank(o) for o in history
            if o.kind != "pending" and o.params.get(name, _NONE) == value
        ]
        return (0.5 + sum(values)) / (1 + len(values))
    return sorted(moves, key=merit, reverse=True)


_NONE = object()


def make_plan(
    history: Sequence[Seen],
    digest: StudyDigest,
    space: ObservedSpace,
    best: Seen | None,
    *,
    startup: bool,
    rng: np.random.Generator,
    move: tuple[str, Any] | None = None,
    structure: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The plan :class:`TransplantSampler` plays back (see its module doc for the rules).

    With ``move``, the structure is the incumbent's with that one change (neighbour arm); with
    ``structure``, those structural values (model arm).
    """
    values: dict[str, Any] = {}
    # Start-up keeps dense knobs shared while it still meets structural values for the first
    # time (a fair comparison of structures); once every value was seen, or with no structure
    # at all, repeating the same dense values would only repeat trials, so they are random.
    dense_random = startup and bool(history) and _all_values_seen(history, space)
    if not dense_random:
        values.update(donor_dense_values(digest, space, best))
    if startup:
        for name in space.structural:
            seen = [o.params[name] for o in history if name in o.params]
            values[name] = least_covered(discrete_values(space.distributions[name]), seen, rng)
    if move is not None and best is not None:
        values.update(structure_of(best, space))
        values[move[0]] = move[1]
    if structure is not None:
        values.update(structure)
    return {"values": values, "unseen_dense": "random" if dense_random else "centre"}


def donor_dense_values(
    digest: StudyDigest, space: ObservedSpace, best: Seen | None
) -> dict[str, Any]:
    """The dense values a trial with a new structure runs with: the incumbent's, and for a
    knob it lacks, those of the best trial that has it."""
    values = {}
    for name in space.dense:
        donor = best if best is not None and name in best.params else None
        donor = donor or digest.best_having(name)
        if donor is not None:
            values[name] = donor.params[name]
    return values


def _all_values_seen(history: Sequence[Seen], space: ObservedSpace) -> bool:
    for name in space.structural:
        seen = {repr(o.params[name]) for o in history if name in o.params}
        if any(repr(v) not in seen for v in discrete_values(space.distributions[name])):
            return False
    return True


def conditions(history: Sequence[Seen], space: ObservedSpace) -> dict[str, Any]:
    return infer_conditions([o.params for o in history], space.structural)


def bandit_evidence(
    history: Sequence[Seen], digest: StudyDigest, *, reward: str, estimate_weight: float,
    window: int = WINDOW, running: Sequence[Seen] | None = None,
) -> tuple[list[Pull], dict[str, int], list[str]]:
    """Rewards per arm (newest first, aged), pending counts per arm, arms of recent trials.

    Only the last ``window`` finished trials are turned into rewards: with the bandit's
    discount, older ones weigh nothing (0.95 ** 200 < 1e-4), and this keeps a trial O(window).
    ``running``: the running trials of ``history``, where the caller has them (the reader
    does), so the pending counts need not scan the history.
    """
    scale = digest.scale()
    noise = digest.noise()
    finished = []  # newest first; a trial's age is its place here
    for obs in reversed(history):
        if obs.kind != "pending":
            finished.append(obs)
            if len(finished) >= window:
                break
    pulls = [
        Pull(obs.arm, reward_of(obs.gains.get(reward), scale=scale, noise=noise),
             estimate_weight if obs.kind == "estimate" else 1.0, age)
        for age, obs in enumerate(finished) if obs.arm in ARMED
    ]
    pending: dict[str, int] = {}
    for obs in history if running is None else running:
        if obs.kind == "pending" and obs.arm in ARMED:
            pending[obs.arm] = pending.get(obs.arm, 0) + 1
    recent = [o.arm for o in history[-3 * RECENT:] if o.arm in ARMED][-RECENT:]
    return pulls, pending, recent


@dataclass(frozen=True)
class RefineChoice:
    """The structure the refine arm works on, how far it is tuned out, and why it was chosen.

    Attributes:
        key: Structure key (see :class:`~autoscout_optuna.samplers._autoscout.reader.Seen`).
        stale: Its refinement trials since the last one that gained more than the noise.
        patience: The refinements without gain it gets (``PATIENCE_PER_KNOB`` per dense knob).
        rank: Its place among the structures ranked by potential (0: the best potential).
        potential: Potential (``did.structure_potential``) of the structures ranked for
            refinement and of the incumbent structure, by structure key.
    """

    key: Any
    stale: int
    patience: int
    rank: int
    potential: dict[Any, float]


def refine_choice(
    pending: Sequence[Seen], digest: StudyDigest, space: ObservedSpace, *, estimator: str
) -> RefineChoice | None:
    """Successive refinement of the ``TOP_STRUCTURES`` structures with the best potential.

    Structures are compared at untuned dense values when they are first met, so the best
    structure can look worse than an incumbent that had many refinements. The structure with
    the best potential is refined until it used its patience without a gain; then the next one
    by potential gets its share, and so on down the top ``TOP_STRUCTURES``: a structure close
    to the incumbent is tuned before it is written off. A gain resets a structure's count, and
    a structure that overtakes the incumbent becomes the first in line. When all of them are
    tuned out, the first is returned with ``stale >= patience`` (the refine arm rests).
    None before any trial had a value. ``pending``: the running trials (any others in it are
    ignored; the finished ones are the digest's).
    """
    if digest.ledger.incumbent is None:
        return None
    ledger = digest.ledger
    top_key = ledger.incumbent
    values = potential_values(ledger, estimator=estimator, noise=digest.noise())
    keys = list(ledger.best)
    top = ledger.places[top_key]
    ranked = [keys[i] for i in _top_structures(values, top, TOP_STRUCTURES)]
    # the potentials anyone reads: the ranked structures' and the incumbent structure's
    potential = {key: float(values[ledger.places[key]]) for key in [*ranked, top_key]}
    stale_counts = _stale_counts(digest, pending, estimator, digest.noise(), ranked)
    # Only structures within a reward scale of the incumbent are worth its tuning budget.
    close = potential[top_key] - IMPROVEMENT_SCALE * digest.scale()
    choices = []
    for rank, key in enumerate(ranked):
        if choices and potential[key] < close:
            break
        n_dense = sum(1 for n in digest.examples[key].params if n in space.dense)
        patience = max(2, PATIENCE_PER_KNOB * n_dense)
        choice = RefineChoice(key, stale_counts.get(key, 0), patience, rank, potential)
        if choice.stale < choice.patience:
            return choice
        choices.append(choice)
    return choices[0]


def _top_structures(values: np.ndarray, top: int, count: int) -> list[int]:
    """Indices of the ``count`` largest ``values``, ``top`` first on a tie, then the lower
    index: ``sorted(range(n), key=(value, is top), reverse=True)[:count]`` as one array sort
    (a study has thousands of structures and this runs every trial)."""
    is_top = np.zeros(len(values), dtype=bool)
    is_top[top] = True
    # lexsort is stable: equal keys keep their order, as ``sorted`` does
    return np.lexsort((~is_top, -values))[:count].tolist()


def _stale_counts(
    digest: StudyDigest, pending: Sequence[Seen], estimator: str, noise: float,
    keys: Sequence[Any],
) -> dict[Any, int]:
    """Per structure of ``keys``: refinement trials (failed and running ones included) since
    the last one that beat the structure's best by more than the measurement noise.

    Each structure's finished refinements are walked from the newest back, only until its last
    gain (it runs every trial, and the structures being refined usually gained recently); a
    running refinement counts when it is newer than that gain.
    """
    stale: dict[Any, int] = {}
    for key in keys:
        count, last_gain = 0, -1
        for number, gains in reversed(digest.refinements.get(key, ())):
            gain = gains.get(estimator)
            if gain is not None and gain > noise:
                last_gain = number
                break
            count += 1
        count += sum(1 for obs in pending if obs.kind == "pending" and obs.arm == "refine"
                     and obs.structure == key and obs.number > last_gain)
        if count:
            stale[key] = count
    return stale


def refine_target(
    choice: RefineChoice, digest: StudyDigest, space: ObservedSpace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The structure of ``choice`` as params, and why it was chosen (a user attr)."""
    top_key = digest.ledger.incumbent
    why = {
        "incumbent_structure": choice.key == top_key,
        "rank": choice.rank,
        "stale": choice.stale,
        "patience": choice.patience,
        "potential": round(choice.potential[choice.key], 6),
        "incumbent_best": round(choice.potential.get(top_key, float("nan")), 6),
    }
    return structure_of(digest.examples[choice.key], space), why


# Finished structure proposals a new leading structure must survive before the refine arm
# opens: tuning dense knobs pays only once the structure is decided (the paper's order,
# high-impact features first). Measured against refine from the first trial after start-up,
# seeds 0-79, 100 trials: best/optimum at 20 trials +0.012 / +0.017 / +0.031 (8B / 70B /
# serving), at 100 trials -0.001 / +0.008 / -0.003 (all within +-0.016).
SETTLE_PROPOSALS = 10


def settle_proposals(space: ObservedSpace) -> int:
    """The gate's threshold for ``space``: ``SETTLE_PROPOSALS``, or fewer where there are
    fewer other structures to propose (an upper bound: conditional params count as if always
    asked), so a small space does not wait on repeats."""
    others = 1
    for name in space.structural:
        others *= max(len(discrete_values(space.distributions[name])), 1)
        if others > SETTLE_PROPOSALS:
            return SETTLE_PROPOSALS
    return others - 1


def structure_settled(
    history: Sequence[Seen], proposals: int = SETTLE_PROPOSALS, *, best: Seen | None = None
) -> bool:
    """Whether ``proposals`` finished structure proposals (start-up, explore, neighbour and
    model trials, failed ones included) came after the last one that put a different structure
    in the lead (real scores only; a refinement, or a confirmation re-run, that lifts a
    runner-up over the incumbent does not reopen the structure search). False before any real
    value.

    ``best``, the best real trial (the digest's), lets the usual case skip the walk from the
    start: no trial after it leads, so the proposals after it count in any case.
    """
    if best is not None:
        count = 0
        for obs in reversed(history):
            if obs.number == best.number:
                break
            if obs.kind != "pending" and obs.arm in STRUCTURE_ARMS:
                count += 1
                if count >= proposals:
                    return True
    top, leader, since = None, None, 0
    for obs in history:
        if obs.kind == "pending":
            continue
        leads = obs.kind == "real" and obs.score is not None and (top is None or obs.score > top)
        if leads:
            if obs.structure != leader and obs.arm in STRUCTURE_ARMS:
                since = 0
            top, leader = obs.score, obs.structure
        elif obs.arm in STRUCTURE_ARMS:
            since += 1
    return top is not None and since >= proposals


def exploring_succeeds(history: Sequence[Seen], last: int = 5) -> bool:
    """Whether one of the ``last`` finished structure proposals (start-up, explore, neighbour,
    model trials) ended with a value."""
    kinds = list(itertools.islice(
        (o.kind for o in reversed(history)
         if o.arm in STRUCTURE_ARMS and o.kind != "pending"), last))
    return any(kind in ("real", "estimate") for kind in kinds)


def model_proposal(
    history: Sequence[Seen], space: ObservedSpace, rng: np.random.Generator,
    table: HistoryTable | None = None, memory_model: bool = False,
    estimate_weight: float = ESTIMATE_WEIGHT, dense: Mapping[str, Any] | None = None,
    memory_estimate: MemoryEstimator | None = None,
) -> Proposal | None:
    """The model arm's structure (:mod:`~autoscout_optuna.samplers._autoscout.surrogate`).

    ``table``: a :class:`~autoscout_optuna.samplers._autoscout.history_table.HistoryTable`
    the caller keeps between calls, so a proposal reads only the trials added since the last.
    ``memory_model``: also learn P(out of memory) from the peak memory trials report.
    ``memory_estimate``: the user's memory estimate, calibrated on those peaks, answers for
    out-of-memory failures instead (``samplers/_mcts/estimate.py``).
    ``estimate_weight``: a PRUNED trial's estimate in the regression, a real value's being 1.
    ``dense``: the dense values the trial runs with (:func:`donor_dense_values`); an estimate
    made with them leaves its structure tried (``surrogate.settled_rows``) unless the
    simulator's error is drawn per call (:mod:`~autoscout_optuna.samplers._autoscout.relook`).
    None: any estimate may be looked past. Either way an estimate the pruner judged
    measurement-grade leaves its structure tried, as a real run does (``relook``'s
    :func:`~autoscout_optuna.samplers._autoscout.relook.settling_estimates`).
    """
    names = list(space.structural)
    values = [discrete_values(space.distributions[n]) for n in names]
    inputs = (table or HistoryTable()).read(history, names, values)
    # without an estimate (no pruner) every row counts as tried: no need to read the history
    settled = None
    if (inputs.kinds == "estimate").any():
        settled = settling_estimates(history, dense, space.dense)
    reads_memory = memory_model or memory_estimate is not None
    return propose_encoded(names, values, inputs.codes, inputs.kinds, inputs.scores,
                           inputs.conditions, rng,
                           gram=weighted_gram(inputs.grams, estimate_weight),
                           positions=inputs.positions, broke_rule=inputs.broke_rule,
                           memory=inputs.memory if reads_memory else None,
                           estimate_weight=estimate_weight,
                           settled=settled,
                           memory_estimate=(None if memory_estimate is None
                                            else memory_estimate.for_columns(names, values)))


def _arm(obs: Seen) -> str:
    return obs.arm
