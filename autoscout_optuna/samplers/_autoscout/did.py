"""Difference-in-differences credit for the orchestrator's arms (pure: numbers in, numbers out).

Two factors move a trial's score: its *structure* (the discrete layout MCTS explores) and the
*stage of dense tuning* that structure has had (how many coordinate-descent steps refined it).
A naive bandit credits a trial by how it compares with the incumbent. That confounds the two
factors: a new structure, evaluated once, loses to an incumbent structure that has had twenty
refinement steps even when the new structure is better; and a refinement step on a lucky
structure looks good because the structure is good, not because the step was.

Difference-in-differences compares like with like. With ``y_t`` the trial's score (larger is
better), ``y*`` the incumbent's score when the trial started, and ``c(t)`` a *control*: the
trial that shares with ``t`` the factor ``t``'s arm did not change::

    naive(t) = y_t - y*
    did(t)   = (y_t - y*) - (y_c(t) - y*)  =  y_t - y_c(t)

* explore, neighbour or model, new structure (stage 0 of its tuning): the control is the incumbent
  structure at stage 0, i.e. its first evaluation. The second difference ``y_c - y*``
  removes the tuning gain the incumbent has had and the new structure has not.
* refine (dense knobs moved, structure kept): the control is that structure's best earlier
  score: the step is credited only with what it added to its own structure.
* explore, neighbour or model landing on a known structure: the control is the incumbent. The trial
  carries the incumbent's dense values onto a structure measured before, often at untuned
  values; against that structure's own best it would be credited with the tuning the refine
  arm did and it only copied (on llm_serving such trials earned over half of the explore
  arm's reward, and the refine arm got a quarter of the trials). Only the structure is new to
  these dense values, so the incumbent, at the same values, is the like-for-like control.

The bandit is after improvements (a search is judged by its best value), so the reward is the
*gain* over the control, scaled and squashed::

    reward(t) = tanh(max(did(t) - noise, 0) / (IMPROVEMENT_SCALE * s))

with ``s`` the inter-decile spread of the scores seen so far (a gain of a tenth of the spread
earns ~0.76) and ``noise`` the measurement noise (the pooled standard deviation of repeated
measurements of one config, 0 while there are none): a "gain" a re-measurement would give by
luck earns nothing, or a noisy objective would make every arm look productive. A trial that
ended FAIL scores ``FAILURE_REWARD`` for the arm that proposed it.

:func:`structure_potential` uses the same two differences to pick which structure the refine
arm works on: a structure's best score plus the tuning gain the incumbent structure has had
beyond it, so a structure that beat the incumbent at a comparable stage gets refined too;
each best first less the luck a best of several noisy measurements carries.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

FAILURE_REWARD = -0.02
IMPROVEMENT_SCALE = 0.1
# A structure's real scores within this many noise deviations of its best could each have
# been the best by luck; those further below could not (see ``luck_allowance``).
LUCK_WINDOW = 2.0
_STANDARD_NORMAL = NormalDist()


@dataclass(frozen=True)
class ArmOutcome:
    """One finished trial as the reward estimator sees it.

    Attributes:
        arm: ``"startup"``, ``"explore"``, ``"neighbour"``, ``"model"`` or ``"refine"``
            (every arm but ``"refine"`` proposes a structure and is credited as ``explore``).
        structure: A hashable key of the trial's structural params.
        score: Oriented score (larger is better); None for a failed trial.
        estimate: Whether the score is a low-fidelity estimate (a PRUNED trial) rather than a
            real measurement.
    """

    arm: str
    structure: Hashable
    score: float | None
    estimate: bool = False


def score_scale(scores: Sequence[float]) -> float:
    """Robust spread of the scores: inter-decile range, never zero."""
    values = np.asarray(scores, dtype=float)  # None -> nan
    values = values[np.isfinite(values)]
    if values.size < 2:
        return 1.0
    low, high = np.quantile(values, [0.1, 0.9])
    spread = float(high - low)
    if spread <= 0.0:
        spread = float(np.max(np.abs(values))) * 1e-3
    return spread if spread > 0.0 else 1.0


class Ledger:
    """First and best score per structure, and the incumbent, as trials arrive in order.

    Real values take precedence over estimates (``ArmOutcome.estimate``: PRUNED trials'
    low-fidelity values the pruner did not find measurement-grade): a structure's first and
    best are its real values once it has one (its first real value replaces what estimates
    said), and estimates count only for structures never run for real. The best of many noisy
    estimates is their luckiest draw: with 20 % simulator noise on llm_serving, a structure's
    best estimate sat above every real value it would reach, so refinements that did improve
    it counted as stale (the refine arm was tuned out) and potentials and controls were
    inflated (fidelity suite at 20 % noise, with ``FidelityPruner(selection_aware=True,
    new_structure_control=True)`` and the selection-aware ensemble: 99 % reached in 10/16
    seeds, 0-7 and 100-107, instead of 6/16 without this rule). Without a pruner there are no
    estimates and nothing changes.
    """

    def __init__(self) -> None:
        self.first: dict[Hashable, float] = {}
        self.best: dict[Hashable, float] = {}
        self.incumbent: Hashable | None = None
        self.places: dict[Hashable, int] = {}  # structure -> its place in ``first``/``best``
        self.measured: set[Hashable] = set()  # structures with a real value
        # structure -> its real scores, ascending; only structures measured twice or more are
        # read (one measurement has no luck of the draw to correct)
        self.reals: dict[Hashable, list[float]] = {}

    def add(self, outcome: ArmOutcome) -> None:
        if outcome.score is None:
            return
        s = outcome.structure
        if not outcome.estimate:
            bisect.insort(self.reals.setdefault(s, []), outcome.score)
        if outcome.estimate and s in self.measured:
            return  # a structure measured for real is judged by its real values
        if not outcome.estimate and s not in self.measured:
            self.measured.add(s)
            if s in self.first:
                # Its first real value replaces what estimates said about it.
                self.first[s] = self.best[s] = outcome.score
                self.incumbent = max(self.best, key=self.best.__getitem__)
                return
        if s not in self.first:  # ``first`` and ``best`` gain a structure together
            self.first[s] = outcome.score
            self.places[s] = len(self.places)
        if s not in self.best or outcome.score > self.best[s]:
            self.best[s] = outcome.score
        if self.incumbent is None or self.best[s] > self.best[self.incumbent]:
            self.incumbent = s

    def gain(self, outcome: ArmOutcome, estimator: str) -> float | None:
        """``y_t - y_c`` before ``outcome`` is added (0 with no control; None if it failed)."""
        if outcome.score is None:
            return None
        control = self.control(outcome, estimator)
        return 0.0 if control is None else outcome.score - control

    def control(self, outcome: ArmOutcome, estimator: str) -> float | None:
        if self.incumbent is None:
            return None
        if estimator == "naive":
            return self.best[self.incumbent]
        known = outcome.structure in self.best
        if outcome.arm == "refine":
            return self.best[outcome.structure if known else self.incumbent]
        if known:  # the incumbent's dense values on a structure seen before: see module doc
            return self.best[self.incumbent]
        return self.first[self.incumbent]  # a new structure, at its stage 0


def arm_rewards(
    outcomes: Sequence[ArmOutcome], *, estimator: str = "did", noise: float = 0.0
) -> list[float | None]:
    """Reward of each outcome, in order (None for start-up trials, which no arm chose).

    Args:
        outcomes: Finished trials, oldest first.
        estimator: ``"did"`` (difference-in-differences, see module doc) or ``"naive"``
            (gain over the incumbent at the time).
        noise: Measurement noise (standard deviation, score units) a gain must exceed.
    """
    _check_estimator(estimator)
    scale = score_scale([o.score for o in outcomes if o.score is not None])
    ledger = Ledger()
    rewards: list[float | None] = []
    for outcome in outcomes:
        reward: float | None = None
        if outcome.arm != "startup":
            reward = reward_of(ledger.gain(outcome, estimator), scale=scale, noise=noise)
        rewards.append(reward)
        ledger.add(outcome)
    return rewards


def reward_of(gain: float | None, *, scale: float, noise: float) -> float:
    """Reward of a raw gain ``did(t)`` (None for a failed trial); see the module doc."""
    if gain is None:
        return FAILURE_REWARD
    return math.tanh(max(gain - noise, 0.0) / (IMPROVEMENT_SCALE * scale))


def pooled_noise(groups: Sequence[Sequence[float]]) -> float:
    """Pooled standard deviation of repeated measurements (groups of one config); 0 if none."""
    squares, dof = 0.0, 0
    for values in groups:
        if len(values) >= 2:
            array = np.asarray(values, dtype=float)
            squares += float(((array - array.mean()) ** 2).sum())
            dof += len(values) - 1
    return math.sqrt(squares / dof) if dof else 0.0


def structure_potential(
    outcomes: Sequence[ArmOutcome], *, estimator: str = "did", noise: float = 0.0
) -> dict[Hashable, float]:
    """What each structure would score at the incumbent structure's stage of tuning.

    ``potential(s) = b(s) + max(0, gain(s*) - gain(s) - 2 * noise)`` where ``gain(s) = b(s) -
    first(s)`` is the tuning gain a structure has had and ``s*`` the incumbent structure, so
    ``potential(s*) = b(s*)``. ``b(s) = best(s) - luck(s)`` is the structure's best real score
    less the luck a best of several noisy measurements has (:func:`luck_allowance`): after a
    few dozen refinements a structure's best is about two standard deviations above what it
    would measure again, while a structure measured once is not inflated at all, so comparing
    raw bests keeps the search on the structure it measured most (``llm_training``, 20 %
    noise simulator, seed 5: a tp 2 structure's best of 8 real runs measured 1.035 of the
    optimum, 0.974 true, and kept a tp 1 structure measured once at 0.993, 0.984 true, below
    the refine arm's "close" band: after that run the arm refined only tp 2 structures). A
    best that is one lucky measurement, far above its structure's other scores, has no
    near-best draws to discount (see :func:`luck_allowance`). A gain must also clear the
    noise allowance. With ``estimator="naive"`` the potential is the raw best score.
    """
    _check_estimator(estimator)
    ledger = Ledger()
    for outcome in outcomes:
        ledger.add(outcome)
    return potential_from(ledger, estimator=estimator, noise=noise)


def potential_from(ledger: Ledger, *, estimator: str, noise: float) -> dict[Hashable, float]:
    """:func:`structure_potential` of the outcomes a ledger has seen."""
    values = potential_values(ledger, estimator=estimator, noise=noise)
    return dict(zip(ledger.best, values.tolist(), strict=True))


def potential_values(ledger: Ledger, *, estimator: str, noise: float) -> np.ndarray:
    """:func:`potential_from` as an array over the structures in ``ledger.places`` order.

    The formula runs on all structures at once with the float operations it has for one (a
    study has thousands of structures and the refine arm asks every trial).
    """
    best = np.fromiter(ledger.best.values(), dtype=float, count=len(ledger.best))
    if estimator == "naive" or ledger.incumbent is None:
        return best
    best = best - luck_allowances(ledger, noise)
    top = ledger.places[ledger.incumbent]
    first = np.fromiter(ledger.first.values(), dtype=float, count=len(ledger.first))
    extra = best[top] - first[top] - (best - first) - 2.0 * noise
    return best + np.where(extra > 0.0, extra, 0.0)  # max(0.0, extra), as Python has it


def luck_allowances(ledger: Ledger, noise: float) -> np.ndarray:
    """Per structure (``ledger.places`` order), :func:`luck_allowance` of its real scores."""
    allowances = np.zeros(len(ledger.places))
    if noise <= 0.0:
        return allowances
    for structure, scores in ledger.reals.items():  # every structure with a real score has a place
        if len(scores) > 1:
            allowances[ledger.places[structure]] = luck_allowance(scores, noise)
    return allowances


def luck_allowance(sorted_scores: Sequence[float], noise: float) -> float:
    """How far the best of a structure's real scores is expected to sit above its truth.

    The scores within ``LUCK_WINDOW`` noise deviations of the best are the ones that could
    have been the best by the luck of the draw; of ``n`` such draws of one value the largest
    is ``noise * E[max of n standard normals]`` above it (Blom's approximation
    ``Phi^-1((n - 0.375) / (n + 0.25))``: 0 for one draw, 0.59 for two, 1.55 for ten). An
    upper bound where those scores differ for real (a refinement that did gain), so a tuned
    structure gives up a little of its lead rather than keep all of its luck.
    """
    best = sorted_scores[-1]
    n = len(sorted_scores) - bisect.bisect_left(sorted_scores, best - LUCK_WINDOW * noise)
    if n <= 1:
        return 0.0
    return noise * _STANDARD_NORMAL.inv_cdf((n - 0.375) / (n + 0.25))


def _check_estimator(estimator: str) -> None:
    if estimator not in ("did", "naive"):
        raise ValueError(f"estimator must be 'did' or 'naive', got {estimator!r}")
