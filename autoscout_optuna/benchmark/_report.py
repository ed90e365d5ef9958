"""Per-trial rows -> summary table (CSV + markdown) and a best-so-far plot.

Everything is scored on best/optimum, oriented so that 1.0 is the optimum and larger is better:
``best / optimum`` when maximizing, ``optimum / best`` when minimizing (metrics are positive,
such as tokens/s or seconds). A seed with no COMPLETE trial yet scores 0.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from autoscout_optuna.benchmark._harness import Suite

GROUP = ["study", "contender"]
RUN = ["study", "contender", "seed"]
FAILS_IGNORED_AT_START = 20  # "FAIL after 20": failures once a sampler has had time to learn
# A run "beats" a stored optimum by more than trials.csv's rounding (6 significant digits)
BEATEN_TOLERANCE = 1e-5
CSV_FLOAT_FORMAT = "%.6g"  # trials.csv and summary.csv: what a replay compares against


def with_optimum(trials: pd.DataFrame) -> pd.DataFrame:
    """Add ``optimum_used``, ``optimum_source`` and ``optimum_beaten_by`` per study.

    The definition's optimum when known; otherwise the best true value any contender found on
    that study (so the ratio is relative to the best seen, and the table says so).
    """
    frame = trials.copy()
    frame["optimum_used"] = np.nan
    frame["optimum_source"] = ""
    frame["optimum_beaten_by"] = np.nan  # best/optimum of a run that beat a stored optimum
    for _, rows in frame.groupby("study", sort=False):
        known = rows["optimum"].dropna()
        if len(known):
            optimum, source = float(known.iloc[0]), "definition"
        else:
            complete = rows.loc[rows["is_real_run"].astype(bool), "true_value"].dropna()
            maximize = rows["direction"].iloc[0] == "maximize"
            optimum = (complete.max() if maximize else complete.min()) if len(complete) else np.nan
            source = "best seen"
        frame.loc[rows.index, "optimum_used"] = optimum
        frame.loc[rows.index, "optimum_source"] = source
    maximize = frame["direction"] == "maximize"
    best = frame["best_true_so_far"].astype(float)
    ratio = np.where(maximize, best / frame["optimum_used"], frame["optimum_used"] / best)
    frame["best_ratio"] = np.nan_to_num(ratio.astype(float), nan=0.0, posinf=0.0, neginf=0.0)
    _flag_beaten_optima(frame)
    # Trials in order within each run; runs in order of appearance (the suite's order).
    run_order = frame.groupby(RUN, sort=False).ngroup()
    frame = frame.assign(_run=run_order).sort_values(["_run", "trial"], kind="stable")
    return frame.drop(columns="_run")


def _flag_beaten_optima(frame: pd.DataFrame) -> None:
    """Warn, and say so in ``optimum_source``, where a run beat a study's stored optimum.

    The stored optimum comes from a search over the space (``_enumerate.find_optimum``); a run
    that beats it proves that search missed something, and every ratio on that study is then
    too generous. The ratios are kept as they are (above 1 where beaten), not clipped.
    """
    stored = frame["optimum_source"] == "definition"
    for study, rows in frame[stored].groupby("study", sort=False):
        top = float(rows["best_ratio"].max())
        if top > 1.0 + BEATEN_TOLERANCE:
            frame.loc[rows.index, "optimum_source"] = f"definition, beaten by a run ({top:.4f}x)"
            frame.loc[rows.index, "optimum_beaten_by"] = top
            warnings.warn(
                f"study {study!r}: a run reached {top:.4f}x its stored optimum "
                f"{rows['optimum_used'].iloc[0]:g}; the optimum is stale and every ratio on "
                f"this study too generous: re-enumerate it (python -m "
                f"autoscout_optuna._enumerate <study> [options] --store)", stacklevel=3)


def ratio_curves(trials: pd.DataFrame, n_trials: int) -> pd.DataFrame:
    """best/optimum after 1..n_trials trials: rows (study, contender, seed), columns 1..n."""
    frame = trials if "best_ratio" in trials else with_optimum(trials)
    curves = frame.pivot_table(index=RUN, columns="trial", values="best_ratio", aggfunc="first")
    curves = curves.reindex(columns=range(n_trials)).ffill(axis=1).fillna(0.0)
    curves.columns = range(1, n_trials + 1)
    return curves


def trials_to_reach(trials: pd.DataFrame, fraction: float, n_trials: int) -> pd.Series:
    """Per (study, contender, seed): trials used until best/optimum >= ``fraction``.

    A seed that never gets there counts as ``n_trials + 1``.
    """
    curves = ratio_curves(trials, n_trials)
    reached = curves.to_numpy() >= fraction - 1e-12
    first = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, n_trials + 1)
    return pd.Series(first, index=curves.index, name=f"trials_to_{fraction:g}")


def real_runs_to_reach(trials: pd.DataFrame, fraction: float, n_trials: int) -> pd.Series:
    """Per seed: COMPLETE (real) trials run until best/optimum >= ``fraction``; else n+1."""
    frame = trials if "best_ratio" in trials else with_optimum(trials)
    result = {}
    for key, rows in frame.groupby(RUN, sort=True):
        hit = rows.index[rows["best_ratio"] >= fraction - 1e-12]
        if len(hit):
            upto = rows.loc[: hit[0]]
            result[key] = int(upto["is_real_run"].astype(bool).sum())
        else:
            result[key] = n_trials + 1
    index = pd.MultiIndex.from_tuples(list(result), names=RUN)
    return pd.Series(list(result.values()), index=index, name=f"real_runs_to_{fraction:g}")


def summarize(trials: pd.DataFrame, budgets: Sequence[int], n_trials: int) -> pd.DataFrame:
    """One row per (study, contender): best/optimum quartiles at each budget and the rest."""
    frame = trials if "best_ratio" in trials else with_optimum(trials)
    curves = ratio_curves(frame, n_trials)
    to95 = trials_to_reach(frame, 0.95, n_trials)
    to99 = trials_to_reach(frame, 0.99, n_trials)
    real99 = real_runs_to_reach(frame, 0.99, n_trials)
    fails = frame.assign(fail=frame["state"] == "FAIL")
    fails = fails.assign(late=fails["fail"] & (fails["trial"] >= FAILS_IGNORED_AT_START))
    per_run = fails.groupby(RUN)[["fail", "late"]].sum()
    rows = []
    for (study, contender), group in frame.groupby(GROUP, sort=False):
        runs = curves.loc[(study, contender)]
        row = {
            "study": study,
            "contender": contender,
            "n_seeds": len(runs),
            "optimum": group["optimum_used"].iloc[0],
            "optimum_source": group["optimum_source"].iloc[0],
            "optimum_beaten_by": group["optimum_beaten_by"].iloc[0],
        }
        for budget in budgets:
            if budget > n_trials:
                continue
            values = runs[budget]
            row[f"best@{budget}_median"] = values.median()
            row[f"best@{budget}_q25"] = values.quantile(0.25)
            row[f"best@{budget}_q75"] = values.quantile(0.75)
        for name, series, limit in (("95", to95, n_trials), ("99", to99, n_trials)):
            seeds = series.loc[(study, contender)]
            row[f"trials_to_{name}_median"] = seeds.median()
            row[f"reached_{name}"] = int((seeds <= limit).sum())
        row["real_runs_to_99_median"] = real99.loc[(study, contender)].median()
        row["fail_per_seed"] = per_run.loc[(study, contender), "fail"].mean()
        row[f"fail_after_{FAILS_IGNORED_AT_START}_per_seed"] = per_run.loc[
            (study, contender), "late"
        ].mean()
        row["sampler_ms_median"] = group["sampler_ms"].median()
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(summary: pd.DataFrame, budgets: Sequence[int], n_trials: int) -> str:
    """The summary as a markdown table, with a note on how each optimum was obtained."""
    shown = [b for b in budgets if f"best@{b}_median" in summary]
    header = (
        ["study", "contender", "seeds"]
        + [f"best/opt @{b} median [q25, q75]" for b in shown]
        + ["trials to 95% (seeds reached)", "trials to 99% (seeds reached)",
           "real runs to 99%", "FAIL/seed (after 20)", "sampler ms/trial"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    any_bound = False
    for row in summary.to_dict("records"):
        cells = [row["study"], row["contender"], str(row["n_seeds"])]
        cells += [
            f"{row[f'best@{b}_median']:.3f} [{row[f'best@{b}_q25']:.3f}, "
            f"{row[f'best@{b}_q75']:.3f}]"
            for b in shown
        ]
        late_fails = row[f"fail_after_{FAILS_IGNORED_AT_START}_per_seed"]
        seeds = row["n_seeds"]
        # Half the seeds or more never reached: a median within the budget averages one
        # that did with one counted as n + 1, and is only a lower bound
        half_95, half_99 = (2 * row[f"reached_{k}"] <= seeds for k in ("95", "99"))
        any_bound |= any(half and row[f"trials_to_{k}_median"] <= n_trials
                         for half, k in ((half_95, "95"), (half_99, "99")))
        cells += [
            f"{_count(row['trials_to_95_median'], n_trials, half_95)} "
            f"({row['reached_95']}/{seeds})",
            f"{_count(row['trials_to_99_median'], n_trials, half_99)} "
            f"({row['reached_99']}/{seeds})",
            _count(row["real_runs_to_99_median"], n_trials, half_99),
            f"{row['fail_per_seed']:.1f} ({late_fails:.1f})",
            f"{row['sampler_ms_median']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["", f"Medians over seeds; a seed that never reaches counts as {n_trials + 1} "
             f"(more than the {n_trials} trials run)."]
    if any_bound:
        notes[-1] += " `>=`: half the seeds never reached, so the median is a lower bound."
    for study, rows in summary.groupby("study", sort=False):
        source = rows["optimum_source"].iloc[0]
        optimum = rows["optimum"].iloc[0]
        beaten_by = float(rows["optimum_beaten_by"].iloc[0])
        if np.isfinite(beaten_by):  # set only where a run beat the definition's optimum
            notes.append(f"- `{study}`: optimum {optimum:.6g} from the study definition, "
                         f"**beaten by a run** ({beaten_by:.4f}x): stale, "
                         f"ratios on this study are too generous; re-enumerate it.")
        elif source == "definition":
            notes.append(f"- `{study}`: optimum {optimum:.6g} (from the study definition).")
        else:
            notes.append(
                f"- `{study}`: optimum unknown; ratios are relative to the best value seen across "
                f"all contenders ({optimum:.6g})."
            )
    return "\n".join(lines + notes) + "\n"


def plot_best_so_far(
    trials: pd.DataFrame, n_trials: int, path: Path, title: str = "",
    groups: Sequence[tuple[str, Sequence[str]]] = (),
) -> None:
    """One panel per study: median best/optimum vs trials, interquartile band per contender.

    With ``groups`` (``(title, contender names)`` pairs), one row of panels per group and a
    last row of the contenders no group names, each row with its own legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = ratio_curves(trials, n_trials)
    studies = list(trials["study"].unique())
    rows = _plot_rows(list(trials["contender"].unique()), groups)
    if len(rows) == 1:
        fig, rect = _single_row_figure(plt, curves, studies, rows[0][1], n_trials)
    else:
        fig, rect = _grouped_figure(plt, curves, studies, rows, n_trials), (0, 0, 1, 1)
    if title:
        fig.suptitle(f"{title}: best true value so far / optimum (dotted: 95%, 99%)")
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_rows(
    contenders: list[str], groups: Sequence[tuple[str, Sequence[str]]]
) -> list[tuple[str, list[str]]]:
    """The plot's rows: each group's contenders that ran, then those no group names."""
    if not groups:
        return [("", contenders)]
    rows = [(title, [c for c in members if c in contenders]) for title, members in groups]
    named = {c for _, members in groups for c in members}
    rows.append(("other contenders", [c for c in contenders if c not in named]))
    return [(title, members) for title, members in rows if members] or [("", contenders)]


