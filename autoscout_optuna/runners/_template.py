"""``{name}`` placeholders in an argument list, filled from a config and checked by type.

The command is a list of arguments passed to ``subprocess`` without a shell, so a value can
never be parsed as shell syntax; each value is still checked against the distribution of the
parameter it came from (a string where an int was suggested is a bug upstream, not a run).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders(template: str) -> list[str]:
    """Names used in ``template`` (``{{`` and ``}}`` are literal braces)."""
    return [m.group(1) for m in _PLACEHOLDER.finditer(template) if m.group(1)]


def format_value(value: Any) -> str:
    """A config value as one argument: ``true``/``false`` for bools, full precision floats."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def check_value(name: str, value: Any, dist: BaseDistribution | None) -> None:
    """Raise ``TypeError``/``ValueError`` if ``value`` cannot be what ``dist`` suggested."""
    if value is None or not isinstance(value, (str, int, float, bool)):
        raise TypeError(f"config value {name!r} must be a str, int, float or bool, "
                        f"got {type(value).__name__}")
    if isinstance(value, str) and "\0" in value:
        raise ValueError(f"config value {name!r} contains a NUL byte")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config value {name!r} is not finite: {value}")
    if dist is None:
        return
    if isinstance(dist, IntDistribution):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"param {name!r} is an int parameter, got {type(value).__name__} "
                            f"{value!r}")
        if not dist.low <= value <= dist.high:
            raise ValueError(f"param {name!r}={value} is outside [{dist.low}, {dist.high}]")
    elif isinstance(dist, FloatDistribution):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"param {name!r} is a float parameter, got {type(value).__name__} "
                            f"{value!r}")
        if not dist.low <= value <= dist.high:
            raise ValueError(f"param {name!r}={value} is outside [{dist.low}, {dist.high}]")
    elif isinstance(dist, CategoricalDistribution):
        if not any(type(value) is type(c) and value == c for c in dist.choices):
            raise ValueError(f"param {name!r}={value!r} is not one of {list(dist.choices)}")


def render(
    templates: Sequence[str],
    config: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution] | None = None,
) -> list[str]:
    """Fill every ``{name}`` in ``templates`` from ``config``.

    Raises:
        KeyError: a placeholder names no config value.
        TypeError, ValueError: a value does not match its parameter's distribution.
    """
    distributions = distributions or {}
    for name, value in config.items():
        if name in distributions:
            check_value(name, value, distributions[name])

    def fill(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name not in config:
            raise KeyError(f"placeholder {{{name}}} has no value in the config; "
                           f"config keys: {sorted(config)}")
        value = config[name]
        check_value(name, value, distributions.get(name))
        return format_value(value)

    return [_PLACEHOLDER.sub(fill, str(template)) for template in templates]
