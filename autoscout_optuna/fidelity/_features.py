"""Configs -> a numeric feature matrix, one column group per knob (pure numpy)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# A numeric knob spanning more than this ratio is encoded in log space (batch sizes, learning
# rates): effects on throughput are closer to linear in log(value).
LOG_RATIO = 8.0
Z_LIMIT = 2.5  # standardized values are clipped to +-Z_LIMIT
# A numeric knob with at most this many distinct values (tp, pipeline stages, micro-batch) also
# gets one column per value: such knobs switch code paths, so their effect need not be smooth,
# and a quadratic in log(value) cannot express a simulator bias that is fixed per value.
MAX_ONE_HOT_LEVELS = 8


@dataclass(frozen=True)
class _Numeric:
    name: str
    log: bool
    mean: float
    scale: float
    sometimes_missing: bool
    levels: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Categorical:
    name: str
    levels: tuple[Any, ...]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


class FeatureEncoder:
    """Standardized numeric knobs (value and square), one-hot categorical knobs.

    A knob missing from a config (a conditional parameter) encodes as the mean, with a
    presence indicator, so conditional spaces need no special case downstream.
    """

    def __init__(self, specs: list[_Numeric | _Categorical]) -> None:
        self._specs = specs
        self.groups: dict[str, list[int]] = {}
        column = 0
        for spec in specs:
            width = _width(spec)
            self.groups[spec.name] = list(range(column, column + width))
            column += width
        self.n_columns = column

    @classmethod
    def fit(cls, configs: Sequence[Mapping[str, Any]]) -> FeatureEncoder:
        names: dict[str, None] = {}
        for config in configs:
            names.update(dict.fromkeys(config))
        specs: list[_Numeric | _Categorical] = []
        for name in names:
            values = [c[name] for c in configs if name in c]
            missing = len(values) < len(configs)
            if all(_is_number(v) and math.isfinite(float(v)) for v in values):
                numbers = np.asarray(values, dtype=float)
                log = bool(np.all(numbers > 0) and numbers.max() / numbers.min() > LOG_RATIO)
                if log:
                    numbers = np.log(numbers)
                scale = float(numbers.std())
                if scale == 0 and not missing:
                    continue  # a constant knob explains nothing
                distinct = tuple(sorted({float(v) for v in values}))
                levels = distinct if 2 < len(distinct) <= MAX_ONE_HOT_LEVELS else ()
                specs.append(
                    _Numeric(name, log, float(numbers.mean()), scale or 1.0, missing, levels)
                )
            else:
                levels = tuple(dict.fromkeys(_hashable(v) for v in values))
                if len(levels) < 2 and not missing:
                    continue
                specs.append(_Categorical(name, levels))
        return cls(specs)

    def transform(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        matrix = np.zeros((len(configs), self.n_columns))
        for spec in self._specs:
            start = self.groups[spec.name][0]
            if isinstance(spec, _Numeric):
                present = np.array([spec.name in c for c in configs], dtype=bool)
                raw = np.array(
                    [float(c[spec.name]) if spec.name in c else np.nan for c in configs],
                    dtype=float,
                )
                values = raw  # as given: the one-hot levels below compare these (NaN: absent)
                if spec.log:
                    raw = np.log(np.where(raw > 0, raw, np.nan))
                z = (raw - spec.mean) / spec.scale
                # Clipped: a value far outside what was fitted must not be extrapolated
                # (through the square term) into an absurd correction.
                z = np.clip(np.where(np.isfinite(z), z, 0.0), -Z_LIMIT, Z_LIMIT)
                matrix[:, start] = z
                matrix[:, start + 1] = z * z
                if spec.sometimes_missing:
                    matrix[:, start + 2] = present
                if spec.levels:
                    first_level = start + 2 + int(spec.sometimes_missing)
                    for offset, level in enumerate(spec.levels):
                        matrix[:, first_level + offset] = values == level
            else:
                index = {level: i for i, level in enumerate(spec.levels)}
                for row, config in enumerate(configs):
                    if spec.name in config:
                        level = index.get(_hashable(config[spec.name]))
                        if level is not None:  # unseen level: no evidence, all zeros
                            matrix[row, start + level] = 1.0
        return matrix


def _width(spec: _Numeric | _Categorical) -> int:
    if isinstance(spec, _Numeric):
        return 2 + int(spec.sometimes_missing) + len(spec.levels)
    return len(spec.levels)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)
