"""Multi-fidelity search: real runs needed to reach 99% of the optimum, with and without a
simulator, as the simulator gets noisier (issue 6; the paper's robustness claim).

Every contender uses the same sampler. ``<sampler>`` alone runs every trial for real (the
reference objective). The others run ``from_definition`` (the objective ``autoscout run``
uses: estimate, ``should_prune``, real run) with ``FidelityPruner`` defaults and a controlled
simulator: the noiseless reference value times ``max(0.05, 1 + sigma * N(0, 1))``, the noise
drawn per trial from ``(seed, trial number)``, for sigma in 0, 20, 50 and 80%; a systematically
biased simulator (the reference value times ``exp(b)``, ``b`` the sum of a fixed log-factor
in [-0.25, 0.25] per structural knob value, so whole structures are over- or under-rated); and,
with ``contenders(with_analytic=True)``, the study's own analytic simulator. Only COMPLETE
trials are real runs, and only they carry ``true_value``: a pruned trial is never "found".

``python -m autoscout_optuna.benchmark.suites.fidelity <results dir>`` writes
``real_runs.md`` and ``real_runs_vs_noise.png`` from a finished run's ``trials.csv``, and
``ensemble_throughput.json`` (candidates per second the ensemble scores).
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from autoscout_optuna._rng import trial_rng
from autoscout_optuna._space import is_structural
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.benchmark._harness import Contender, Suite

NOISE_LEVELS = (0.0, 0.2, 0.5, 0.8)
BIAS_PER_VALUE = 0.25  # largest log-factor one structural knob value adds to the biased simulator
SAMPLER = "autoscout"
LABELS = ["llm_training", "llm_serving"]
DEFAULT_RESULTS = "benchmarks/results/fidelity"


def make_sampler(seed: int) -> optuna.samplers.BaseSampler:
    from autoscout_optuna import AutoScoutSampler

    return AutoScoutSampler(seed=seed)


def make_pruner(seed: int) -> optuna.pruners.BasePruner:
    from autoscout_optuna import FidelityPruner

    return FidelityPruner()


def noisy_reference(
    definition: StudyDefinition, sigma: float, seed: int, trial: optuna.Trial, config: Mapping
) -> float:
    """The noiseless reference value times seeded multiplicative noise of std ``sigma``."""
    value = definition.measure(config, None)
    if sigma == 0:
        return value
    rng = trial_rng(seed, trial.number, "simulator-noise")
    return value * max(0.05, 1.0 + sigma * float(rng.standard_normal()))


def biased_reference(
    definition: StudyDefinition, seed: int, trial: optuna.Trial, config: Mapping
) -> float:
    """The reference value with a fixed bias per structural knob value (learnable per knob)."""
    log_bias = 0.0
    for name, distribution in trial.distributions.items():
        if is_structural(distribution):
            log_bias += BIAS_PER_VALUE * _unit_hash(f"{seed}:{name}={trial.params[name]!r}")
    return definition.measure(config, None) * math.exp(log_bias)


def analytic(definition: StudyDefinition, trial: optuna.Trial, config: Mapping) -> float:
    return definition.simulate(config)


def make_objective(kind: str, sigma: float, definition: StudyDefinition, seed: int) -> Any:
    from autoscout_optuna.fidelity import from_definition

    if kind == "noise":
        simulate = functools.partial(noisy_reference, definition, sigma, seed)
    elif kind == "biased":
        simulate = functools.partial(biased_reference, definition, seed)
    else:
        simulate = functools.partial(analytic, definition)
    return from_definition(definition, noise_seed=seed, simulate=simulate)


def contenders(*, with_analytic: bool = False) -> list[Contender]:
    """The sampler alone, then with each simulator (the study's own one on request: it is
    coarse by design, and the 2-core budget of ``make bench`` favours seeds over it)."""
    with_simulator = [
        (f"{SAMPLER}+sim noise {round(100 * s)}%", "noise", s) for s in NOISE_LEVELS
    ] + [(f"{SAMPLER}+sim biased", "biased", 0.0)]
    if with_analytic:
        with_simulator.append((f"{SAMPLER}+sim analytic", "analytic", 0.0))
    return [Contender(SAMPLER, make_sampler)] + [
        Contender(
            name,
            make_sampler,
            make_pruner=make_pruner,
            make_objective=functools.partial(make_objective, kind, sigma),
        )
        for name, kind, sigma in with_simulator
    ]


def suites(quick: bool = False) -> list[Suite]:
    from autoscout_optuna import studies

    definitions = [studies.load("llm_training"), studies.load("llm_serving")]
    if quick:
        return [Suite(
            name="fidelity", definitions=definitions, labels=LABELS, contenders=contenders(),
            n_trials=20, n_seeds=1, budgets=(10, 20), description="Smoke-test run (--quick).",
        )]
    return [Suite(
        name="fidelity",
        definitions=definitions,
        labels=LABELS,
        contenders=contenders(),
        n_trials=250,
        n_seeds=4,
        budgets=(25, 50, 100, 250),
        description=(__doc__ or "").split("\n\n")[1].replace("\n", " "),
    )]


def run_stats(trials: Any) -> Any:
    """Per (study, contender, seed): real runs to 95% / 99% of the optimum (NaN: never),
    real runs used in all, and the final best/optimum."""
    import numpy as np
    import pandas as pd

    from autoscout_optuna.benchmark._report import RUN, with_optimum

    frame = with_optimum(trials)
    rows = []
    for key, run in frame.groupby(RUN, sort=False):
        real = run["is_real_run"].astype(bool).cumsum().to_numpy()
        ratio = run["best_ratio"].to_numpy()
        row = dict(zip(RUN, key, strict=True))
        for level in (0.95, 0.99):
            hit = np.flatnonzero(ratio >= level - 1e-12)
            row[f"real_runs_to_{round(100 * level)}"] = float(real[hit[0]]) if hit.size else np.nan
        row["real_runs_total"] = int(real[-1]) if real.size else 0
        row["final_best_ratio"] = float(ratio[-1]) if ratio.size else 0.0
        rows.append(row)
    return pd.DataFrame(rows)


def write_fidelity_report(results_dir: str | Path) -> Path:
    """``real_runs.md`` and ``real_runs_vs_noise.png`` from a finished run's ``trials.csv``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    directory = Path(results_dir)
    stats = run_stats(pd.read_csv(directory / "trials.csv"))
    groups = stats.groupby(["study", "contender"], sort=False)
    lines = [
        "| study | contender | seeds reaching 99% | real runs to 99% (median of those) "
        "| real runs to 95% (median, reached) | real runs used (median) "
        "| final best/opt (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    medians: dict[tuple[str, str], float] = {}
    for (study, contender), runs in groups:
        to99, to95 = runs["real_runs_to_99"].dropna(), runs["real_runs_to_95"].dropna()
        # A seed that never reaches 99% counts as infinitely many real runs in the median.
        medians[(study, contender)] = float(np.median(runs["real_runs_to_99"].fillna(np.inf)))
        lines.append(
            f"| {study} | {contender} | {len(to99)}/{len(runs)} | "
            f"{_fmt(to99.median())} | {_fmt(to95.median())} ({len(to95)}/{len(runs)}) | "
            f"{runs['real_runs_total'].median():g} | {runs['final_best_ratio'].median():.3f} |"
        )
    lines += ["", "Median over all seeds (a seed that never reaches counts as infinite): "]
    lines += [f"- {s} / {c}: {_fmt(v)}" for (s, c), v in medians.items()]
    (directory / "real_runs.md").write_text("\n".join(lines) + "\n")

    study_names = list(dict.fromkeys(stats["study"]))
    columns = [SAMPLER] + [_noise_name(x) for x in NOISE_LEVELS] + [f"{SAMPLER}+sim biased"]
    ticks = ["no\nsimulator"] + [f"noise\n{round(100 * x)}%" for x in NOISE_LEVELS] + ["biased"]
    finite = stats[["real_runs_to_95", "real_runs_to_99"]].stack()
    ceiling = (float(finite.max()) if len(finite) else 1.0) * 1.15
    fig, axes = plt.subplots(1, len(study_names), figsize=(5.6 * len(study_names), 4.2),
                             squeeze=False)
    for ax, study in zip(axes.flat, study_names, strict=False):
        for x, contender in enumerate(columns):
            runs = stats[(stats["study"] == study) & (stats["contender"] == contender)]
            for level, marker, shift in ((95, "o", -0.12), (99, "s", 0.12)):
                values = runs[f"real_runs_to_{level}"].fillna(ceiling).to_numpy()
                ax.scatter(np.full(values.size, x + shift), values, marker=marker,
                           facecolors="none" if level == 95 else f"C{x}", edgecolors=f"C{x}",
                           label=f"to {level}%" if x == 0 else None)
        ax.axhline(ceiling, color="grey", linewidth=0.6)
        ax.text(-0.4, ceiling, "never reached", va="bottom", fontsize=7, color="grey")
        ax.set_xticks(range(len(columns)), ticks, fontsize=8)
        ax.set_ylim(0, ceiling * 1.1)
        ax.set_ylabel("real runs (COMPLETE trials), one point per seed")
        ax.set_title(f"{study}: real runs to 95% (o) / 99% (s) of optimum", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{SAMPLER} sampler + FidelityPruner defaults", fontsize=10)
    fig.tight_layout()
    path = directory / "real_runs_vs_noise.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: float) -> str:
    return "never" if not np.isfinite(value) else f"{value:g}"


def ensemble_throughput(study: str = "llm_serving", n_real: int = 200, n_candidates: int = 5000,
                        seed: int = 0) -> dict[str, float]:
    """Candidates per second the ensemble scores (fit on ``n_real`` real results first).

    Configs come from random trials of the study; "with simulator" includes the study's own
    analytic simulator call per candidate, "ensemble only" scores given simulator values.
    """
    import time

    from autoscout_optuna import studies
    from autoscout_optuna._failure import Infeasible
    from autoscout_optuna.fidelity import SimulatorEnsemble

    definition = studies.load(study)
    sampler = optuna.samplers.RandomSampler(seed=seed)
    probe = optuna.create_study(direction=definition.direction, sampler=sampler)
    configs, simulated, real = [], [], []
    while len(configs) < n_real + n_candidates:
        trial = probe.ask()
        try:
            config = definition.suggest(trial)
            value, estimate = definition.measure(config, None), definition.simulate(config)
        except Infeasible:
            probe.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        probe.tell(trial, state=optuna.trial.TrialState.FAIL)  # keep the probe study light
        configs.append(config)
        simulated.append(estimate)
        real.append(value)
    ensemble = SimulatorEnsemble(simulate=lambda c: definition.simulate(c))
    start = time.perf_counter()
    ensemble.fit(configs[:n_real], real[:n_real], simulated[:n_real])
    fit_s = time.perf_counter() - start
    candidates, candidate_sims = configs[n_real:], simulated[n_real:]
    start = time.perf_counter()
    ensemble.predict(candidates, candidate_sims)
    predict_s = time.perf_counter() - start
    start = time.perf_counter()
    ensemble.predict(candidates)  # calls the analytic simulator per candidate as well
    with_simulator_s = time.perf_counter() - start
    return {
        "fit_ms": 1000 * fit_s,
        "candidates_per_s_ensemble_only": n_candidates / predict_s,
        "candidates_per_s_with_simulator": n_candidates / with_simulator_s,
        "n_real": n_real,
        "n_candidates": n_candidates,
    }


def _noise_name(sigma: float) -> str:
    return f"{SAMPLER}+sim noise {round(100 * sigma)}%"


def _unit_hash(text: str) -> float:
    """A fixed number in [-1, 1] for ``text`` (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**63 - 1.0


if __name__ == "__main__":
    import json

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_RESULTS)
    print(write_fidelity_report(out))
    throughput = {name: ensemble_throughput(name) for name in LABELS}
    (out / "ensemble_throughput.json").write_text(json.dumps(throughput, indent=2) + "\n")
    print(json.dumps(throughput, indent=2))
