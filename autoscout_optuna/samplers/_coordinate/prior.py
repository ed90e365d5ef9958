"""What the study's other structures tell coordinate descent about a new one.

**Which knobs first.** Coordinate descent refines one structure at a time, and a new
structure used to start its line searches at a random knob, relearning from scratch which
knobs are flat. A flat knob costs a full line search (probes doubling out until the
plateau's ends are seen, ~6 trials), and the refine arm of ``AutoScoutSampler`` gets ~30 of
100 trials: on ``llm_serving`` (seed 40) the second structure refined spent its first 12 on
the long-prefill threshold and the token budget, flat there as they had been under the first
structure, before the sequence cap and the memory fraction, which set the goodput. Which
knobs move the score mostly carries over between structures of one system, so the cycle runs
from the knob that moved it most elsewhere to the one that moved it least.

**The noise.** A line search tells a step from a tie by the measurement noise, and a
structure had none until it repeated a point: until then every noisy difference was chased
(on ``llm_training`` 70B, seed 114, a flat bucket size took 10 trials of parabolas fitted to
noise). Measurement noise is mostly a property of the system, in percent of the value, so
until the structure has its own repeats the relative noise pooled over the study's repeated
configurations stands in.

Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prior:
    """What the rest of the study says (either may be None: nothing known).

    Attributes:
        priority: ``(d,)`` per coordinate, the order of the cyclic rule: the largest relative
            score change a line move along it produced under the other structures
            (``evidence.largest_change``), NaN where none did.
        noise: Relative standard deviation of a measurement (``relative_noise``).
    """

    priority: np.ndarray | None = None
    noise: float | None = None


def relative_noise(groups: Iterable[Sequence[float]]) -> float | None:
    """Pooled relative standard deviation of repeated measurements; None below 2 dof.

    Args:
        groups: Measurements of one configuration each (groups of one are skipped).
    """
    squares, dof = 0.0, 0
    for values in groups:
        if len(values) >= 2:
            array = np.asarray(values, dtype=float)
            level = max(abs(float(array.mean())), 1e-300)
            squares += float(np.sum(((array - array.mean()) / level) ** 2))
            dof += len(values) - 1
    return float(np.sqrt(squares / dof)) if dof >= 2 else None


def cycle(priority: np.ndarray | None) -> list[int] | None:
    """Coordinates from the highest priority to the lowest; None without any known priority.

    A knob never moved elsewhere ranks with the most sensitive known one and before it (it
    may matter, and nothing says it does not), ahead of knobs known to change little. Ties
    keep index order.
    """
    if priority is None or not np.any(np.isfinite(priority)):
        return None
    unknown = ~np.isfinite(priority)
    known = np.where(unknown, np.nanmax(priority), priority)
    return [int(i) for i in np.lexsort((np.arange(len(known)), ~unknown, -known))]