def _grouped_figure(
    plt: Any, curves: pd.DataFrame, studies: list[str], rows: list[tuple[str, list[str]]],
    n_trials: int,
) -> Any:
    """One row of panels per group, each with its legend beside its last panel (the colours
    are the row's own)."""
    fig, axes = plt.subplots(len(rows), len(studies), squeeze=False,
                             figsize=(5.2 * len(studies) + 4.6, 4.0 * len(rows)))
    for (row_title, members), row_axes in zip(rows, axes, strict=True):
        for ax, study in zip(row_axes, studies, strict=True):
            _draw_panel(ax, curves, study, members, n_trials)
        row_axes[0].set_ylabel(f"{row_title}\nbest / optimum (median, IQR band)")
        row_axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                            fontsize=8)
    return fig


def _single_row_figure(
    plt: Any, curves: pd.DataFrame, studies: list[str], contenders: list[str], n_trials: int
) -> tuple[Any, tuple[float, float, float, float]]:
    """Up to three panels a row, one legend for the figure below them; the figure and the
    rectangle its panels may fill."""
    n_cols = min(len(studies), 3)
    n_rows = math.ceil(len(studies) / n_cols)
    # The legend goes below the panels with as many columns as fit the figure's width (about
    # 4 inches per label: a legend wider than the figure is cut off), the figure taller by its
    # rows.
    n_legend_cols = max(1, min(len(contenders), int(5.2 * n_cols // 4)))
    legend_inches = 0.3 * math.ceil(len(contenders) / n_legend_cols) + 0.2
    height = 4.4 * n_rows + legend_inches
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(5.2 * n_cols, height), squeeze=False, sharey=False
    )
    for ax, study in zip(axes.flat, studies, strict=False):
        _draw_panel(ax, curves, study, contenders, n_trials)
    for ax in axes[:, 0]:
        ax.set_ylabel("best / optimum (median, IQR band)")
    for ax in list(axes.flat)[len(studies):]:
        ax.set_visible(False)
    # One legend for the figure, below the panels: inside a panel it hides the curves.
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center",
               ncol=n_legend_cols, frameon=False)
    return fig, (0, legend_inches / height, 1, 1)


def _draw_panel(
    ax: Any, curves: pd.DataFrame, study: str, contenders: list[str], n_trials: int
) -> None:
    """``contenders``' median curves and IQR bands on one study."""
    from matplotlib import colormaps

    x = np.arange(1, n_trials + 1)
    colors = colormaps["tab10"]
    # Ten colours, then the same ones dashed: an eleventh contender must not look like the first.
    styles = ("-", "--", ":")
    lows = []
    for i, contender in enumerate(contenders):
        if (study, contender) not in curves.index.droplevel("seed"):
            continue
        runs = curves.loc[(study, contender)].to_numpy()
        q25, median, q75 = np.quantile(runs, [0.25, 0.5, 0.75], axis=0)
        ax.plot(x, median, color=colors(i % 10), label=f"{contender} ({len(runs)} seeds)",
                linewidth=1.8, linestyle=styles[(i // 10) % len(styles)])
        ax.fill_between(x, q25, q75, color=colors(i % 10), alpha=0.18, linewidth=0)
        lows.append(median[min(len(x) - 1, max(n_trials // 5, 1))])
    for level in (0.95, 0.99):
        ax.axhline(level, color="grey", linestyle=":", linewidth=0.8)
    # Early trials sit near 0 (nothing feasible yet); zoom on where contenders differ,
    # from the lowest median after a fifth of the budget.
    bottom = max(0.0, math.floor(20 * min(min(lows, default=0.0), 0.9)) / 20 - 0.05)
    ax.set_ylim(bottom, 1.02)
    ax.set_xlim(1, n_trials)
    ax.set_title(study, fontsize=10)
    ax.set_xlabel("trials")
    ax.grid(alpha=0.3)


def write_report(suite: Suite, trials: pd.DataFrame, directory: Path) -> pd.DataFrame:
    """Write trials.csv, summary.csv, summary.md and best_so_far.png; return the summary."""
    directory.mkdir(parents=True, exist_ok=True)
    trials.to_csv(directory / "trials.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    frame = with_optimum(trials)  # once: it warns where a run beat a stored optimum
    summary = summarize(frame, suite.budgets, suite.n_trials)
    summary.to_csv(directory / "summary.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    header = f"# {suite.name}\n\n{suite.description}\n\n" if suite.description else ""
    header += f"{suite.n_trials} trials per run, up to {suite.n_seeds} seeds.\n\n"
    (directory / "summary.md").write_text(header + markdown(summary, suite.budgets, suite.n_trials))
    plot_best_so_far(frame, suite.n_trials, directory / "best_so_far.png", title=suite.name,
                     groups=suite.plot_groups)
    return summary


def _count(value: float, n_trials: int, lower_bound: bool = False) -> str:
    if math.isnan(value):
        return "-"
    text = f"{value:g}"
    if value > n_trials:
        return f">{n_trials}"
    return f">={text}" if lower_bound else text
