"""Samplers side by side on the reference studies: tables and plots under ``benchmarks/results``.

Example:
    .. code-block:: bash

        python -m autoscout_optuna.benchmark --suite baselines --quick --out /tmp/bench

``main`` is also what ``autoscout bench`` delegates to.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from autoscout_optuna.benchmark._harness import Contender, Suite, TimedSampler, run_suite
from autoscout_optuna.benchmark._report import summarize

__all__ = ["Contender", "Suite", "TimedSampler", "main", "run_suite", "summarize"]

DEFAULT_OUT = Path("benchmarks") / "results"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autoscout_optuna.benchmark",
        description="Run benchmark suites; write CSV, markdown and PNG per suite.",
    )
    parser.add_argument("--suite", nargs="+", action="extend", default=[], metavar="NAME",
                        help="suite or suite-module name (repeatable); default: all suites")
    parser.add_argument("--seeds", type=int, help="seeds per (study, contender)")
    parser.add_argument("--first-seed", type=int,
                        help="first seed (default 0): decide on one range, confirm on another")
    parser.add_argument("--study", nargs="+", action="extend", default=[], metavar="TEXT",
                        help="run only the studies whose label contains TEXT (repeatable); merged "
                             "into the stored trials.csv like --contender")
    parser.add_argument("--trials", type=int, help="trials per run")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--contender", nargs="+", action="extend", default=[], metavar="NAME",
                        help="re-run only these contenders and merge them into the suite's "
                             "existing trials.csv (the others' rows are kept as they are)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets, for smoke tests")
    parser.add_argument("--rescore", action="store_true",
                        help="run nothing: rewrite the named suites' reports from their stored "
                             "trials.csv with the studies' current optima (after a study's "
                             "optimum was re-enumerated; no search reads the optimum)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"results root, one folder per suite (default {DEFAULT_OUT})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    for name in ("seeds", "trials", "workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"--{name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.first_seed is not None and args.first_seed < 0:
        print(f"--first-seed must be >= 0, got {args.first_seed}", file=sys.stderr)
        return 2
    from autoscout_optuna.benchmark import suites as registry

    try:
        chosen = (registry.find(args.suite, quick=args.quick) if args.suite
                  else registry.all_suites(quick=args.quick))
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if not args.suite:
        print("no --suite named; running all: " + ", ".join(s.name for s in chosen))
    command = "python -m autoscout_optuna.benchmark " + shlex.join(argv)
    if args.rescore:
        return _rescore_all(chosen, args, command)
    # Every suite's names are checked before any suite runs: a name the second suite lacks
    # must not cost the first suite's whole run (written, then exit 2).
    plans = []
    for suite in chosen:
        suite = _override(suite, seeds=args.seeds, trials=args.trials,
                          first_seed=args.first_seed)
        known = [c.name for c in suite.contenders]
        unknown = [name for name in args.contender if name not in known]
        if unknown:  # a misspelt name is an error, not a silently smaller run
            print(f"suite {suite.name} has no contender named {', '.join(unknown)}; "
                  f"it has {', '.join(known)}", file=sys.stderr)
            return 2
        rerun = _only(suite, args.contender)
        if args.study:
            rerun = _studies(rerun, args.study)
            if rerun is None:
                print(f"suite {suite.name} has no study whose label contains "
                      f"{' or '.join(map(repr, args.study))}; it has "
                      f"{', '.join(suite.study_labels())}", file=sys.stderr)
                return 2
        stored = None
        if args.contender or args.study:  # merged into the stored results: read them first
            try:
                stored = _read_trials(args.out / suite.name / "trials.csv", missing_ok=True)
            except ValueError as error:
                print(f"cannot merge into the stored results: {error}", file=sys.stderr)
                return 2
        plans.append((suite, rerun, stored))
    for suite, rerun, stored in plans:
        print(f"== suite {suite.name}: {len(suite.definitions)} studies x "
              f"{len(rerun.contenders)} contenders x {suite.n_seeds} seeds x "
              f"{suite.n_trials} trials", flush=True)
        restricted = bool(args.contender or args.study)  # merged into the stored results
        frame = run_suite(rerun, None if restricted else args.out, n_workers=args.workers,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
        if restricted:
            _merge_into_report(suite, frame, args.out / suite.name, stored)
        if suite.extra_report is not None and not args.quick:
            suite.extra_report(args.out / suite.name)
        _log_command(args.out, suite.name, command.strip())
        print((args.out / suite.name / "summary.md").read_text(), flush=True)
    return 0


def _override(
    suite: Suite, *, seeds: int | None, trials: int | None, first_seed: int | None = None
) -> Suite:
    changes: dict = {}
    if first_seed is not None:
        changes["first_seed"] = first_seed
    if seeds is not None:
        changes["n_seeds"] = seeds
    if trials is not None:
        changes["n_trials"] = trials
        changes["budgets"] = [b for b in suite.budgets if b <= trials] or [trials]
    return dataclasses.replace(suite, **changes) if changes else suite


def _only(suite: Suite, names: list[str]) -> Suite:
    """``suite`` restricted to the named contenders (all when none named)."""
    if not names:
        return suite
    groups = [(title, [n for n in members if n in names]) for title, members in suite.plot_groups]
    return dataclasses.replace(
        suite, contenders=[c for c in suite.contenders if c.name in names],
        plot_groups=[(title, members) for title, members in groups if members],
    )


def _studies(suite: Suite, texts: list[str]) -> Suite | None:
    """``suite`` restricted to the studies whose label contains one of ``texts`` (None if none)."""
    kept = [(label, definition) for label, definition
            in zip(suite.study_labels(), suite.definitions, strict=True)
            if any(text in label for text in texts)]
    if not kept:
        return None
    labels, definitions = zip(*kept, strict=True)
    return dataclasses.replace(suite, definitions=list(definitions), labels=list(labels))


def _merge_into_report(
    suite: Suite, fresh: pd.DataFrame, directory: Path, stored: pd.DataFrame | None = None
) -> None:
    """Replace the rows of the re-run (study, contender) pairs in ``directory/trials.csv``;
    rewrite the report.

    Runs are seeded and independent, so the other contenders' stored rows are what a full run
    would produce again: re-running only what changed saves the slow baselines (GP).
    ``stored``: ``directory/trials.csv`` as read before the run (None: read it now).
    """
    from autoscout_optuna.benchmark._report import write_report

    stored_path = directory / "trials.csv"
    if stored is None:
        stored = _read_trials(stored_path, missing_ok=True)
    if stored is None:
        stored = fresh.iloc[0:0]
    # replaced per (study, contender): a re-run restricted with --study keeps the other studies
    rerun = pd.MultiIndex.from_frame(fresh[["study", "contender"]].drop_duplicates())
    kept = stored[~pd.MultiIndex.from_frame(stored[["study", "contender"]]).isin(rerun)]
    # Replaced on other seeds (--seeds, --first-seed): allowed, but the stored seeds are gone
    # and the pair no longer runs on the seeds the others ran; say so, not silently.
    for (study, contender), old in stored.groupby(["study", "contender"], sort=False):
        if (study, contender) in rerun:
            new = fresh.loc[(fresh["study"] == study) & (fresh["contender"] == contender)]
            lost = sorted(set(old["seed"]) - set(new["seed"]))
            if lost:
                print(f"{stored_path}: {contender!r} on {study!r}: stored seeds "
                      f"{_seed_text(lost)} dropped, replaced by seeds "
                      f"{_seed_text(sorted(set(new['seed'])))}", file=sys.stderr)
    merged = pd.concat([kept, fresh], ignore_index=True)
    # Stored rows of a study or contender the suite no longer has (renamed, dropped) stay, after
    # the suite's own in their stored order: failing here would lose the run just made.
    for column, known in (("study", suite.study_labels()),
                          ("contender", [c.name for c in suite.contenders])):
        gone = list(dict.fromkeys(name for name in kept[column] if name not in known))
        order = {name: index for index, name in enumerate([*known, *gone])}
        merged[f"_{column}"] = merged[column].map(order)
        if gone:
            print(f"{stored_path}: kept the stored rows of {column} "
                  f"{', '.join(map(repr, gone))}, which suite {suite.name} no longer has",
                  file=sys.stderr)
    keys = ["_study", "_contender", "seed", "trial"]  # the job order of a full run
    merged = merged.sort_values(keys, kind="stable").drop(columns=["_study", "_contender"])
    write_report(suite, merged.reset_index(drop=True), directory)


def _rescore_all(chosen: list[Suite], args: argparse.Namespace, command: str) -> int:
    """``--rescore``: every chosen suite's stored results re-scored, or an error naming what
    is missing or what cannot go with it (nothing is rewritten then)."""
    shaping = [name for name in ("seeds", "trials", "first_seed")
               if getattr(args, name) is not None]
    shaping += [name for name in ("contender", "study", "quick") if getattr(args, name)]
    if shaping:
        print(f"--rescore runs nothing, so it takes no --{', --'.join(shaping)}".replace("_", "-"),
              file=sys.stderr)
        return 2
    missing = [str(args.out / s.name / "trials.csv") for s in chosen
               if not (args.out / s.name / "trials.csv").is_file()]
    if missing:
        print(f"--rescore needs stored results; missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    stored = {}  # every file read and checked before any is rewritten
    for suite in chosen:
        path = args.out / suite.name / "trials.csv"
        try:
            stored[suite.name] = _read_trials(path)
        except ValueError as error:
            print(f"--rescore: {error}", file=sys.stderr)
            return 2
        if stored[suite.name].empty:
            print(f"--rescore: {path} holds no trials", file=sys.stderr)
            return 2
    for suite in chosen:
        _rescore(suite, args.out / suite.name, stored[suite.name])
        _log_command(args.out, suite.name, command.strip())
        print((args.out / suite.name / "summary.md").read_text(), flush=True)
    return 0


def _rescore(suite: Suite, directory: Path, trials: pd.DataFrame | None = None) -> None:
    """Set the ``optimum`` column of ``directory/trials.csv`` to each study's current optimum
    and rewrite the reports derived from it (``Suite.rescore_report`` too).

    A stored optimum that a better search raised makes every ratio on that study too generous;
    the samplers never read it, so the stored trials stand and only the scoring changes.
    """
    from autoscout_optuna.benchmark._report import write_report

    if trials is None:
        trials = _read_trials(directory / "trials.csv")
    trials["optimum"] = trials["optimum"].astype(float)  # a round optimum reads back as int
    for label, definition in zip(suite.study_labels(), suite.definitions, strict=True):
        if definition.optimum is not None:
            trials.loc[trials["study"] == label, "optimum"] = float(definition.optimum)
    write_report(suite, trials, directory)
    if suite.rescore_report is not None:
        suite.rescore_report(directory)


def _seed_text(seeds: list[int]) -> str:
    """``0-39`` for a contiguous range, else the seeds."""
    if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _read_trials(path: Path, *, missing_ok: bool = False) -> pd.DataFrame | None:
    """A stored ``trials.csv`` (None where it is missing and ``missing_ok``).

    Raises:
        ValueError: the file is not a benchmark trials table (empty, unparsable, or lacking a
            column a run writes), naming it: a traceback from deep inside pandas named neither.
    """
    from autoscout_optuna.benchmark._harness import COLUMNS

    if missing_ok and not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as error:
        raise ValueError(f"{path} is not a benchmark trials table ({error})") from error
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"{path} is not a benchmark trials table: it lacks "
                         f"{', '.join(missing)}")
    return frame


def _log_command(out: Path, suite_name: str, command: str) -> None:
    """Append what produced ``<out>/<suite_name>`` to ``<out>/README.md``."""
    readme = out / "README.md"
    if not readme.exists():
        readme.write_text("# Benchmark results\n\n## Runs\n\n")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with readme.open("a") as handle:
        handle.write(f"- {stamp}, suite `{suite_name}` -> `{suite_name}/`: `{command}`\n")
