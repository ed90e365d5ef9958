"""What optuna-dashboard shows about a study: a note that explains the search, and its plots.

Per trial, the samplers and the pruner already write their decisions as user attrs (arm, reason,
fidelity, ...), which the dashboard lists. Per study, :func:`publish` keeps a markdown note current
(best config, how the budget was split between arms, how wrong the simulator has been, how many
real runs it saved) and uploads PNG plots as study artifacts linked from the note. Plots are
re-written in place under the same artifact ids on every update, so a resumed or repeated run
never piles up stale copies.

Everything here is derived from the trials in storage, so any worker (or ``autoscout show``) can
refresh it. matplotlib and optuna_dashboard are imported lazily: ``import autoscout_optuna`` stays
light.
"""

from __future__ import annotations

import datetime
import math
import statistics
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _storage
from autoscout_optuna._confirm import (
    Confirmation,
    ConfirmedConfig,
    gain_ratio,
    never_made,
    read_confirmation,
)
from autoscout_optuna._keys import (
    ARM,
    DEFAULT_CONFIG,
    PINS_UNUSED,
    SIM_ERROR,
    STUDY_OPTIONS,
    TRUE_VALUE,
)
from autoscout_optuna._progress import format_value, is_predicted_failure, real_value

ORDER_KEY = "mcts:order"  # the feature priority order MCTSSampler used for a trial
ARTIFACT_IDS_KEY = "autoscout:dashboard_artifacts"  # study user attr: plot file -> artifact id
METRIC_KEY = "autoscout:metric"  # study user attr written by the CLI: unit of the value
DEFAULT_VALUE_KEY = "autoscout:default_value"  # study user attr: the default config's value
NO_ARM = "(none)"


@dataclass(frozen=True)
class SearchSummary:
    """A study's search in numbers, as the note and ``autoscout show`` present it."""

    study_name: str
    direction: str
    n_trials: int
    real: int  # COMPLETE: measured for real
    simulated: int  # PRUNED with an estimate: the simulator's word was taken, a real run saved
    failed: int  # FAIL, including ``predicted_failures``
    best_number: int | None
    best_value: float | None
    best_true_value: float | None  # reference studies: the best trial's noiseless value
    best_params: Mapping[str, Any]
    metric: str
    default_value: float | None
    arms: Mapping[str, Mapping[str, Any]]  # arm -> {trials, real, simulated, failed, best}
    simulator_errors: list[tuple[int, float]] = field(default_factory=list)  # (trial, rel. err)
    predicted_failures: int = 0  # FAIL predicted by the simulator: no real run was spent
    # FAIL without a run: interrupted, a dead worker's, a duplicate or unrun confirmation trial
    never_run: int = 0
    confirmation: Confirmation | None = None  # re-runs of the top configs, when any were made
    pinned: Mapping[str, Any] = field(default_factory=dict)  # knobs the study fixed (--fix)
    # pinned knobs the config to ship does not hold: its structure never asks them (vpp, pp=1)
    pins_unused: frozenset[str] = frozenset()

    @property
    def confirmed_best(self) -> ConfirmedConfig | None:
        """The config to ship after confirmation runs (``autoscout_optuna._confirm``); None
        without them."""
        return self.confirmation.best if self.confirmation is not None else None

    @property
    def ship_params(self) -> dict[str, Any]:
        """The whole config to ship: the confirmed best's params, else the best real run's,
        and the knobs the study pinned (never trial params, as they are never suggested) that
        its structure asks."""
        confirmed = self.confirmed_best
        params = confirmed.params if confirmed is not None else self.best_params
        if confirmed is None and self.best_number is None:
            return {}  # no real run: nothing to ship
        pins = {k: v for k, v in self.pinned.items() if k not in self.pins_unused}
        return {**pins, **params}

    @property
    def gain_over_default(self) -> float | None:
        """How many times better the best real value is than the default's (>1 is better)."""
        # The default is measured noiselessly where the study can: compare like with like.
        best = self.best_true_value if self.best_true_value is not None else self.best_value
        return gain_ratio(best, self.default_value, self.direction)

    def to_record(self) -> dict[str, Any]:
        """The summary as plain JSON data (``autoscout show --json``), the config to ship first:
        the confirmed best where confirmation runs were made, else the best real run's.

        Numbers that are not finite are ``None`` (JSON has no NaN); params are as the study
        stored them.
        """
        confirmed = self.confirmed_best
        if confirmed is not None:
            ship = {"source": "confirmed", "trial": confirmed.number, "params": self.ship_params}
        elif self.best_number is not None:
            ship = {"source": "best_run", "trial": self.best_number, "params": self.ship_params}
        else:
            ship = None
        return {
            "study": self.study_name,
            "direction": self.direction,
            "metric": self.metric or None,
            "ship": ship,
            "pinned": dict(self.pinned),
            "trials": {"finished": self.n_trials, "real": self.real,
                       "simulated": self.simulated, "failed": self.failed,
                       "predicted_failures": self.predicted_failures,
                       "never_run": self.never_run},
            "best_run": None if self.best_number is None else {
                "trial": self.best_number, "value": _number(self.best_value),
                "noiseless_value": _number(self.best_true_value),
                "params": dict(self.best_params)},
            "default_value": _number(self.default_value),
            "gain_over_default": _number(self.gain_over_default),
            "confirmation": None if self.confirmation is None else _confirmation_record(
                self.confirmation),
        }


