"""What confirming the winner buys: the config shipped and the gain reported, with and without.

``python -m autoscout_optuna.benchmark.confirmation [--seeds 40] [--trials 60] [--out DIR]``

Per reference study and seed, as ``autoscout run`` works: ``AutoScoutSampler`` from the expert
config (trial 0), ``--trials`` trials with the study's measurement noise, then
:func:`autoscout_optuna.confirm_best` (the top 3 configs and the default, 2 more runs each). Two
answers to "what do I ship, and how much faster is it?" are scored against the noiseless
reference:

* without confirmation: the config of the best single run, and its value over the default's
  one measured run (what a search reports by itself);
* with it: the confirmed best config, and the mean of its confirmation runs over the mean of the
  default's runs.

For each: the shipped config's true value over the optimum, and how far the reported gain is
from the shipped config's true gain over the default (``reported / true - 1``: above 0 the
report promises more than the config delivers). Writes ``confirmation.csv`` (a row per study
and seed), ``summary.md`` and ``confirmation.png`` to ``DIR/confirmation/`` (default
``benchmarks/results``). Runs on 2 cores in a few minutes: part of ``make bench``.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from autoscout_optuna.benchmark.paired import TIE, interval_90

SUITE = "confirmation"
TOP, REPEATS = 3, 2


def run_seed(label: str, definition: Any, seed: int, n_trials: int) -> dict[str, Any]:
    """One search and its confirmation; the row ``confirmation.csv`` keeps."""
    import optuna

    from autoscout_optuna import AutoScoutSampler, Infeasible, confirm_best
    from autoscout_optuna._confirm import gain_ratio
    from autoscout_optuna._keys import TRUE_VALUE
    from autoscout_optuna._objective import reference_objective
    from autoscout_optuna._space import config_key

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = optuna.create_study(direction=definition.direction,
                                sampler=AutoScoutSampler(seed=seed))
    definition.enqueue_default(study)
    objective = reference_objective(definition, noise_seed=seed)
    study.optimize(objective, n_trials=n_trials, catch=(Infeasible,))
    single = study.best_trial
    default_run = study.trials[0]
    confirmation = confirm_best(study, objective, top=TOP, repeats=REPEATS,
                                catch=(Infeasible,))
    truth = {}  # a config's noiseless value, by its params
    for trial in study.trials:
        if TRUE_VALUE in trial.user_attrs:
            truth[config_key(trial.params)] = float(trial.user_attrs[TRUE_VALUE])
    default_true = truth[config_key(default_run.params)]
    shipped = confirmation.best
    direction = definition.direction
    single_true = truth[config_key(single.params)]
    confirmed_true = truth[config_key(shipped.params)]
    return {
        "study": label, "seed": seed, "trials": n_trials, "direction": definition.direction,
        "optimum": definition.optimum,
        "default_true": default_true,
        "single_true": single_true, "confirmed_true": confirmed_true,
        "single_gain_reported": gain_ratio(single.value, default_run.value, direction),
        "single_gain_true": gain_ratio(single_true, default_true, direction),
        "confirmed_gain_reported": confirmation.gain_over_default,
        "confirmed_gain_stderr": confirmation.gain_stderr,
        "confirmed_gain_true": gain_ratio(confirmed_true, default_true, direction),
        "confirmation_trials": len(study.trials) - n_trials,
        "changed_winner": confirmation.changed_winner,
    }


def summary_markdown(rows: Sequence[dict[str, Any]], command: str) -> str:
    """Per study: the shipped config's truth and the reported gain's error, both ways."""
    lines = [
        "# confirmation", "",
        "What `confirm_best` (the top 3 configs and the default, 2 more runs each) changes in "
        "what a search ships and reports (`autoscout_optuna/benchmark/confirmation.py`). "
        "AutoScout from the expert config, the study's measurement noise; scored against the "
        "noiseless reference. Gain error: the reported gain over the default divided by the "
        "shipped config's true gain, less 1 (above 0: the report promises more than the "
        "config delivers).", "",
        f"Command: `{command}`", "",
        "| study | seeds | trials | shipped true/opt, single best (median) | confirmed "
        "(median) | confirmed - single, mean [90 % CI] | better / within 0.001 / worse | gain "
        "error, single best (median [q10, q90]) | confirmed (median [q10, q90]) | confirmed "
        "true gain within its 2 std. errors | confirmation runs (median) |",
        "|" + "---|" * 11,
    ]
    for study in dict.fromkeys(row["study"] for row in rows):
        mine = [row for row in rows if row["study"] == study]
        single = [row["single_true"] / row["optimum"] for row in mine]
        confirmed = [row["confirmed_true"] / row["optimum"] for row in mine]
        sign = 1.0 if mine[0]["direction"] == "maximize" else -1.0
        diffs = [sign * (c - s) for c, s in zip(confirmed, single, strict=True)]
        better = sum(d > TIE for d in diffs)
        worse = sum(d < -TIE for d in diffs)
        single_error = [row["single_gain_reported"] / row["single_gain_true"] - 1
                        for row in mine]
        confirmed_error = [row["confirmed_gain_reported"] / row["confirmed_gain_true"] - 1
                           for row in mine]
        covered = [abs(row["confirmed_gain_reported"] - row["confirmed_gain_true"])
                   <= 2 * row["confirmed_gain_stderr"]
                   for row in mine if row["confirmed_gain_stderr"] is not None]
        mean, half = statistics.fmean(diffs), interval_90(np.asarray(diffs))
        interval = ("n/a" if not math.isfinite(half)  # one seed: no interval
                    else f"[{mean - half:+.4f}, {mean + half:+.4f}]")
        lines.append(
            f"| {study} | {len(mine)} | {mine[0]['trials']} | {statistics.median(single):.4f} "
            f"| {statistics.median(confirmed):.4f} | {mean:+.4f} {interval} "
            f"| {better} / {len(mine) - better - worse} / {worse} "
            f"| {_spread(single_error)} | {_spread(confirmed_error)} "
            f"| {sum(covered)} of {len(covered)} "
            f"| {statistics.median(row['confirmation_trials'] for row in mine):g} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Two panels per study: shipped truth/optimum and gain error, single best vs confirmed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = list(dict.fromkeys(row["study"] for row in rows))
    fig, axes = plt.subplots(2, len(studies), figsize=(4.2 * len(studies), 7), dpi=100,
                             squeeze=False)
    for column, study in enumerate(studies):
        mine = [row for row in rows if row["study"] == study]
        truth = [[row[f"{kind}_true"] / row["optimum"] for row in mine]
                 for kind in ("single", "confirmed")]
        error = [[100 * (row[f"{kind}_gain_reported"] / row[f"{kind}_gain_true"] - 1)
                  for row in mine] for kind in ("single", "confirmed")]
        for row_index, (data, ylabel) in enumerate(
            ((truth, "shipped config: true value / optimum"),
             (error, "reported gain / true gain - 1 (%)"))
        ):
            ax = axes[row_index][column]
            ax.boxplot(data, tick_labels=["best single run", "confirmed"])
            ax.set_ylabel(ylabel)
            if row_index == 1:
                ax.axhline(0.0, color="grey", linewidth=0.8)
            else:
                ax.set_title(study)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m autoscout_optuna.benchmark.confirmation",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="seeds per study (default 40)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=60,
                        help="search trials before the confirmation (default 60)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    for name in ("seeds", "trials", "workers"):
        if getattr(args, name) < 1:
            print(f"--{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if args.first_seed < 0:
        print(f"--first-seed must be >= 0, got {args.first_seed}", file=sys.stderr)
        return 2
    from autoscout_optuna.benchmark.suites import autoscout

    suite = next(s for s in autoscout.suites() if s.name == "autoscout")
    jobs = [(label, definition, seed, args.trials)
            for label, definition in zip(suite.study_labels(), suite.definitions, strict=True)
            for seed in range(args.first_seed, args.first_seed + args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(_run_job, jobs))
    out = args.out / SUITE
    out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "confirmation.csv", index=False)
    command = "python -m autoscout_optuna.benchmark.confirmation " + shlex.join(argv)
    text = summary_markdown(rows, command.strip())
    (out / "summary.md").write_text(text)
    plot(rows, out / "confirmation.png")
    print(text)
    return 0


def _run_job(job: tuple[str, Any, int, int]) -> dict[str, Any]:
    return run_seed(*job)


def _spread(values: Sequence[float]) -> str:
    ordered = sorted(values)
    q10 = ordered[int(0.1 * (len(ordered) - 1))]
    q90 = ordered[int(round(0.9 * (len(ordered) - 1)))]
    return (f"{100 * statistics.median(values):+.1f} % [{100 * q10:+.1f}, "
            f"{100 * q90:+.1f}]")


if __name__ == "__main__":
    sys.exit(main())
