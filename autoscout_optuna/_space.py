"""Structural vs dense parameters, and the normalized [0, 1] coordinates dense search works in.

By default (../DESIGN section 1) a ``CategoricalDistribution`` and any int/float domain with at
most ``MAX_STRUCTURAL_LEVELS`` values are structural (tree levels for MCTS); continuous floats and
large integer ranges are dense (coordinates for descent).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

MAX_STRUCTURAL_LEVELS = 16


def n_levels(dist: BaseDistribution) -> int | None:
    """Number of distinct values of a discrete domain; None for a continuous one."""
    if isinstance(dist, CategoricalDistribution):
        return len(dist.choices)
    if isinstance(dist, IntDistribution):
        if dist.log:
            return dist.high - dist.low + 1
        return (dist.high - dist.low) // dist.step + 1
    if isinstance(dist, FloatDistribution):
        if dist.step is None:
            return None
        return int(math.floor((dist.high - dist.low) / dist.step + 1e-8)) + 1
    raise TypeError(f"unsupported distribution {type(dist).__name__}")


def is_structural(dist: BaseDistribution, max_levels: int = MAX_STRUCTURAL_LEVELS) -> bool:
    """True for categorical and small discrete domains (tree levels); False for dense knobs."""
    if isinstance(dist, CategoricalDistribution):
        return True
    levels = n_levels(dist)
    return levels is not None and levels <= max_levels


def structure_key(
    params: Mapping[str, Any], distributions: Mapping[str, BaseDistribution]
) -> tuple[tuple[str, str], ...]:
    """A hashable key of a trial's structural params: ``(name, repr(value))`` sorted by name,
    the dense knobs left out (trials that differ only in dense values share it)."""
    return tuple((n, repr(params[n])) for n in sorted(params) if is_structural(distributions[n]))


def config_key(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A hashable key of a whole config: ``(name, repr(value))`` of every param, sorted by name
    (two trials with equal params ran the same config)."""
    return tuple(sorted((name, repr(value)) for name, value in params.items()))


def discrete_values(dist: BaseDistribution) -> list[Any]:
    """Every value of a discrete domain, in order (choices for a categorical)."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        step = 1 if dist.log else dist.step
        return list(range(dist.low, dist.high + 1, step))
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        count = n_levels(dist)
        return [float(min(dist.high, dist.low + i * dist.step)) for i in range(count)]
    raise ValueError(f"{dist!r} is continuous: it has no finite list of values")


def to_unit(dist: BaseDistribution, value: Any) -> float:
    """Map a numeric value into [0, 1]; log domains are linear in log space."""
    if isinstance(dist, CategoricalDistribution):
        raise TypeError("categorical values have no position on a line")
    low, high = float(dist.low), float(dist.high)
    if high == low:
        return 0.5
    if dist.log:
        return (math.log(float(value)) - math.log(low)) / (math.log(high) - math.log(low))
    return (float(value) - low) / (high - low)


def from_unit(dist: BaseDistribution, u: float) -> Any:
    """Inverse of :func:`to_unit`: clipped to bounds, rounded to the domain's step or integers."""
    if isinstance(dist, CategoricalDistribution):
        raise TypeError("categorical values have no position on a line")
    u = float(np.clip(u, 0.0, 1.0))
    low, high = float(dist.low), float(dist.high)
    if dist.log:
        raw = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        raw = low + u * (high - low)
    if isinstance(dist, IntDistribution):
        step = 1 if dist.log else dist.step
        value = dist.low + int(round((raw - dist.low) / step)) * step
        return int(min(max(value, dist.low), dist.high))
    if dist.step is not None:
        value = low + round((raw - low) / dist.step) * dist.step
        return float(min(max(value, low), high))
    return float(min(max(raw, low), high))


def contains(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is a legal value of ``dist`` (used to reuse values across trials)."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False
