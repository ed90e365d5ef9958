"""Samplers side by side: each (study, contender, seed) is one Optuna study run in a worker.

Contenders and suites are plain frozen dataclasses holding picklable factories (module-level
functions or ``functools.partial``), so a job can cross a ``spawn`` process border. Every trial
becomes one row of a DataFrame; ``_report`` turns the rows into tables and a plot.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import threadpoolctl
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna import _validate
from autoscout_optuna._failure import Infeasible
from autoscout_optuna._keys import FAILURE_REASON, TRUE_VALUE
from autoscout_optuna._objective import record_failure, reference_objective
from autoscout_optuna._study_definition import StudyDefinition

ObjectiveFactory = Callable[[StudyDefinition, int], Callable[[optuna.Trial], float]]


@dataclass(frozen=True)
class Contender:
    """One way to search: a sampler (and optionally a pruner and objective) per seed.

    Attributes:
        name: Label in tables and plots, e.g. ``"tpe"``.
        make_sampler: ``make_sampler(seed)`` builds a fresh sampler.
        make_pruner: ``make_pruner(seed)``, or None for Optuna's default (no pruning happens
            unless the objective reports).
        make_objective: ``make_objective(definition, seed)``; None for the study's reference
            objective with measurement noise seeded by ``seed``.
        max_seeds: Run at most this many of the suite's seeds (for a slow sampler); None: all.
        start_from_default: Run the study's ``default_config`` (the expert's configuration) as
            the first trial, enqueued as a user would enqueue the config they run today; it
            counts against the trial budget like any other trial.
        sampler_reads_study: ``make_sampler(seed, definition)`` instead: a sampler that takes
            something the study offers (its ``memory_estimate``, say).
    """

    name: str
    make_sampler: Callable[[int], BaseSampler]
    make_pruner: Callable[[int], BasePruner] | None = None
    make_objective: ObjectiveFactory | None = None
    max_seeds: int | None = None
    start_from_default: bool = False
    sampler_reads_study: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if not callable(self.make_sampler):
            raise TypeError(f"make_sampler must be callable (seed -> sampler), "
                            f"got {self.make_sampler!r}")
        _validate.optional_callables(make_pruner=self.make_pruner,
                                     make_objective=self.make_objective)
        _validate.optional_integers(max_seeds=self.max_seeds)
        _validate.booleans(start_from_default=self.start_from_default,
                           sampler_reads_study=self.sampler_reads_study)
        if self.max_seeds is not None and self.max_seeds < 1:
            raise ValueError(f"max_seeds must be >= 1 or None, got {self.max_seeds}")


@dataclass(frozen=True)
class Suite:
    """Contenders run on study definitions, ``n_seeds`` times ``n_trials`` trials each.

    Attributes:
        name: Results go to ``<out_dir>/<name>/``.
        definitions: Studies to run on (each needs a noiseless reference, not a real job).
        contenders: What is compared.
        n_trials: Trials per (study, contender, seed).
        n_seeds: Seeds ``first_seed .. first_seed + n_seeds - 1``.
        budgets: Trial counts at which the summary reports best/optimum.
        description: One paragraph for the summary's header.
        extra_report: Called with the suite's results folder after its summary is written
            (``make bench`` then writes suite-specific tables too); None: nothing more.
        labels: Study labels in tables, one per definition; None derives them from each
            definition's name and options (so two presets of one study differ).
        first_seed: The first seed (0 by default). A change is decided on one seed range and
            confirmed on another (``python -m autoscout_optuna.benchmark.paired``): a gain of
            0.02-0.03 on 40 seeds has vanished on the next 80 more than once.
        rescore_report: Rewrites the suite-specific reports that derive from ``trials.csv``
            alone (``--rescore`` calls it after re-scoring); None: ``--rescore`` rewrites the
            summary and plot only. ``extra_report`` may also measure things; this one must not.
        plot_groups: ``(title, contender names)`` pairs: the plot draws one row of panels per
            group (a contender may appear in several), and a last row of any contender no
            group names; empty: one row of all contenders. Twenty curves in one panel cannot
            be read.
    """

    name: str
    definitions: Sequence[StudyDefinition]
    contenders: Sequence[Contender]
    n_trials: int
    n_seeds: int
    budgets: Sequence[int]
    description: str = ""
    labels: Sequence[str] | None = field(default=None)
    extra_report: Callable[[Path], Any] | None = field(default=None, compare=False)
    first_seed: int = 0
    plot_groups: Sequence[tuple[str, Sequence[str]]] = ()
    rescore_report: Callable[[Path], Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if not self.definitions or not all(
            isinstance(d, StudyDefinition) for d in self.definitions
        ):
            raise ValueError("definitions must be a non-empty sequence of StudyDefinition")
        if not self.contenders or not all(isinstance(c, Contender) for c in self.contenders):
            raise ValueError("contenders must be a non-empty sequence of Contender")
        _validate.integers(n_trials=self.n_trials, n_seeds=self.n_seeds,
                           first_seed=self.first_seed)
        if self.first_seed < 0:
            raise ValueError(f"first_seed must be >= 0, got {self.first_seed}")
        if self.n_trials < 1:
            raise ValueError(f"n_trials must be >= 1, got {self.n_trials}")
        if self.n_seeds < 1:
            raise ValueError(f"n_seeds must be >= 1, got {self.n_seeds}")
        if isinstance(self.budgets, (str, bytes)) or not isinstance(self.budgets, Sequence):
            raise TypeError(f"budgets must be a sequence of trial counts, got {self.budgets!r}")
        if not self.budgets or not all(isinstance(b, int) and b >= 1 for b in self.budgets):
            raise ValueError(f"budgets must be trial counts >= 1, got {list(self.budgets)}")
        if self.labels is not None and len(self.labels) != len(self.definitions):
            raise ValueError("labels must have one entry per definition")
        _validate.optional_callables(extra_report=self.extra_report,
                                     rescore_report=self.rescore_report)
        names = [c.name for c in self.contenders]
        if len(set(names)) != len(names):
            raise ValueError(f"contenders must have distinct names, got {names}")
        self._check_plot_groups(names)
        lacking = [d.name for d in self.definitions if d.default_config is None]
        for contender in self.contenders:
            if contender.start_from_default and lacking:
                raise ValueError(
                    f"contender {contender.name!r} starts from the default config, which "
                    f"studies {lacking} do not define (StudyDefinition.default_config)"
                )

    def _check_plot_groups(self, names: list[str]) -> None:
        groups = self.plot_groups
        if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
            raise TypeError(f"plot_groups must be a sequence of (title, contender names) "
                            f"pairs, got {groups!r}")
        titles = []
        for group in groups:
            if (not isinstance(group, tuple) or len(group) != 2
                    or not isinstance(group[0], str) or not group[0]
                    or isinstance(group[1], (str, bytes)) or not isinstance(group[1], Sequence)
                    or not group[1]):
                raise TypeError(f"plot_groups: each group must be a (non-empty title, "
                                f"non-empty sequence of contender names) pair, got {group!r}")
            unknown = [name for name in group[1] if name not in names]
            if unknown:
                raise ValueError(f"plot_groups: group {group[0]!r} names contenders the suite "
                                 f"does not have: {unknown}; it has {names}")
            titles.append(group[0])
        if len(set(titles)) != len(titles):
            raise ValueError(f"plot_groups must have distinct titles, got {titles}")

    def study_labels(self) -> list[str]:
        """One distinct label per definition."""
        labels = list(self.labels) if self.labels is not None else [
            _default_label(d) for d in self.definitions
        ]
        seen: dict[str, int] = defaultdict(int)
        unique = []
        for label in labels:
            seen[label] += 1
            unique.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
        return unique


class TimedSampler(BaseSampler):
    """Forwards everything to ``sampler`` and sums the time its hooks take, per trial number.

    Only the five hooks Optuna calls during a trial are timed; ``reseed_rng`` and every
    attribute are forwarded untouched, so the wrapped sampler behaves exactly as it would alone.
    """

    def __init__(self, sampler: BaseSampler) -> None:
        self._sampler = sampler
        self.seconds_by_trial: dict[int, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        # Guard: during unpickling ``_sampler`` is not set yet; do not recurse into ourselves.
        if name in ("_sampler", "seconds_by_trial") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._sampler, name)

    def __str__(self) -> str:
        return f"Timed({self._sampler})"

    def _timed(self, trial_number: int, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds_by_trial[trial_number] += time.perf_counter() - start

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> Any:
        return self._timed(trial.number, self._sampler.infer_relative_search_space, study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, space: Any) -> Any:
        return self._timed(trial.number, self._sampler.sample_relative, study, trial, space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, name: str, distribution: Any
    ) -> Any:
        return self._timed(
            trial.number, self._sampler.sample_independent, study, trial, name, distribution
        )

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._timed(trial.number, self._sampler.before_trial, study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Any
    ) -> None:
        self._timed(trial.number, self._sampler.after_trial, study, trial, state, values)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()


@dataclass(frozen=True)
class _Job:
    suite: str
    study: str
    definition: StudyDefinition
    contender: Contender
    seed: int
    n_trials: int


def run_suite(
    suite: Suite,
    out_dir: str | Path | None = None,
    n_workers: int = 2,
    *,
    log: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Run every (study, contender, seed) of ``suite``; one DataFrame row per trial.

    Seeds run in ``n_workers`` worker processes (1: in this process). With ``out_dir`` set,
    ``trials.csv``, ``summary.csv``, ``summary.md`` and ``best_so_far.png`` are written to
    ``<out_dir>/<suite.name>/``.
    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    jobs = [
        _Job(suite.name, label, definition, contender, seed, suite.n_trials)
        for label, definition in zip(suite.study_labels(), suite.definitions, strict=True)
        if not definition.is_real
        for contender in suite.contenders
        for seed in _seeds(suite, contender)
    ]
    rows: list[dict[str, Any]] = []
    for job, job_rows in _run_jobs(jobs, n_workers):
        rows.extend(job_rows)
        if log is not None:
            log(_job_line(job, job_rows))
    # Rows are in job order (the suite's study and contender order), trials in number order.
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    if out_dir is not None:
        from autoscout_optuna.benchmark._report import write_report

        write_report(suite, frame, Path(out_dir) / suite.name)
    return frame


def _seeds(suite: Suite, contender: Contender) -> range:
    first = int(suite.first_seed)
    return range(first, first + int(min(suite.n_seeds, contender.max_seeds or suite.n_seeds)))


COLUMNS = (
    "suite", "study", "definition", "direction", "optimum", "contender", "seed", "trial", "state",
    "value", "true_value", "best_true_so_far", "is_real_run", "is_low_fidelity",
    "failure_reason", "sampler_ms",
)


# Jobs a forked worker inherits instead of receiving them pickled (closures do not pickle).
_FORKED_JOBS: list[_Job] = []


def _run_jobs(jobs: list[_Job], n_workers: int):
    if n_workers == 1 or len(jobs) <= 1:
        for job in jobs:
            yield job, run_job(job)
        return
    global _FORKED_JOBS
    context = _context(jobs)
    # Each worker gets its share of the cores: GPSampler's torch would otherwise start one
    # thread per core in every worker and oversubscribe the machine.
    threads = max(1, (os.cpu_count() or 1) // n_workers)
    with ProcessPoolExecutor(
        max_workers=n_workers, mp_context=context, initializer=_limit_threads,
        initargs=(threads,),
    ) as pool:
        # Results come back in submission order: the log reads study by study.
        if context.get_start_method() == "fork":
            _FORKED_JOBS = jobs
            results = pool.map(_run_forked_job, range(len(jobs)))
        else:
            results = pool.map(run_job, jobs)
        try:
            yield from zip(jobs, results, strict=True)
        finally:
            _FORKED_JOBS = []


def _run_forked_job(index: int) -> list[dict[str, Any]]:
    return run_job(_FORKED_JOBS[index])


def _limit_threads(threads: int) -> None:
    # For libraries a worker loads from now on (torch reads OMP_NUM_THREADS when imported).
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = str(threads)
    # numpy's BLAS is loaded already (inherited by fork; imported by spawn to unpickle this
    # initializer) and read those variables when it was: set its pool directly. Without this
    # each worker's BLAS started one thread per core, and on busy cores those threads spin,
    # which a sampler's CPU time (``sampler_ms``) counted.
    threadpoolctl.threadpool_limits(limits=threads)
    if "torch" in sys.modules:  # inherited by fork; otherwise torch reads OMP_NUM_THREADS
        sys.modules["torch"].set_num_threads(threads)


def _context(jobs: list[_Job]) -> multiprocessing.context.BaseContext:
    """``spawn`` when every job pickles (portable); else ``fork`` where the OS has it."""
    try:
        for job in jobs:
            pickle.dumps(job)
    except Exception as error:  # closures, lambdas, local classes: anything pickle refuses
        if "fork" not in multiprocessing.get_all_start_methods():
            raise TypeError(
                f"suite {job.suite!r}: study {job.study!r} / contender {job.contender.name!r} "
                f"cannot be sent to a worker process ({error}); use module-level functions "
                "or functools.partial, or n_workers=1"
            ) from error
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def run_job(job: _Job) -> list[dict[str, Any]]:
    """One Optuna study, in memory, silenced; rows for its trials."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    contender, definition = job.contender, job.definition
    if contender.sampler_reads_study:
        sampler = TimedSampler(contender.make_sampler(job.seed, definition))
    else:
        sampler = TimedSampler(contender.make_sampler(job.seed))
    pruner = contender.make_pruner(job.seed) if contender.make_pruner is not None else None
    if contender.make_objective is not None:
        objective = contender.make_objective(definition, job.seed)
    else:
        objective = reference_objective(definition, noise_seed=job.seed)
    objective = _recording_failures(objective)
    study = optuna.create_study(direction=definition.direction, sampler=sampler, pruner=pruner)
    if contender.start_from_default:  # the suite checked that the study has one
        definition.enqueue_default(study)
    try:
        study.optimize(objective, n_trials=job.n_trials, catch=(Infeasible,))
    except Exception as error:
        raise RuntimeError(
            f"{job.suite}/{job.study}/{contender.name}/seed {job.seed}: {error!r}"
        ) from error
    return _rows(job, study.get_trials(deepcopy=False), sampler.seconds_by_trial)