def _confirmation_record(confirmation: Confirmation) -> dict[str, Any]:
    return {
        "gain_over_default": _number(confirmation.gain_over_default),
        "gain_stderr": _number(confirmation.gain_stderr),
        "changed_winner": confirmation.changed_winner,
        "candidates": [  # best first, as the confirmation ranks them
            {"trial": c.number, "is_default": c.is_default, "runs": c.runs,
             "mean": _number(c.mean), "stderr": _number(c.stderr),
             "failures": list(c.failures), "params": dict(c.params)}
            for c in confirmation.candidates
        ],
    }


def summarize(study: optuna.Study) -> SearchSummary:
    """Count, rank and pair up the trials of a single-objective ``study``."""
    trials = _fresh_trials(study)
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    complete = [t for t in trials if real_value(t) is not None]
    best = (max if maximize else min)(complete, key=real_value) if complete else None
    arms: dict[str, dict[str, Any]] = {}
    for trial in trials:
        if not trial.state.is_finished():
            continue
        row = arms.setdefault(
            str(trial.user_attrs.get(ARM, NO_ARM)),
            {"trials": 0, "real": 0, "simulated": 0, "failed": 0, "best": None},
        )
        row["trials"] += 1
        kind = _kind(trial)
        row[kind] += 1
        value = real_value(trial)
        if value is not None and (
            row["best"] is None or (value > row["best"] if maximize else value < row["best"])
        ):
            row["best"] = value
    user_attrs = study.user_attrs
    counts = Counter(_kind(t) for t in trials if t.state.is_finished())
    confirmation = read_confirmation(trials, maximize=maximize)
    ship = confirmation.best if confirmation is not None and confirmation.best else best
    ship_trial = next((t for t in trials if ship is not None and t.number == ship.number), None)
    return SearchSummary(
        study_name=study.study_name,
        direction="maximize" if maximize else "minimize",
        n_trials=sum(counts.values()),
        real=counts["real"],
        simulated=counts["simulated"],
        failed=counts["failed"],
        best_number=None if best is None else best.number,
        best_value=None if best is None else real_value(best),
        best_true_value=None if best is None else _number(best.user_attrs.get(TRUE_VALUE)),
        best_params={} if best is None else dict(best.params),
        metric=str(user_attrs.get(METRIC_KEY, "")),
        default_value=_default_value(user_attrs, trials),
        arms=arms,
        simulator_errors=_simulator_errors(trials),
        predicted_failures=sum(1 for t in trials if is_predicted_failure(t)),
        never_run=sum(1 for t in trials if t.state == TrialState.FAIL and never_made(t)),
        confirmation=confirmation,
        pinned=dict((user_attrs.get(STUDY_OPTIONS) or {}).get("fixed") or {}),
        pins_unused=frozenset(() if ship_trial is None
                              else ship_trial.user_attrs.get(PINS_UNUSED, ())),
    )


