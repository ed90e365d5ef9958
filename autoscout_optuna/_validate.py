"""Type checks for constructor arguments, with messages that name the argument.

A range check such as ``not value > 0`` on a wrong type fails with Python's own
``'>' not supported between instances of 'str' and 'int'``, which does not say which argument
was wrong; a truthiness flag such as ``dense_optimizer="no"`` silently means True. Constructors
call these first, then check ranges themselves. Each function takes the arguments as keywords,
so the keyword is the name the message shows: ``reals(floor=floor, discount=discount)``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def reals(**values: Any) -> None:
    """Each value is a real number (not a bool) and not NaN."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        if math.isnan(value):
            raise ValueError(f"{name} must be a number, got nan")


def optional_reals(**values: Any) -> None:
    """Each value is None or a real number (not a bool, not NaN)."""
    reals(**{name: value for name, value in values.items() if value is not None})


def integers(**values: Any) -> None:
    """Each value is a whole number: an int (numpy ints too) or a float such as 5.0, not 2.5."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if not isinstance(value, numbers.Integral) and not float(value).is_integer():
            raise ValueError(f"{name} must be an int, got {value!r}")


def optional_integers(**values: Any) -> None:
    """Each value is None or an int."""
    integers(**{name: value for name, value in values.items() if value is not None})


def booleans(**values: Any) -> None:
    """Each value is a bool: ``"no"`` or ``None`` would silently read as a truth value."""
    for name, value in values.items():
        if not isinstance(value, bool) and type(value).__name__ != "bool_":  # numpy bool
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def optional_samplers(**values: Any) -> None:
    """Each value is None or an Optuna sampler instance."""
    from optuna.samplers import BaseSampler

    for name, value in values.items():
        if value is not None and not isinstance(value, BaseSampler):
            raise TypeError(f"{name} must be an optuna sampler or None, "
                            f"got {type(value).__name__} {value!r}")


def optional_callables(**values: Any) -> None:
    """Each value is None or callable."""
    for name, value in values.items():
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be callable or None, got {type(value).__name__} "
                            f"{value!r}")


def single_objective(study: Any, owner: str) -> None:
    """Our samplers and pruner rank one value per trial: refuse a multi-objective study."""
    if len(study.directions) > 1:
        raise ValueError(f"{owner} supports single-objective studies only")