def _recording_failures(
    objective: Callable[[optuna.Trial], float],
) -> Callable[[optuna.Trial], float]:
    """Record the reason of every Infeasible, also one raised where no one recorded it yet
    (a suite's own objective that does not record it itself)."""

    def recorded(trial: optuna.Trial) -> float:
        try:
            return objective(trial)
        except Infeasible as error:
            if FAILURE_REASON not in trial.user_attrs:
                record_failure(trial, error)
            raise

    return recorded


def _rows(job: _Job, trials: list[FrozenTrial], seconds: dict[int, float]) -> list[dict]:
    maximize = job.definition.direction == "maximize"
    best = math.nan
    rows = []
    for trial in trials:
        value = _value(trial)
        true_value = float(trial.user_attrs.get(TRUE_VALUE, value))
        is_real = trial.state == TrialState.COMPLETE and math.isfinite(true_value)
        if is_real and (math.isnan(best) or (true_value > best if maximize else true_value < best)):
            best = true_value
        rows.append({
            "suite": job.suite,
            "study": job.study,
            "definition": job.definition.name,
            "direction": job.definition.direction,
            "optimum": math.nan if job.definition.optimum is None else job.definition.optimum,
            "contender": job.contender.name,
            "seed": job.seed,
            "trial": trial.number,
            "state": trial.state.name,
            "value": value,
            "true_value": true_value,
            "best_true_so_far": best,
            "is_real_run": trial.state == TrialState.COMPLETE,
            "is_low_fidelity": trial.state == TrialState.PRUNED,
            "failure_reason": trial.user_attrs.get(FAILURE_REASON, ""),
            "sampler_ms": 1000.0 * seconds.get(trial.number, 0.0),
        })
    return rows


def _value(trial: FrozenTrial) -> float:
    """COMPLETE: the value; PRUNED: the last reported (low-fidelity) value; else NaN."""
    if trial.state == TrialState.COMPLETE and trial.value is not None:
        return float(trial.value)
    if trial.state == TrialState.PRUNED and trial.intermediate_values:
        return float(trial.intermediate_values[max(trial.intermediate_values)])
    return math.nan


def _default_label(definition: StudyDefinition) -> str:
    if not definition.options:
        return definition.name
    variant = ",".join(f"{key}={value}" for key, value in sorted(definition.options.items()))
    return f"{definition.name}[{variant}]"


def _job_line(job: _Job, rows: list[dict[str, Any]]) -> str:
    best = rows[-1]["best_true_so_far"] if rows else math.nan
    fails = sum(row["state"] == "FAIL" for row in rows)
    ms = sum(row["sampler_ms"] for row in rows) / max(len(rows), 1)
    return (
        f"[{job.suite}] {job.study} / {job.contender.name} / seed {job.seed}: "
        f"best {best:.6g}, {fails} FAIL, {ms:.1f} sampler ms/trial"
    )
