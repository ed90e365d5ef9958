"""Two benchmark runs compared seed for seed: does a change help, and by more than seeds move?

A sampler change is judged on the same seeds before and after it: each seed's measurement
noise and random draws are then shared, and the mean of the per-seed differences in
best/optimum is far tighter than a difference of two medians. Decide on one seed range,
confirm on another: a +0.02-0.03 gain on seeds 0-39 has more than once been +0.00 on seeds
40-119 (``benchmarks/results/README.md``, "Session 25").

Example:
    .. code-block:: bash

        python -m autoscout_optuna.benchmark --suite autoscout --contender autoscout \\
            --seeds 40 --out /tmp/before
        # ... change the sampler ...
        python -m autoscout_optuna.benchmark --suite autoscout --contender autoscout \\
            --seeds 40 --out /tmp/after
        python -m autoscout_optuna.benchmark.paired \\
            /tmp/before/autoscout/trials.csv /tmp/after/autoscout/trials.csv
        # confirm on seeds 40-119: the same two runs with --first-seed 40 --seeds 80
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from autoscout_optuna.benchmark._report import (
    FAILS_IGNORED_AT_START,
    RUN,
    ratio_curves,
    with_optimum,
)

__all__ = ["main", "markdown", "paired_against", "paired_differences"]

# Two-sided 90 % interval of a mean from its standard error (normal approximation).
Z_90 = 1.645
# A seed counts as better or worse only beyond this difference in best/optimum.
TIE = 1e-3
DEFAULT_BUDGETS = (20, 50, 100)


def paired_differences(
    before: pd.DataFrame,
    after: pd.DataFrame,
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    contender_before: str | None = None,
    contender_after: str | None = None,
) -> pd.DataFrame:
    """Per study and budget: after - before in best/optimum, over the seeds both runs have.

    Args:
        before: Per-trial rows of a benchmark run (a suite's ``trials.csv``).
        after: The same for the changed sampler.
        budgets: Trial counts to compare at; those beyond either run's length are left out.
        contender_before: The contender of ``before`` to compare; None: its only one.
        contender_after: The same for ``after``.

    Returns:
        One row per (study, budget): ``seeds``, both medians, ``mean_difference`` with its
        90 % interval half-width ``interval_90`` (normal approximation), ``better`` and
        ``worse`` (seeds that moved by more than 0.001), ``before_at_99`` / ``after_at_99``
        (seeds at 99 % of the optimum) and FAIL trials per seed after the first 20 up to the
        budget (``before_fails`` / ``after_fails``).

    Raises:
        ValueError: A contender that is missing or ambiguous, or no (study, seed) in common.
    """
    first = _one_contender(before, contender_before, "before")
    second = _one_contender(after, contender_after, "after")
    # One optimum per study for both runs: where the definition has none, ``with_optimum``
    # falls back to the best value seen, which must be the best of both runs, not of each.
    both = with_optimum(pd.concat([first.assign(_side=0), second.assign(_side=1)],
                                  ignore_index=True))
    sides = [both[both["_side"] == side].drop(columns="_side") for side in (0, 1)]
    n_trials = int(min(first["trial"].max(), second["trial"].max())) + 1
    seeds = [_per_seed(side, n_trials) for side in sides]
    return _table(*seeds, budgets=budgets, n_trials=n_trials,
                  order=list(dict.fromkeys(first["study"])))


def _per_seed(frame: pd.DataFrame, n_trials: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """best/optimum curves and late FAIL counts of one contender: rows (study, seed)."""
    return (ratio_curves(frame, n_trials).droplevel("contender"),
            _late_fails(frame, n_trials).droplevel("contender"))


def _table(
    before: tuple[pd.DataFrame, pd.DataFrame], after: tuple[pd.DataFrame, pd.DataFrame], *,
    budgets: Sequence[int], n_trials: int, order: list[str],
) -> pd.DataFrame:
    """One row per (study, budget) over the (study, seed) rows both sides have."""
    common = before[0].index.intersection(after[0].index)
    if common.empty:
        raise ValueError("the two runs share no (study, seed): nothing to pair")
    rows = []
    for study in sorted(common.get_level_values("study").unique(), key=order.index):
        keys = [key for key in common if key[0] == study]
        for budget in sorted(b for b in set(budgets) if 1 <= b <= n_trials):
            rows.append(_row(study, budget, before[0].loc[keys, budget].to_numpy(),
                             after[0].loc[keys, budget].to_numpy(),
                             [before[1].loc[keys, budget], after[1].loc[keys, budget]]))
    return pd.DataFrame(rows)


REQUIRED = ("study", "contender", "seed", "trial", "state", "direction", "optimum",
            "best_true_so_far", "is_real_run", "true_value")


def paired_against(
    trials: pd.DataFrame, reference: str, *, budgets: Sequence[int] = DEFAULT_BUDGETS
) -> pd.DataFrame:
    """Every other contender of one run against ``reference``, seed for seed.

    Returns:
        :func:`paired_differences` of each contender (``after``) against ``reference``
        (``before``), one block per contender in the run's order, with a ``contender`` column.

    A contender that shares no (study, seed) with ``reference`` (re-run on another seed range
    and merged into the run) is left out with a warning: it has nothing to pair, and the others
    still do.

    Raises:
        ValueError: ``reference`` is not a contender of ``trials``, or no other contender shares
            a (study, seed) with it.
    """
    names = list(dict.fromkeys(trials["contender"]))
    if reference not in names:
        raise ValueError(f"the run has no contender {reference!r}; it has {names}")
    _one_contender(trials, reference, "compared")  # the columns a trials table needs
    # The reference's curves are computed once, with every contender's (and the optimum
    # ``with_optimum`` falls back to is the best any contender saw, as in the summary).
    frame = with_optimum(trials)
    last = frame.groupby("contender")["trial"].max()
    n_all = int(last.max()) + 1
    curves, fails = ratio_curves(frame, n_all), _late_fails(frame, n_all)
    def side(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        return (curves.xs(name, level="contender"), fails.xs(name, level="contender"))
    order = list(dict.fromkeys(trials["study"]))
    others = [name for name in names if name != reference]
    if not others:
        raise ValueError(f"the run has no contender besides {reference!r}")
    seeds = curves.xs(reference, level="contender").index
    unpaired = [name for name in others
                if seeds.intersection(curves.xs(name, level="contender").index).empty]
    if len(unpaired) == len(others):
        raise ValueError(f"no contender shares a (study, seed) with {reference!r}: "
                         "nothing to pair")
    if unpaired:
        warnings.warn(f"left out of the comparison with {reference!r}, sharing no (study, "
                      f"seed) with it: {', '.join(map(repr, unpaired))}", stacklevel=2)
    tables = [
        _table(side(reference), side(name), budgets=budgets, order=order,
               n_trials=int(min(last[reference], last[name])) + 1).assign(contender=name)
        for name in others if name not in unpaired
    ]
    table = pd.concat(tables, ignore_index=True)
    return table[["contender", *[c for c in table.columns if c != "contender"]]]


def _one_contender(frame: pd.DataFrame, contender: str | None, label: str) -> pd.DataFrame:
    missing = [column for column in REQUIRED if column not in frame.columns]
    if missing:
        raise ValueError(f"the {label} run is not a benchmark trials table: it lacks "
                         f"{', '.join(missing)}")
    names = list(dict.fromkeys(frame["contender"]))
    if contender is None:
        if len(names) != 1:
            raise ValueError(f"the {label} run has contenders {names}: name one "
                             f"(--{label}-contender)")
        return frame
    if contender not in names:
        raise ValueError(f"the {label} run has no contender {contender!r}; it has {names}")
    return frame[frame["contender"] == contender]


def _late_fails(frame: pd.DataFrame, n_trials: int) -> pd.DataFrame:
    """FAIL trials after the first 20, counted up to each budget: rows (study, contender,
    seed)."""
    late = frame.assign(late=(frame["state"] == "FAIL")
                        & (frame["trial"] >= FAILS_IGNORED_AT_START))
    counts = late.pivot_table(index=RUN, columns="trial", values="late", aggfunc="sum")
    counts = counts.reindex(columns=range(n_trials)).fillna(0).cumsum(axis=1)
    counts.columns = range(1, n_trials + 1)
    return counts


def interval_90(differences: np.ndarray) -> float:
    """Half-width of the normal 90 % interval of the mean of per-seed ``differences``; NaN
    with one seed."""
    if len(differences) < 2:
        return math.nan
    return Z_90 * float(np.std(differences, ddof=1)) / math.sqrt(len(differences))


def _row(study: str, budget: int, a: np.ndarray, b: np.ndarray,
         fails: list[pd.Series]) -> dict:
    difference = b - a
    return {
        "study": study,
        "budget": budget,
        "seeds": len(difference),
        "before_median": float(np.median(a)),
        "after_median": float(np.median(b)),
        "mean_difference": float(difference.mean()),
        "interval_90": interval_90(difference),
        "better": int((difference > TIE).sum()),
        "worse": int((difference < -TIE).sum()),
        "before_at_99": int((a >= 0.99 - 1e-12).sum()),
        "after_at_99": int((b >= 0.99 - 1e-12).sum()),
        "before_fails": float(fails[0].mean()),
        "after_fails": float(fails[1].mean()),
    }


def markdown(table: pd.DataFrame) -> str:
    """The table of :func:`paired_differences` (or :func:`paired_against`, then with a
    contender column) as markdown, one line per row."""
    named = "contender" in table.columns
    lines = [
        ("| contender " if named else "")
        + "| study | budget | seeds | median before -> after | after - before (90 %) "
        "| better / worse | at 99 % | FAIL after 20 per seed |",
        ("|---" if named else "") + "|---|---:|---:|---|---|---|---|---|",
    ]
    for row in table.itertuples(index=False):
        lines.append(
            (f"| {row.contender} " if named else "")
            + f"| {row.study} | {row.budget} | {row.seeds} "
            f"| {row.before_median:.3f} -> {row.after_median:.3f} "
            f"| {row.mean_difference:+.4f} +- {_interval(row.interval_90)} "
            f"| {row.better} / {row.worse} | {row.before_at_99} -> {row.after_at_99} "
            f"| {row.before_fails:.1f} -> {row.after_fails:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _interval(half_width: float) -> str:
    return f"{half_width:.4f}" if math.isfinite(half_width) else "n/a (one seed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autoscout_optuna.benchmark.paired",
        description="Compare two benchmark runs (trials.csv) seed for seed.",
    )
    parser.add_argument("before", type=Path, help="trials.csv of the run before the change")
    parser.add_argument("after", type=Path, nargs="?",
                        help="trials.csv of the run after it (omitted: with --against, "
                             "BEFORE's contenders against one of them)")
    parser.add_argument("--against", metavar="NAME",
                        help="compare every contender of BEFORE with contender NAME")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS),
                        help="trial counts to compare at (default: 20 50 100)")
    parser.add_argument("--before-contender", help="contender of BEFORE (default: its only one)")
    parser.add_argument("--after-contender", help="contender of AFTER (default: its only one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints the markdown table, returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.after is None) == (args.against is None):
        parser.print_usage(sys.stderr)
        print("give either AFTER or --against NAME", file=sys.stderr)
        return 2
    if min(args.budgets) < 1:
        print(f"--budgets must be trial counts >= 1, got {args.budgets}", file=sys.stderr)
        return 2
    paths = [args.before] if args.after is None else [args.before, args.after]
    frames = []
    for path in paths:
        if not path.is_file():
            print(f"no such file: {path}", file=sys.stderr)
            return 2
        try:
            frames.append(pd.read_csv(path))
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
            print(f"cannot read {path} as a trials table: {error}", file=sys.stderr)
            return 2
    try:
        if args.against is not None:
            table = paired_against(frames[0], args.against, budgets=args.budgets)
        else:
            table = paired_differences(
                *frames, budgets=args.budgets, contender_before=args.before_contender,
                contender_after=args.after_contender,
            )
    except ValueError as error:
        print(f"cannot compare {' with '.join(map(str, paths))}: {error}", file=sys.stderr)
        return 2
    if table.empty:  # every budget beyond the runs: a table of headers alone said nothing
        print(f"cannot compare {' with '.join(map(str, paths))}: no budget of "
              f"{args.budgets} is within the trials both runs have", file=sys.stderr)
        return 2
    print(markdown(table), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
