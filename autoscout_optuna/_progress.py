"""A progress line for ``study.optimize``: trials done, best so far, real vs simulated runs.

On a terminal the line redraws in place; anywhere else (CI logs, pipes) it prints one plain line
per finished trial, so logs stay readable. It is an Optuna callback and reads only the finished
trial plus counters it keeps for this run, so it costs nothing per trial.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna._keys import FAILURE_REASON, FIDELITY

if TYPE_CHECKING:
    from autoscout_optuna._confirm import Confirmation, ConfirmedConfig


class ProgressReporter:
    """Optuna callback that reports the search as it goes.

    Counts "real" runs (COMPLETE trials: the value was measured), "simulated" ones (PRUNED trials:
    the simulator's estimate was trusted and the real run skipped) and failed ones (FAIL:
    infeasible configs), with the best real value so far.

    Args:
        n_trials: Trials planned in this run (None when only a timeout bounds it).
        metric: Unit shown after the best value, such as ``"tokens/s"``.
        stream: Where to write; ``sys.stderr`` by default.
        is_tty: Redraw one line in place; by default, whether ``stream`` is a terminal.

    Example:
        .. code-block:: python

            import optuna
            from autoscout_optuna._progress import ProgressReporter

            study = optuna.create_study()
            reporter = ProgressReporter(n_trials=5)
            study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=5,
                           callbacks=[reporter])
            reporter.close()
    """

    def __init__(
        self,
        *,
        n_trials: int | None,
        metric: str = "",
        stream: TextIO | None = None,
        is_tty: bool | None = None,
    ) -> None:
        if n_trials is not None and n_trials < 0:
            raise ValueError(f"n_trials must be >= 0 or None, got {n_trials}")
        self.n_trials = n_trials
        self.metric = metric
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = _isatty(self.stream) if is_tty is None else is_tty
        self.done = 0
        self.real = 0
        self.simulated = 0
        self.failed = 0
        self._started = time.monotonic()
        self._drawn = False

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.done += 1
        if trial.state == TrialState.COMPLETE:
            self.real += 1
        elif trial.state == TrialState.PRUNED:
            self.simulated += 1
        elif trial.state == TrialState.FAIL:
            self.failed += 1
        self._write(self.line(study, trial))

    def line(self, study: optuna.Study, trial: FrozenTrial) -> str:
        """The progress text after ``trial`` finished (no newline)."""
        total = "?" if self.n_trials is None else str(self.n_trials)
        elapsed = time.monotonic() - self._started
        outcome = _OUTCOME.get(trial.state, trial.state.name.lower())
        if trial.state == TrialState.FAIL:
            outcome += f" ({failure_text(trial)})"
        return (
            f"[{self.done}/{total}] trial {trial.number} {outcome:<16} "
            f"best {_best_text(study, self.metric)} | real {self.real} simulated "
            f"{self.simulated} failed {self.failed} | {elapsed:.0f}s"
        )

    def close(self) -> None:
        """End the redrawn line so that what follows starts on a fresh one."""
        if self.is_tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _write(self, text: str) -> None:
        if self.is_tty:
            # \r plus clear-to-end-of-line redraws in place, even when the new line is shorter.
            self.stream.write("\r\x1b[K" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def summary_text(study: optuna.Study, added: int | None = None) -> str:
    """The end-of-run table: best config, its value, gain over the default, trial counts.

    Args:
        study: A single-objective study.
        added: Trials this run added, shown in the header when given.
    """
    from autoscout_optuna._dashboard import format_knob, summarize

    summary = summarize(study)
    unit = f" {summary.metric}" if summary.metric else ""
    rows = [
        ("real runs", f"{summary.real} (measured)"),
        ("simulated", f"{summary.simulated} (simulator estimate trusted, real run saved)"),
        ("failed", f"{summary.failed} (infeasible, crashed or stopped: see failure_reason)"
                   + (f"; {summary.predicted_failures} of them predicted by the simulator, "
                      "no run spent" if summary.predicted_failures else "")
                   + (f"; {summary.never_run} of them never ran (interrupted, a dead "
                      "worker's or a duplicate)" if summary.never_run else "")),
    ]
    if summary.best_value is None:
        rows.append(("best", "no real run completed yet"))
    else:
        noiseless = ("" if summary.best_true_value is None
                     else f", noiseless {format_value(summary.best_true_value)}")
        rows.append(("best", f"{format_value(summary.best_value)}{unit} "
                             f"(trial #{summary.best_number}{noiseless})"))
        # what a real run measured besides the objective (runners record tokens/s and MFU)
        best_attrs = study.trials[summary.best_number].user_attrs
        measured = [show(best_attrs[key]) for key, show in
                    (("tokens_per_s", lambda v: f"{format_value(v)} tokens/s"),
                     ("mfu", lambda v: f"{v:.1%} MFU"))  # a share of the peak
                    if isinstance(best_attrs.get(key), (int, float))]
        if measured:
            rows.append(("best run", ", ".join(measured)))
    calibration = memory_calibration_text(study)
    if calibration is not None:
        rows.append(("memory formula", calibration))
    if summary.default_value is not None:
        gain = summary.gain_over_default
        rows.append(("default config", f"{format_value(summary.default_value)}{unit}"))
        rows.append(("gain over default", "n/a" if gain is None else f"{gain:.2f}x"))
    confirmed = summary.confirmed_best
    if confirmed is not None:
        rows += confirmation_rows(summary.confirmation, unit)
    lines = [f"Study {summary.study_name!r} ({summary.direction}): {summary.n_trials} trials"
             + ("" if added is None else f", {added} added by this run")]
    lines += [f"  {label:<18} {text}" for label, text in rows]
    best_params = summary.ship_params
    if best_params:
        lines.append("Best configuration" + (" (confirmed)" if confirmed is not None else "")
                     + ":")
        lines += [f"  {knob:<28} {format_knob(value)}"
                  + (" (pinned)" if knob in summary.pinned else "")
                  for knob, value in sorted(best_params.items())]
        unused = [f"{k}={format_knob(v)}" for k, v in sorted(summary.pinned.items())
                  if k in summary.pins_unused]
        if unused:  # left out of the config to ship: say so, or the pin seems lost
            lines.append(f"  (pinned but not asked by this config's structure: "
                         f"{', '.join(unused)})")
    return "\n".join(lines)


def confirmation_rows(confirmation: Confirmation, unit: str) -> list[tuple[str, str]]:
    """The summary's rows for the confirmation runs (``autoscout_optuna._confirm``)."""
    rows = []
    best, default = confirmation.best, confirmation.default
    if best is not None:
        rows.append(("confirmed best", f"{_mean_text(best, unit)}, config of trial "
                                       f"#{best.number}"
                                       + (" (the default config)" if best.is_default else "")))
    if best is not None and confirmation.changed_winner:
        single = next((c for c in confirmation.candidates
                       if c.number == confirmation.single_best), None)
        if single is not None:
            rows.append(("", f"(the best single run's config, trial #{single.number}: "
                             f"{_mean_text(single, unit)})"))
    if default is not None and default is not best:
        rows.append(("confirmed default", _mean_text(default, unit)))
    gain, spread = confirmation.gain_over_default, confirmation.gain_stderr
    if gain is not None:
        rows.append(("confirmed gain", f"{gain:.2f}x"
                     + ("" if spread is None else f" +- {spread:.2f}") + " (mean over mean)"))
    for config in confirmation.candidates:
        if config.failures:
            rows.append(("failed to confirm", f"config of trial #{config.number}: "
                         f"{', '.join(config.failures)} in {len(config.failures)} of "
                         f"{config.runs + len(config.failures)} runs"))
    return rows


