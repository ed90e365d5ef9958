"""Ready-made studies, one per module; importable as ``autoscout_optuna.studies``.

Each module defines ``definition(**options) -> StudyDefinition``. ``load`` also takes the path of
a ``.py`` file: such a file is code and runs with your privileges, like any Python import.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path
from typing import Any

from autoscout_optuna._study_definition import StudyDefinition


def names() -> list[str]:
    """Names of the bundled studies."""
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def load(name: str, **options: Any) -> StudyDefinition:
    """Build a study by bundled name (``"llm_training"``) or by the path of a ``.py`` file.

    Raises:
        ValueError: unknown name, or a file without a ``definition`` function.
    """
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"study file {name!r} does not exist")
        spec = importlib.util.spec_from_file_location(f"autoscout_user_study_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    elif name in names():
        module = importlib.import_module(f"{__name__}.{name}")
    else:
        raise ValueError(f"unknown study {name!r}; bundled studies: {', '.join(names())}")
    if not hasattr(module, "definition"):
        raise ValueError(f"study {name!r} has no definition(**options) function")
    return module.definition(**options)
