"""A study file as a user would write one (tests copy it next to their database).

A conditional knob, an infeasible corner, a simulator that is biased but ranks configs right, a
default config, and options with a default budget.
"""

from autoscout_optuna import Infeasible
from autoscout_optuna._study_definition import Knobs, StudyDefinition


def definition(*, scale: float = 1.0, n_trials: int = 4, direction: str = "maximize"):
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")

    def suggest(trial):
        knobs = Knobs(trial)
        layout = knobs.categorical("layout", ["flat", "tree"], default="flat")
        config = {"layout": layout, "x": knobs.float("x", 0.0, 1.0, default=0.5)}
        if layout == "tree":
            config["depth"] = knobs.int("depth", 1, 4, default=2)
        return config

    def measure(config, rng):
        if config.get("depth") == 4:
            raise Infeasible("oom", "depth 4 does not fit")
        value = scale * (1.0 + config["x"] + 0.5 * config.get("depth", 0))
        return value * (1.0 if rng is None else float(rng.normal(1.0, 0.01)))

    return StudyDefinition(
        name="toy", direction=direction, metric="items/s", suggest=suggest,
        measure=measure, simulate=lambda config: 1.1 * measure(config, None),
        default_config={"layout": "flat", "x": 0.5}, options={"n_trials": n_trials},
    )