def _mean_text(config: ConfirmedConfig, unit: str) -> str:
    spread = "" if config.stderr is None else f" +- {format_value(config.stderr)}"
    return f"{format_value(config.mean)}{spread}{unit}, mean of {config.runs} runs"


def memory_calibration_text(study: optuna.Study) -> str | None:
    """How the measured peaks read the study's memory formula (``memory_estimate``), as the
    latest plan calibrated it; None where no plan did (no formula, or no explore trial yet)."""
    from autoscout_optuna.samplers._mcts.sampler import FEASIBILITY_KEY

    for trial in reversed(study.get_trials(deepcopy=False)):
        record = trial.user_attrs.get(FEASIBILITY_KEY)
        found = record.get("memory_calibration") if isinstance(record, dict) else None
        if not isinstance(found, dict):
            continue
        text = (f"peak = {found['scale']:.2f} x formula + {found['overhead']:.2f} of capacity"
                + (" + a per-structure correction" if found.get("residual") else "")
                + f", error {found['sigma']:.0%} (trial #{trial.number})")
        if not found.get("informative", True):
            text += "; it does not follow the peaks, failures teach the learned models"
        return text
    return None


_OUTCOME = {TrialState.COMPLETE: "real", TrialState.PRUNED: "simulated", TrialState.FAIL: "failed"}


def failure_text(trial: FrozenTrial) -> str:
    """A FAIL trial's reason, marked when the simulator predicted it and no run was spent."""
    reason = str(trial.user_attrs.get(FAILURE_REASON, "error"))
    # A simulator-refused config carries the reason it would fail with (``timeout``, ``oom``);
    # bare, that reads like a run that hung or crashed.
    return f"{reason}, predicted" if is_predicted_failure(trial) else reason


def real_value(trial: FrozenTrial) -> float | None:
    """A COMPLETE trial's finite value (a measurement); None for anything else."""
    if trial.state != TrialState.COMPLETE or trial.value is None or not math.isfinite(trial.value):
        return None
    return float(trial.value)


def is_predicted_failure(trial: FrozenTrial) -> bool:
    """A FAIL the simulator predicted (it refused the config): no real run was spent on it."""
    return trial.state == TrialState.FAIL and trial.user_attrs.get(FIDELITY) == "simulator"


def _best_text(study: optuna.Study, metric: str) -> str:
    # study.best_value raises when no trial is COMPLETE (all pruned or failed so far).
    try:
        value = study.best_value
    except ValueError:
        return "- (no real run yet)"
    unit = f" {metric}" if metric else ""
    return f"{format_value(value)}{unit}"


def format_value(value: float) -> str:
    """Four significant digits, without scientific notation for everyday magnitudes."""
    if value is None or not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) >= 1e7 or abs(value) < 1e-3):
        return f"{value:.4g}"
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
