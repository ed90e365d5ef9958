"""The stored optima of the reference studies (``_optima.json``, written by ``_enumerate``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

OPTIMA_PATH = Path(__file__).with_name("_optima.json")


def optimum_key(study_name: str, options: Mapping[str, Any]) -> str:
    """Canonical key of a study and its resolved options in ``_optima.json``."""
    return f"{study_name}:" + json.dumps(dict(options), sort_keys=True)


def stored_optimum(study_name: str, options: Mapping[str, Any]) -> float | None:
    """The stored optimum of a study with these resolved options, or None where none was
    enumerated."""
    entry = _stored_entry(optimum_key(study_name, options))
    return None if entry is None else float(entry["value"])


def stored_config(study_name: str, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config that reaches the stored optimum of a study with these resolved options (a
    definition's ``name`` and ``options``), or None where none was enumerated."""
    entry = _stored_entry(optimum_key(study_name, options))
    return None if entry is None else dict(entry["config"])


def _stored_entry(key: str) -> dict[str, Any] | None:
    if not OPTIMA_PATH.is_file():
        return None
    return json.loads(OPTIMA_PATH.read_text()).get(key)


def store_optimum(key: str, value: float, config: Mapping[str, Any]) -> None:
    """Record an enumerated optimum (next to the study modules, wherever they are installed)."""
    stored = json.loads(OPTIMA_PATH.read_text()) if OPTIMA_PATH.is_file() else {}
    stored[key] = {"value": value, "config": dict(config)}
    OPTIMA_PATH.write_text(json.dumps(stored, indent=1, sort_keys=True, default=str) + "\n")
