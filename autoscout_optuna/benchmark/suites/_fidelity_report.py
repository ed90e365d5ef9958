"""Real runs to 99% of the optimum, per seed, with censoring made explicit (fidelity suite).

A seed that never reaches a level within its real-run budget is *censored*: it counts as its
real-run total + 1 (it would have needed at least one more), and every table says how many
seeds reached. A median over seeds that more than half never reached is itself only a lower
bound, and a ratio of two such numbers is marked as a bound (or "n/a" when both are).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd

LEVELS = (0.95, 0.99)


def run_stats(trials: pd.DataFrame) -> pd.DataFrame:
    """Per (study, contender, seed): real runs to 95% / 99% of the optimum (censored seeds:
    real-run total + 1, with ``reached_95`` / ``reached_99`` False), real runs used in all,
    and the final best/optimum."""
    from autoscout_optuna.benchmark._report import RUN, with_optimum

    frame = with_optimum(trials)
    rows = []
    for key, run in frame.groupby(RUN, sort=False):
        real = run["is_real_run"].astype(bool).cumsum().to_numpy()
        ratio = run["best_ratio"].to_numpy()
        total = int(real[-1]) if real.size else 0
        row = dict(zip(RUN, key, strict=True))
        for level in LEVELS:
            name = round(100 * level)
            hit = np.flatnonzero(ratio >= level - 1e-12)
            row[f"reached_{name}"] = bool(hit.size)
            row[f"real_runs_to_{name}"] = float(real[hit[0]]) if hit.size else float(total + 1)
        row["real_runs_total"] = total
        row["trials"] = int(len(run))
        row["final_best_ratio"] = float(ratio[-1]) if ratio.size else 0.0
        rows.append(row)
    return pd.DataFrame(rows)


def censored_median(values: pd.Series, reached: pd.Series) -> tuple[float, bool]:
    """Median over all seeds (censored ones at total + 1), and whether it is only a lower
    bound (the median seed, or one of the two middle seeds, never reached)."""
    order = np.argsort(values.to_numpy(), kind="stable")
    sorted_reached = reached.to_numpy()[order]
    n = len(order)
    middle = sorted_reached[[(n - 1) // 2, n // 2]] if n else np.array([False])
    return float(np.median(values)), not bool(np.all(middle))


def ratio_text(baseline: tuple[float, bool], contender: tuple[float, bool]) -> str:
    """``baseline / contender`` real runs, as a bound where censoring makes it one."""
    (base, base_censored), (mine, mine_censored) = baseline, contender
    if base_censored and mine_censored:
        return "n/a (both censored)"
    ratio = base / mine
    if base_censored:
        return f">= {ratio:.2f}x"
    if mine_censored:
        return f"<= {ratio:.2f}x"
    return f"{ratio:.2f}x"


def real_runs_table(stats: pd.DataFrame, baseline: str) -> list[str]:
    """Markdown lines: per study and contender, real runs to 99% (and 95%) with censoring."""
    lines = [
        "| study | contender | seeds reaching 99% | real runs to 99%, median (all seeds) "
        "| vs sampler alone | median of seeds that reached | seeds reaching 95% "
        "| real runs to 95%, median | vs sampler alone | real runs used (median) "
        "| trials (median) | final best/opt (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for study, per_study in stats.groupby("study", sort=False):
        medians = {
            (contender, level): censored_median(runs[f"real_runs_to_{level}"],
                                                runs[f"reached_{level}"])
            for contender, runs in per_study.groupby("contender", sort=False)
            for level in (95, 99)
        }
        for contender, runs in per_study.groupby("contender", sort=False):
            cells = [study, contender]
            for level in (99, 95):
                median = medians[(contender, level)]
                reached = runs[f"reached_{level}"]
                cells += [f"{int(reached.sum())}/{len(runs)}", _bound(median)]
                alone = medians.get((baseline, level))  # None: a run without the baseline
                cells.append("-" if contender == baseline or alone is None
                             else ratio_text(alone, median))
                if level == 99:
                    hits = runs.loc[reached, "real_runs_to_99"]
                    cells.append(f"{hits.median():g}" if len(hits) else "never")
            cells += [f"{runs['real_runs_total'].median():g}", f"{runs['trials'].median():g}",
                      f"{runs['final_best_ratio'].median():.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_fidelity_report(results_dir: str | Path, *, baseline: str) -> Path:
    """``real_runs.md`` and ``real_runs_vs_noise.png`` from a finished run's ``trials.csv``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(results_dir)
    stats = run_stats(pd.read_csv(directory / "trials.csv"))
    budget = int(stats["real_runs_total"].max())
    lines = real_runs_table(stats, baseline) + [
        "",
        f"A seed that never reaches a level within its budget (at most {budget} real runs) is "
        "censored: it counts as its real-run total + 1. '>=' marks a median that is only a lower "
        "bound (the middle seed never reached), and a ratio bounded by it; 'vs sampler alone' is "
        "the sampler alone's median divided by the contender's (above 1: fewer real runs).",
    ]
    (directory / "real_runs.md").write_text("\n".join(lines) + "\n")
    stats.to_csv(directory / "real_runs_per_seed.csv", index=False)

    study_names = list(dict.fromkeys(stats["study"]))
    fig, axes = plt.subplots(1, len(study_names), figsize=(5.8 * len(study_names), 4.2),
                             squeeze=False)
    grid = np.arange(0, budget + 1)
    for ax, study in zip(axes.flat, study_names, strict=False):
        per_study = stats[stats["study"] == study]
        for index, (contender, runs) in enumerate(per_study.groupby("contender", sort=False)):
            for level, style in ((99, "-"), (95, ":")):
                hits = runs.loc[runs[f"reached_{level}"], f"real_runs_to_{level}"].to_numpy()
                share = (hits[None, :] <= grid[:, None]).sum(axis=1) / len(runs)
                ax.step(grid, share, style, where="post", color=f"C{index}",
                        label=contender if level == 99 else None)
        ax.set_xlabel("real runs (COMPLETE trials)")
        ax.set_ylabel("share of seeds that reached (solid 99%, dotted 95%)")
        ax.set_title(f"{study}: {len(runs)} seeds, budget {budget} real runs", fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("real runs to 95% / 99% of the optimum, with and without a simulator",
                 fontsize=10)
    fig.tight_layout()
    path = directory / "real_runs_vs_noise.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bound(median: tuple[float, bool]) -> str:
    value, censored = median
    return f">= {value:g}" if censored else f"{value:g}"


def ensemble_throughput(study: str = "llm_serving", n_real: int = 200, n_candidates: int = 5000,
                        seed: int = 0) -> dict[str, Any]:
    """Candidates per second the ensemble scores (fit on ``n_real`` real results first).

    Configs come from random trials of the study; "with simulator" includes the study's own
    analytic simulator call per candidate, "ensemble only" scores given simulator values.
    """
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
