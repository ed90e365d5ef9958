"""The orchestrator's bandit policy (pure: rewards in, an arm out).

Discounted Gaussian Thompson sampling. Each arm's rewards (gains in [0, 1), failures below 0,
from :mod:`~autoscout_optuna.samplers._autoscout.did`) are averaged with weights
``weight * discount ** age`` so the policy follows the search as it moves from structure to
dense tuning; a prior of ``PRIOR_PULLS`` pseudo-pulls at reward 0 keeps young arms uncertain.
Each arm draws ``theta ~ N(mean, SIGMA**2 / (pulls + PRIOR_PULLS))`` and the largest draw wins.
Pending trials (other workers) count as pulls at the arm's mean (a constant liar): they shrink
the arm's uncertainty without inventing a result, so parallel workers spread across arms.
A floor gives every arm a minimum share of recent trials, so no arm starves on early bad luck;
an arm left out of it (``unfloored``) runs only when its draw wins.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

SIGMA = 0.1
PRIOR_PULLS = 1.0


class Pull(NamedTuple):
    """One reward of one arm. ``age`` counts trials since it (0 = the latest).

    A named tuple, not a dataclass: the orchestrator builds a couple of hundred per trial, and
    a tuple is built in a third of the time.
    """

    arm: str
    reward: float
    weight: float = 1.0
    age: int = 0


@dataclass(frozen=True)
class ArmStats:
    """What the policy knows of one arm (recorded on each trial)."""

    pulls: float
    mean: float
    draw: float
    recent_share: float

    def as_dict(self) -> dict[str, float]:
        return {
            "pulls": round(self.pulls, 3),
            "mean": round(self.mean, 4),
            "draw": round(self.draw, 4),
            "recent_share": round(self.recent_share, 3),
        }


def choose_arm(
    arms: Sequence[str],
    pulls: Sequence[Pull],
    rng: np.random.Generator,
    *,
    pending: Mapping[str, int] | None = None,
    recent: Sequence[str] = (),
    floor: float = 0.1,
    discount: float = 0.95,
    unfloored: Collection[str] = (),
) -> tuple[str, str, dict[str, ArmStats]]:
    """Pick the next arm.

    Args:
        arms: Arm names, in a fixed order (ties go to the first).
        pulls: Rewards observed so far.
        rng: Source of the Thompson draws (derived from seed and trial number by the caller).
        pending: Number of running trials per arm.
        recent: Arms of the most recent trials (for the floor), any length.
        floor: Minimum share of ``recent`` each arm gets; 0 disables it.
        discount: Per-trial discount of old rewards, in (0, 1].
        unfloored: Arms the floor does not cover: they run only when their draw wins.

    Returns:
        The arm, a one-line reason, and the statistics of every arm.
    """
    if not arms:
        raise ValueError("arms must not be empty")
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    floored = [arm for arm in arms if arm not in unfloored]
    if not 0.0 <= floor < 1.0 / max(len(floored), 1) + 1e-12:
        raise ValueError(f"floor must be in [0, 1/(arms it covers)], got {floor}")
    pending = pending or {}
    stats: dict[str, ArmStats] = {}
    for arm in arms:
        mass, total = 0.0, 0.0
        for pull in pulls:
            if pull.arm == arm:
                w = pull.weight * discount**pull.age
                mass += w
                total += w * pull.reward
        mean = total / (mass + PRIOR_PULLS)
        mass += pending.get(arm, 0)
        draw = float(rng.normal(mean, SIGMA / np.sqrt(mass + PRIOR_PULLS)))
        share = sum(1 for r in recent if r == arm) / len(recent) if recent else 1.0 / len(arms)
        stats[arm] = ArmStats(pulls=mass, mean=mean, draw=draw, recent_share=share)

    starving = [arm for arm in floored if len(recent) >= 10 and stats[arm].recent_share < floor]
    if starving:
        arm = min(starving, key=lambda a: (stats[a].recent_share, arms.index(a)))
        return arm, f"floor: {arm} had {stats[arm].recent_share:.0%} of recent trials", stats
    arm = max(arms, key=lambda a: (stats[a].draw, -arms.index(a)))
    others = ", ".join(f"{a}={stats[a].draw:+.3f}" for a in arms if a != arm)
    mine = f"{arm} drew {stats[arm].draw:+.3f} (mean {stats[arm].mean:+.3f})"
    return arm, f"thompson: {mine} vs {others}", stats


def alternate(arms: Sequence[str], index: int) -> tuple[str, str]:
    """The fixed-alternation ablation: arms in turn, no learning."""
    arm = arms[index % len(arms)]
    return arm, f"alternation: turn {index} -> {arm}"