def note_markdown(summary: SearchSummary, plot_links: Mapping[str, str] | None = None) -> str:
    """The study note: what was found, and why the search went where it did."""
    unit = f" {summary.metric}" if summary.metric else ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## AutoScout: {summary.study_name}",
        "",
        f"_Updated {now}. {summary.n_trials} finished trials: {summary.real} real runs, "
        f"{summary.simulated} simulated (real runs saved by simulators), "
        f"{summary.failed} failed{_predicted_text(summary)}; {summary.direction}._",
        "",
        "### Best configuration",
    ]
    confirmed = summary.confirmed_best
    if summary.best_value is None:
        lines += ["", "No real run has completed yet."]
    else:
        best = f"**{format_value(summary.best_value)}{unit}** (trial #{summary.best_number}" + (
            "" if summary.best_true_value is None
            else f", noiseless {format_value(summary.best_true_value)}") + ")"
        if summary.default_value is not None:
            gain = summary.gain_over_default
            best += f"; default config {format_value(summary.default_value)}{unit}, gain " + (
                "n/a" if gain is None else f"**{gain:.2f}x**")
        if confirmed is not None:
            # the config to ship is the confirmed one, not the luckiest single run
            best = (f"Confirmed: **{format_value(confirmed.mean)}{unit}**, mean of "
                    f"{confirmed.runs} runs of the config of trial #{confirmed.number}"
                    + (" (the default config)" if confirmed.is_default else "")
                    + f" (see Confirmation below). Best single run: {best}")
        lines += ["", best]
        lines += ["", "| knob | value |", "|---|---|"]
        lines += [f"| {k} | {format_knob(v)}{' (pinned)' if k in summary.pinned else ''} |"
                  for k, v in sorted(summary.ship_params.items())]
    lines += _confirmation_markdown(summary, unit)
    lines += ["", "### Arm allocation", "",
              "Which sub-optimizer proposed each trial (user attr `autoscout:arm`).", "",
              "| arm | trials | real | simulated | failed | best real |", "|" + "---|" * 6]
    for arm, row in sorted(summary.arms.items(), key=lambda item: -item[1]["trials"]):
        best = "-" if row["best"] is None else format_value(row["best"])
        lines.append(f"| {arm} | {row['trials']} | {row['real']} | {row['simulated']} | "
                     f"{row['failed']} | {best} |")
    lines += ["", "### Simulator", ""]
    errors = [e for _, e in summary.simulator_errors]
    if errors:
        recent = errors[-10:]
        lines.append(f"Median relative error of the step-0 estimate against the real value: "
                     f"{statistics.median(errors):.1%} over {len(errors)} trials with both, "
                     f"{statistics.median(recent):.1%} over the last {len(recent)}.")
    else:
        lines.append("No trial has both a simulator estimate and a real value yet.")
    if summary.n_trials:
        lines.append("")  # a paragraph of its own: markdown joins adjacent lines
        lines.append(f"Trials saved by simulators: {summary.simulated} of {summary.n_trials} "
                     f"({summary.simulated / summary.n_trials:.0%}).")
    if plot_links:
        lines += ["", "### Plots", ""]
        for title, url in plot_links.items():
            lines += [f"**{title}**", "", f"![{title}]({url})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _confirmation_markdown(summary: SearchSummary, unit: str) -> list[str]:
    """The confirmed configs, best first, with the mean of their runs (see ``_confirm``)."""
    confirmation = summary.confirmation
    if confirmation is None or confirmation.best is None:
        return []
    lines = ["", "### Confirmation", "",
             "The top configs run again (trials with user attr `autoscout:confirms`), ranked by "
             "the mean of those runs (the search's runs of a config, on which it was picked, "
             "are the lucky ones and stay out; the default config's all count); a config that "
             "failed a run ranks last.", "",
             "| config of trial | runs | mean | std. error | the search measured | failed runs |",
             "|" + "---|" * 6]
    for config in confirmation.candidates:
        name = f"#{config.number}" + (" (default)" if config.is_default else "")
        error = "-" if config.stderr is None else format_value(config.stderr)
        searched = ", ".join(format_value(v) for v in config.searched) or "-"
        lines.append(f"| {name} | {config.runs} | {format_value(config.mean)}{unit} | {error} "
                     f"| {searched} | {', '.join(config.failures) or '-'} |")
    gain, spread = confirmation.gain_over_default, confirmation.gain_stderr
    if gain is not None:
        lines += ["", f"Confirmed gain over the default config: **{gain:.2f}x**"
                  + ("" if spread is None else f" +- {spread:.2f} (standard error)")
                  + " (mean over mean)."]
    return lines


def render_plots(study: optuna.Study, out_dir: str | Path) -> dict[str, Path]:
    """Write the PNG plots that have data to ``out_dir``; returns title -> file."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed: CI, servers, workers
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trials = [t for t in _fresh_trials(study) if t.state.is_finished()]
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    plots = {
        "Best so far by arm": ("best_so_far_by_arm.png", _plot_best_by_arm),
        "Simulator error over time": ("simulator_error.png", _plot_simulator_error),
        "Feature priority order over time": ("feature_order.png", _plot_feature_order),
    }
    written: dict[str, Path] = {}
    for title, (filename, draw) in plots.items():
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        try:
            if not draw(ax, trials, maximize):
                continue  # nothing to show yet: no empty plot in the note
            ax.set_title(title)
            fig.tight_layout()
            fig.savefig(out_dir / filename)
            written[title] = out_dir / filename
        finally:
            plt.close(fig)
    return written


def publish(study: optuna.Study, *, artifact_dir: str | Path) -> str:
    """Refresh the study's note and plot artifacts; returns the note text.

    Args:
        study: A single-objective study.
        artifact_dir: Folder of the ``FileSystemArtifactStore`` that ``autoscout dashboard``
            serves (same folder for every worker of the study).
    """
    from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact
    from optuna_dashboard import save_note

    artifact_dir = Path(artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    store = FileSystemArtifactStore(artifact_dir)
    known = {meta.artifact_id for meta in get_all_artifact_meta(study)}
    ids = dict(study.user_attrs.get(ARTIFACT_IDS_KEY, {}))
    links: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="autoscout-plots-") as plots_dir:
        for title, path in render_plots(study, plots_dir).items():
            artifact_id = ids.get(path.name)
            if artifact_id in known:
                with open(path, "rb") as f:  # same id, new content: the note's link stays valid
                    store.write(artifact_id, f)
            else:
                artifact_id = upload_artifact(
                    artifact_store=store, file_path=str(path), study_or_trial=study
                )
                ids[path.name] = artifact_id
            links[title] = f"/artifacts/{_storage.study_id(study)}/{artifact_id}"
    study.set_user_attr(ARTIFACT_IDS_KEY, ids)
    text = note_markdown(summarize(study), links)
    save_note(study, text)
    return text


def serve(storage: Any, *, host: str, port: int, artifact_dir: str | Path) -> None:
    """Run optuna-dashboard on ``host:port`` with the artifact store; blocks until stopped."""
    import optuna_dashboard
    from optuna.artifacts import FileSystemArtifactStore

    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    optuna_dashboard.run_server(
        storage, host=host, port=port, artifact_store=FileSystemArtifactStore(artifact_dir)
    )


def _plot_best_by_arm(ax: Any, trials: list[FrozenTrial], maximize: bool) -> bool:
    better = max if maximize else min
    by_arm: dict[str, list[FrozenTrial]] = {}
    for trial in trials:
        by_arm.setdefault(str(trial.user_attrs.get(ARM, NO_ARM)), []).append(trial)
    drew = False
    for arm, arm_trials in sorted(by_arm.items()):
        real = [(t.number, real_value(t)) for t in arm_trials if real_value(t) is not None]
        estimates = [(t.number, t.intermediate_values[max(t.intermediate_values)])
                     for t in arm_trials if _kind(t) == "simulated"]
        if not real and not estimates:
            continue
        drew = True
        color = ax.plot([], [])[0].get_color()  # next colour of the cycle, one per arm
        if real:
            xs, ys = zip(*real, strict=True)
            best = [better(ys[: i + 1]) for i in range(len(ys))]
            ax.step(xs, best, where="post", color=color, label=f"{arm}: best so far")
            ax.scatter(xs, ys, color=color, s=14)
        if estimates:
            xs, ys = zip(*estimates, strict=True)
            ax.scatter(xs, ys, color=color, marker="x", s=14, label=f"{arm}: simulated")
    if drew:
        ax.set_xlabel("trial")
        ax.set_ylabel("value (dots real, crosses simulator estimates)")
        ax.legend(fontsize="small")
    return drew


def _plot_simulator_error(ax: Any, trials: list[FrozenTrial], maximize: bool) -> bool:
    errors = _simulator_errors(trials)
    if not errors:
        return False
    xs, ys = zip(*errors, strict=True)
    ax.scatter(xs, [100 * y for y in ys], s=14, label="|estimate - real| / |real|")
    window = 5
    medians = [100 * statistics.median(ys[max(0, i - window + 1): i + 1]) for i in range(len(ys))]
    ax.plot(xs, medians, color="black", label=f"running median ({window})")
    # The pruner's own yardstick, recorded per trial: the fraction of mis-ordered pairs.
    rank = [(t.number, 100 * t.user_attrs[SIM_ERROR]) for t in trials
            if isinstance(t.user_attrs.get(SIM_ERROR), (int, float))]
    if rank:
        ax.step(*zip(*rank, strict=True), where="post", color="tab:red",
                label="pruner's rank error (discordant pairs)")
    ax.set_xlabel("trial")
    ax.set_ylabel("error (%)")
    ax.legend(fontsize="small")
    return True


def _plot_feature_order(ax: Any, trials: list[FrozenTrial], maximize: bool) -> bool:
    orders = [(t.number, t.user_attrs[ORDER_KEY]) for t in trials
              if isinstance(t.user_attrs.get(ORDER_KEY), list) and t.user_attrs[ORDER_KEY]]
    if not orders:
        return False
    features = list(dict.fromkeys(name for _, order in orders for name in order))
    for name in features:
        points = [(n, order.index(name) + 1) for n, order in orders if name in order]
        ax.step(*zip(*points, strict=True), where="post", label=str(name))
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.invert_yaxis()  # rank 1 (decided first) at the top
    ax.set_xlabel("trial")
    ax.set_ylabel("tree level (1 = decided first)")
    ax.legend(fontsize="small", ncol=2)
    return True


def format_knob(value: Any) -> str:
    """A knob value for people: floats to 6 significant digits, the rest as is."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _predicted_text(summary: SearchSummary) -> str:
    if not summary.predicted_failures:
        return ""
    return f" ({summary.predicted_failures} predicted by the simulator, no run spent)"


def _fresh_trials(study: optuna.Study) -> list[FrozenTrial]:
    # Not the samplers' cached view: outside a trial it can lag behind (e.g. the last trial of
    # an optimize() call), and a summary must count every trial in storage.
    return study.get_trials(deepcopy=False)


def _kind(trial: FrozenTrial) -> str:
    if real_value(trial) is not None:
        return "real"
    if trial.state == TrialState.PRUNED and trial.intermediate_values:
        return "simulated"
    return "failed"


def _default_value(user_attrs: Mapping[str, Any], trials: list[FrozenTrial]) -> float | None:
    """Measured beside the study (reference studies: noiselessly), else read from its trial."""
    value = _number(user_attrs.get(DEFAULT_VALUE_KEY))
    return value if value is not None else default_trial_value(trials)


def default_trial(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The trial the CLI queued to run the default config (user attr
    ``autoscout:default_config``), None if there is none."""
    return next((t for t in trials if t.user_attrs.get(DEFAULT_CONFIG)), None)


def default_trial_value(trials: list[FrozenTrial]) -> float | None:
    """The default config's value as the study measured it: the trial the CLI queued to run
    it (user attr ``autoscout:default_config``) or, if that run was lost (its worker died and
    the sampler re-proposed the config), the first real trial with the same params; the
    noiseless value where the study records one. None before any of them has a real value.
    """
    marked = default_trial(trials)
    if marked is None or not marked.params:  # not queued, or still waiting to run
        return None
    for trial in trials:
        if trial.params == marked.params and real_value(trial) is not None:
            true_value = _number(trial.user_attrs.get(TRUE_VALUE))
            return true_value if true_value is not None else real_value(trial)
    return None


def _simulator_errors(trials: list[FrozenTrial]) -> list[tuple[int, float]]:
    """(trial number, |estimate - real| / |real|) for trials with a step-0 estimate and a value."""
    errors = []
    for trial in trials:
        real = real_value(trial)
        estimate = trial.intermediate_values.get(0)
        if real is None or estimate is None or not math.isfinite(estimate) or real == 0:
            continue
        errors.append((trial.number, abs(estimate - real) / abs(real)))
    return errors
