"""The ``autoscout`` command: run a ready-made study, compare samplers, look at the results.

.. code-block:: bash

    autoscout run llm_training --n-trials 40 --option preset=70b-512
    autoscout run llm_serving --fix tp=4   # a knob pinned, not searched
    autoscout show                 # decisions table and best config of the study
    autoscout show --json          # the same as JSON: ship.params is the config to ship
    autoscout dashboard            # optuna-dashboard on http://127.0.0.1:8080
    autoscout bench --suite baselines --quick

Usage errors (a bad storage URL, an unknown study, a study name taken by a study of the other
direction, a bad option value) print one line to stderr and exit with status 2, before anything
is written to storage.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from autoscout_optuna._keys import STUDY_OPTIONS

DEFAULT_STORAGE = "sqlite:///autoscout.db"
DEFAULT_ARTIFACT_DIR = "artifacts"
DEFAULT_CLAIM_KEY = "autoscout:default_claim"  # study user attr: the worker measuring the default
STUDY_KEY = "autoscout:study"  # study user attr: the name of the study definition it runs
OPTIONS_KEY = STUDY_OPTIONS  # study user attr: the options its measurements depend on
# Options a resumed study may change: how many trials, how long a run may take, where logs go,
# which GPU index a worker uses (``device_name`` still tells one kind of GPU from another);
# every other option of a study definition changes what is measured.
RESUME_FREE_OPTIONS = frozenset({"n_trials", "timeout", "log_dir", "device"})
# Seconds a worker waits after writing its claim before reading it back: workers that start
# together all see no claim and all write one; the last write wins and the others step back.
CLAIM_SETTLE_S = 1.0
DEFAULT_N_TRIALS = 30  # when the study does not say: a few minutes on 2 CPU cores
HEARTBEAT_INTERVAL_S = 60
SCHEMA_RACE_RETRY_S = 0.5  # pause before connecting again after another worker made the tables
HEARTBEAT_GRACE_S = 300  # longer than any pause of a healthy worker between heartbeats
USAGE_ERROR = 2
# `autoscout show` columns: the decision and its outcome; `--wide` adds every sub-sampler attr.
SHOW_COLUMNS = ("number", "state", "value", "autoscout:arm", "autoscout:fidelity",
                "autoscout:fidelity_reason", "failure_reason", "autoscout:reason")


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2, no traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autoscout`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        # The benchmark owns its own options (and --help): pass everything through untouched.
        from autoscout_optuna.benchmark import main as bench_main

        return bench_main(argv[1:])
    args = _parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # progress line instead of INFO spam
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"autoscout {args.command}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as error:
        # A read-only or locked database surfaces deep inside Optuna (often as the unhelpful
        # "invalid data in the commit"): name the real cause in one line. The failing write
        # happened in a transaction that was rolled back, so nothing stored is changed.
        reason = storage_failure(error)
        if reason is None:
            raise
        print(f"autoscout {args.command}: error: storage {getattr(args, 'storage', '')!r} "
              f"{reason}", file=sys.stderr)
        return USAGE_ERROR


def storage_failure(error: BaseException) -> str | None:
    """Why the storage refused, in words, if ``error`` comes from the database; else None."""
    import sqlite3

    chain: list[BaseException] = []
    while error is not None and error not in chain:  # `raise ... from`: Optuna, SQLAlchemy
        chain.append(error)
        error = error.__cause__
    for cause in reversed(chain):  # the deepest cause says what the database said
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if isinstance(cause, sqlite3.OperationalError) or "OperationalError" in type(
            cause
        ).__name__:
            lowered = text.lower()
            if "readonly" in lowered or "read-only" in lowered:
                return f"is read-only ({text}); check the file and folder permissions"
            if "locked" in lowered or "busy" in lowered:
                return f"is locked by another process ({text}); retry when it is released"
            return f"cannot be used: {text}"
    if any(isinstance(e, optuna.exceptions.StorageInternalError) for e in chain):
        return f"cannot be written: {chain[-1]}"
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoscout", description="Find the fastest configuration of an ML job with Optuna."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from autoscout_optuna import studies

    run = commands.add_parser(
        "run", help="run (or resume) a ready-made study",
        epilog=f"bundled studies: {', '.join(studies.names())}. A study's options are the "
        "keyword arguments of its definition() function.",
    )
    run.add_argument("study", metavar="STUDY",
                     help="bundled study name (e.g. llm_training) or path of a .py study file "
                     "(it runs as Python code: use only files you trust)")
    _add_storage(run)
    run.add_argument("--study-name", help="name in storage (default: STUDY); resumed if it exists")
    run.add_argument("--n-trials", type=_non_negative_int, help="trials to add in this run "
                     f"(default: the study's own default, else {DEFAULT_N_TRIALS}; 0 with "
                     "--confirm confirms a finished search)")
    run.add_argument("--timeout", type=_positive_float, help="stop starting trials after S seconds")
    run.add_argument("--seed", type=int, help="sampler seed (default: fresh randomness)")
    run.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                     help="study option, repeatable (e.g. -o num_gpus=128 -o gpu=A100)")
    run.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                     help="pin a knob to a value instead of searching it, repeatable (e.g. "
                     "--fix dtype=bf16 --fix tp=2 --fix cuda_graphs=false: only true/false are "
                     "booleans, compile=off is a string); checked against the study's knobs; the "
                     "default config runs with the pins too (the study's fixed= option)")
    run.add_argument("--artifact-dir", default=DEFAULT_ARTIFACT_DIR,
                     help=f"where dashboard plots go (default: {DEFAULT_ARTIFACT_DIR})")
    run.add_argument("--confirm", type=_non_negative_int, default=0, metavar="N",
                     help="after the search, run the top configs and the default config N more "
                     "times each and rank them by their mean (default: 0, off)")
    run.add_argument("--confirm-top", type=_positive_int, default=3, metavar="K",
                     help="how many of the best configs --confirm re-runs (default: 3)")
    run.set_defaults(handler=_run)

    show = commands.add_parser("show", help="print the decisions table and best config")
    _add_storage(show)
    show.add_argument("--study-name", help="study to show (default: the only one in storage)")
    show.add_argument("--last", type=int, default=20, help="rows of the table (0: all)")
    show.add_argument("--wide", action="store_true",
                      help="every decision column, not only the main ones")
    show.add_argument("--json", action="store_true",
                      help="print the summary as JSON instead (the config to ship under "
                           "'ship'), for scripts")
    show.set_defaults(handler=_show)

    dash = commands.add_parser("dashboard", help="start optuna-dashboard on the storage")
    _add_storage(dash)
    dash.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    dash.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    dash.add_argument("--artifact-dir", default=DEFAULT_ARTIFACT_DIR,
                      help=f"artifact store folder (default: {DEFAULT_ARTIFACT_DIR})")
    dash.set_defaults(handler=_dashboard)

    # Listed for --help only: main() hands `bench ...` to the benchmark before parsing.
    commands.add_parser("bench", help="samplers side by side (autoscout bench --help)")
    return parser


def _add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help=f"Optuna storage URL (default: {DEFAULT_STORAGE})")


def _memory_estimate(definition: Any) -> Any:
    """The study's memory formula for the sampler, where it runs without a simulator.

    Alone, the sampler gains from it (the ``autoscout`` suite, ``variant: memory estimate``);
    behind the fidelity pruner the simulator already fails a structure it expects out of
    memory without a real run, and with the formula as well ``llm_training`` stalled short of
    99 % in 8 of 32 held-out seeds instead of 3 (session 51, 20 % simulator noise).
    """
    return definition.memory_estimate if definition.simulate is None else None


def _run(args: argparse.Namespace) -> int:
    """``autoscout run``, with SIGTERM handled as Ctrl-C.

    A job runs in its own session (``CommandRunner`` kills its whole process group), so a
    terminal's Ctrl-C does not reach it and Python's default SIGTERM, which ends the worker
    without unwinding, would leave the job running on the GPU with nobody to stop it (``kill``,
    ``timeout``, a scheduler's preemption or ``launch_workers``' caller all send SIGTERM). As a
    ``KeyboardInterrupt`` it unwinds like Ctrl-C: the job's group is killed, the trial is
    marked interrupted, the run exits with status 130.
    """
    if threading.current_thread() is not threading.main_thread():
        return _run_study(args)  # signal handlers can only be set in the main thread
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run_study(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run_study(args: argparse.Namespace) -> int:
    from autoscout_optuna import AutoScoutSampler, FidelityPruner, Infeasible, _dashboard, studies
    from autoscout_optuna._keys import WORKER
    from autoscout_optuna._progress import ProgressReporter, summary_text
    from autoscout_optuna._recovery import recover_orphaned_trials, worker_identity

    options = _study_options(args.option, args.fix)
    definition = _load_definition(args.study, options, studies)
    storage = open_storage(args.storage, heartbeat=True)
    study_name = args.study_name or definition.name
    _check_resumable(storage, study_name, definition)
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        direction=definition.direction,
        sampler=AutoScoutSampler(seed=args.seed, memory_estimate=_memory_estimate(definition)),
        pruner=FidelityPruner() if definition.simulate is not None else None,
        load_if_exists=True,
    )
    study.set_user_attr(_dashboard.METRIC_KEY, definition.metric)
    study.set_user_attr(STUDY_KEY, definition.name)
    study.set_user_attr(OPTIONS_KEY, _resume_options(definition))
    orphans = recover_orphaned_trials(study, retry=True)
    if orphans:
        print(f"trials {orphans} were left RUNNING by a worker that died: failed "
              "(failure_reason=worker_died) and queued again", file=sys.stderr)
    n_before = len(study.trials)
    if n_before:
        print(f"resuming study {study_name!r}: {n_before} trials already in {args.storage}",
              file=sys.stderr)
    n_trials = args.n_trials
    if n_trials is None and args.timeout is None:
        n_trials = int(definition.options.get("n_trials", DEFAULT_N_TRIALS))
    reporter = ProgressReporter(n_trials=n_trials, metric=definition.metric)
    # Failed trials are expected (infeasible configs) and the progress line names their reason:
    # Optuna's per-failure traceback would only bury it.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    interrupted = False
    crashed: str | None = None  # why the run stopped on repeated crashes
    started = time.monotonic()
    objective = _GuardedObjective(_objective(definition, args.seed))
    try:
        evaluate_default(study, definition)
        # --timeout is the wall-clock limit of the whole run, the default's measurement included
        timeout = (None if args.timeout is None
                   else max(0.0, args.timeout - (time.monotonic() - started)))
        study.optimize(
            objective,
            n_trials=n_trials,
            timeout=timeout,
            catch=(Infeasible,),
            callbacks=[reporter, _NoteRefresher(args.artifact_dir)],
        )
    except KeyboardInterrupt:
        interrupted = True  # the running trial is FAIL already; everything else is stored
    except SameCrashes as error:
        crashed = str(error)
    finally:
        reporter.close()
    if args.confirm and not interrupted and crashed is None:
        # --timeout bounds the whole run: the confirmation gets what the search left of it
        left = None if args.timeout is None else args.timeout - (time.monotonic() - started)
        if left is not None and left <= 0:
            print("--confirm: the --timeout is spent, nothing confirmed (run again with a "
                  "longer --timeout to confirm)", file=sys.stderr)
        else:
            try:
                interrupted = _confirm(study, objective, args, definition.metric, left)
            except SameCrashes as error:
                crashed = str(error)
    if interrupted:
        print("interrupted: every finished trial is stored; the same command resumes the study",
              file=sys.stderr)
    if crashed is not None:
        print(f"stopped: {crashed}", file=sys.stderr)
    # trials of this process only: other workers may be adding to the same study meanwhile
    me = worker_identity()
    added = sum(t.system_attrs.get(WORKER) == me for t in study.get_trials(deepcopy=False))
    print(summary_text(study, added=added))
    _dashboard.publish(study, artifact_dir=args.artifact_dir)
    print(f"\nDashboard: autoscout dashboard --storage {args.storage} "
          f"--artifact-dir {args.artifact_dir}")
    return 130 if interrupted else 1 if crashed is not None else 0


def _confirm(
    study: optuna.Study, objective: Any, args: argparse.Namespace, metric: str,
    timeout: float | None,
) -> bool:
    """``--confirm``: re-run the top configs and the default; whether Ctrl-C stopped it."""
    from autoscout_optuna import Infeasible, confirm_best
    from autoscout_optuna._progress import ProgressReporter

    print(f"confirming the top {args.confirm_top} configs, any confirmed before and the default "
          f"config: up to {args.confirm} more runs each", file=sys.stderr)
    reporter = ProgressReporter(n_trials=None, metric=metric)
    try:
        confirm_best(study, objective, top=args.confirm_top, repeats=args.confirm,
                     catch=(Infeasible,), callbacks=[reporter, _NoteRefresher(args.artifact_dir)],
                     timeout=timeout)
    except KeyboardInterrupt:
        return True  # what ran is stored; the same command tops up the rest
    finally:
        reporter.close()
    return False


class _NoteRefresher:
    """Keeps the dashboard note current during long runs: at most once a minute (plots take
    about a second to draw, a trial of a reference study a few milliseconds)."""

    def __init__(self, artifact_dir: str, every_s: float = 60.0) -> None:
        self.artifact_dir = artifact_dir
        self.every_s = every_s
        self._last = time.monotonic()

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        from autoscout_optuna import _dashboard

        if time.monotonic() - self._last >= self.every_s:
            _dashboard.publish(study, artifact_dir=self.artifact_dir)
            self._last = time.monotonic()


class SameCrashes(Exception):
    """The same unexpected exception ended several trials in a row: a bug, not a config."""


class _GuardedObjective:
    """The study's objective as ``autoscout run`` calls it: every way a trial can end is
    recorded with its reason, and the study goes on where that makes sense.

    - Ctrl-C: the trial is marked a run never made (``_recovery.mark_interrupted``; Optuna
      fails it without a reason, the sampler would learn its config as a failure and never try
      it again) and the run stops.
    - Any other exception (a measure that raises ``CalledProcessError`` for a crashed job, a
      CUDA error): the trial fails as ``Infeasible("crash", "<type>: <message>")`` and the study
      goes on; Optuna would stop the whole run with a traceback at the first one.
    - The same crash ending every trial of the run so far (``stop_at_start``, 3, or more), or
      ``stop_later`` (10) trials in a row: :class:`SameCrashes` stops the run, for that is a
      bug in the study or a dead device rather than configs to learn from. Config-dependent
      crashes repeat too (a search pushing at a wall crashed 2 in a row on a toy study), hence
      the longer streak once anything has run.
    """

    def __init__(self, objective: Any, *, stop_at_start: int = 3, stop_later: int = 10) -> None:
        self._objective = objective
        self._stop_at_start = stop_at_start
        self._stop_later = stop_later
        self._streak: list[tuple[int, str]] = []  # (trial, crash detail) of the latest crashes
        self._anything_ran = False  # a trial ended otherwise than in the streak's crash

    def __call__(self, trial: optuna.Trial) -> float:
        from autoscout_optuna import Infeasible
        from autoscout_optuna._objective import record_failure
        from autoscout_optuna._recovery import mark_interrupted

        try:
            value = self._objective(trial)
        except KeyboardInterrupt:
            mark_interrupted(trial)
            raise
        except (Infeasible, optuna.TrialPruned):
            self._ended_otherwise()
            raise
        except Exception as error:  # noqa: BLE001 - whatever a study's run raises is a crash
            crash = Infeasible("crash", f"{type(error).__name__}: {error}"[:500])
            record_failure(trial, crash)
            if self._streak and self._streak[-1][1] != crash.detail:
                self._ended_otherwise()
            self._streak.append((trial.number, crash.detail))
            limit = self._stop_later if self._anything_ran else self._stop_at_start
            if len(self._streak) >= limit:
                numbers = ", ".join(f"#{number}" for number, _ in self._streak)
                raise SameCrashes(f"trials {numbers} crashed alike ({crash.detail}): a bug in "
                                  "the study or a broken device rather than a config; fix it "
                                  "and run the same command to resume") from error
            raise crash from error
        self._ended_otherwise()
        return value

    def _ended_otherwise(self) -> None:
        self._streak = []
        self._anything_ran = True


def _objective(definition: Any, seed: int | None) -> Any:
    """Multi-fidelity objective when the study has a simulator, plain real runs otherwise."""
    from autoscout_optuna._objective import reference_objective
    from autoscout_optuna.fidelity import from_definition

    # Reference studies play the real run with seeded measurement noise, as a real job has.
    noise_seed = 0 if seed is None else seed
    if definition.simulate is not None:
        return from_definition(definition, noise_seed=noise_seed)
    return reference_objective(definition, noise_seed=noise_seed)


def _show(args: argparse.Namespace) -> int:
    import pandas as pd

    from autoscout_optuna import decisions_table
    from autoscout_optuna._progress import summary_text

    storage = open_storage(args.storage, must_exist=True)
    study = load_existing_study(storage, args.study_name)
    if args.json:
        from autoscout_optuna._dashboard import summarize

        print(json.dumps(summarize(study).to_record(), indent=2))
        return 0
    table = decisions_table(study)
    if not args.wide:
        table = table[[c for c in SHOW_COLUMNS if c in table.columns]]
    if args.last > 0:
        table = table.tail(args.last)
    with pd.option_context("display.max_columns", None, "display.width", 200,
                           "display.max_colwidth", 60):
        print(table.to_string(index=False) if len(table) else "(no trials yet)")
    print()
    print(summary_text(study, added=None))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from autoscout_optuna import _dashboard

    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    storage = open_storage(args.storage, must_exist=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --host {args.host} makes the dashboard reachable from the network; "
              "it has no authentication", file=sys.stderr)
    print(f"optuna-dashboard on http://{args.host}:{args.port}/ (storage {args.storage}, "
          f"artifacts in {args.artifact_dir}); Ctrl-C stops it", file=sys.stderr)
    try:
        _dashboard.serve(storage, host=args.host, port=args.port, artifact_dir=args.artifact_dir)
    except OSError as error:  # port taken, address not local, ...
        reason = error.strerror or error
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {reason}") from None
    except KeyboardInterrupt:
        pass
    return 0


def evaluate_default(study: optuna.Study, definition: Any) -> None:
    """Measure the study's default config once (noiselessly where the study can) and keep the
    value in a study user attr, so the gain over it survives resumes and is measured once.

    With several workers on one study, the first to start claims the measurement (study user
    attr ``autoscout:default_claim``, its host and pid) and the others go straight to their
    trials instead of queueing for the GPU to measure it again (seen on an H200 with two
    workers: the second spent 3 of its 4 minutes on a duplicate measurement). Workers that
    start together each write a claim, wait ``CLAIM_SETTLE_S`` and read it back: only the last
    writer measures. A claim whose worker died on this host is taken over. The worker that
    measures also queues the default config as trial 0 of a new study
    (:func:`queue_default_trial`); for a real study that trial is the measurement.
    """
    from autoscout_optuna import Infeasible
    from autoscout_optuna._dashboard import DEFAULT_VALUE_KEY, default_trial
    from autoscout_optuna._recovery import worker_gone, worker_identity

    if definition.default_config is None:
        return
    if DEFAULT_VALUE_KEY in study.user_attrs:
        print("the default config was measured already", file=sys.stderr)
        return
    if definition.is_real and default_trial(study.get_trials(deepcopy=False)) is not None:
        print("the default config runs as a trial of the study", file=sys.stderr)
        return
    claim = study.user_attrs.get(DEFAULT_CLAIM_KEY)
    me = worker_identity()
    if claim is None or worker_gone(claim):
        study.set_user_attr(DEFAULT_CLAIM_KEY, me)
        # Storage has no compare-and-set on attrs: read the claim back once the workers that
        # started with us have written theirs (last write wins).
        time.sleep(CLAIM_SETTLE_S)
        claim = study.user_attrs.get(DEFAULT_CLAIM_KEY)
    if claim != me:
        print(f"the default config is being measured by worker {claim.get('host')}:"
              f"{claim.get('pid')}", file=sys.stderr)
        return
    if queue_default_trial(study, definition) and definition.is_real:
        # A real run of its own would only repeat trial 0: the gain is read from that trial.
        return
    kind = "a real run" if definition.is_real else "noiseless reference"
    print(f"measuring the default config once ({kind})", file=sys.stderr)
    try:
        value = float(definition.measure(dict(definition.default_config), None))
    except Infeasible as error:
        print(f"the default config is infeasible: {error}", file=sys.stderr)
        value = None
    except Exception as error:  # noqa: BLE001 - a crash here costs the gain line, not the run
        print(f"the default config crashed: {type(error).__name__}: {error}", file=sys.stderr)
        value = None
    study.set_user_attr(DEFAULT_VALUE_KEY, value)


def queue_default_trial(study: optuna.Study, definition: Any) -> bool:
    """Queue the default config as the study's next trial (trial 0 of a new study) unless a
    trial has run it; whether it did.

    The measurement above only reports the gain over the default; as a trial, the sampler
    learns from it too (AutoScout transplants its dense values into the structures it tries
    while it leads), and a real study needs no separate run of it (the summary reads the
    default's value from the trial: ``_dashboard.default_trial_value``). On the reference
    studies (the ``autoscout`` benchmark suite, 40 seeds) starting from it lifted AutoScout's
    median best at 20 trials by 0.04-0.06 of the optimum and at 100 trials by 0.001-0.07; in a
    ``make run`` of the GPT study (12 CPU trials) the default config, measured beside the
    study, beat every trial the search ran without it. Only the worker that claimed the
    default's measurement queues it, and only where no trial has run it: a worker that started
    beside this one may have begun its first trial while this one waited out its claim, and the
    default then runs as the next trial instead of never (neither trial 0 nor confirmed).
    """
    from autoscout_optuna._dashboard import default_trial
    from autoscout_optuna._keys import DEFAULT_CONFIG

    if default_trial(study.get_trials(deepcopy=False)) is not None:
        return False
    definition.enqueue_default(study)
    # its number, not the count read before: another worker may have begun a trial meanwhile
    number = max(t.number for t in study.get_trials(deepcopy=False)
                 if t.user_attrs.get(DEFAULT_CONFIG))
    print(f"trial {number} runs the default config", file=sys.stderr)
    return True


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """``["num_gpus=128", "fast=true"]`` -> ``{"num_gpus": 128, "fast": True}``.

    Values become int, float or bool where they read as one (true/false, yes/no, on/off),
    else stay strings (so do "nan" and "inf"); dashes in keys become underscores.
    """
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise UsageError(f"--option {item!r}: expected KEY=VALUE, e.g. --option num_gpus=128")
        options[key] = _parse_value(text.strip())
    return options


def _study_options(option: Sequence[str], fix: Sequence[str]) -> dict[str, Any]:
    """``--option`` items as the study's keyword arguments, ``--fix`` items as its ``fixed``."""
    options = parse_options(option)
    if "fixed" in options:  # a string the study cannot read as {knob: value}
        raise UsageError("pin knobs with --fix KNOB=VALUE, not -o fixed=...")
    if fix:
        fixed: dict[str, Any] = {}
        for item in fix:
            knob, sep, text = item.partition("=")
            if not sep or not knob.strip():
                raise UsageError(f"--fix {item!r}: expected KNOB=VALUE, e.g. --fix dtype=bf16")
            # knob names are the study's own (no dash-to-underscore, unlike option keys); only
            # true/false read as booleans: "off" is one of gpt_training's compile choices
            fixed[knob.strip()] = _parse_value(text.strip(), bool_words=False)
        options["fixed"] = fixed
    return options


def _parse_value(text: str, *, bool_words: bool = True) -> Any:
    """``text`` as a bool, int or float where it reads as one, else the string; yes/no and
    on/off read as booleans only with ``bool_words``."""
    lowered = text.lower()
    if lowered in (("true", "yes", "on") if bool_words else ("true",)):
        return True
    if lowered in (("false", "no", "off") if bool_words else ("false",)):
        return False
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        # "nan" and "inf" read as floats, but no option means them: as numbers they passed a
        # study's range checks (NaN compares false) and failed every trial
        if math.isfinite(value):
            return value
    return text


def _load_definition(name: str, options: Mapping[str, Any], studies: Any) -> Any:
    if not name.endswith(".py") and name not in studies.names():
        raise UsageError(f"unknown study {name!r}; known studies: {', '.join(studies.names())} "
                         "(or the path of a .py file defining definition(**options))")
    if name.endswith(".py") and not Path(name).is_file():
        raise UsageError(f"study file {name!r} does not exist")
    # What the study warns of while it is built (the GPT study names an attention backend that
    # crashed its device probe) reads as one line each, not as a file:line and a source line.
    with warnings.catch_warnings(record=True) as caught:
        try:
            return studies.load(name, **options)
        except (TypeError, ValueError) as error:
            if "fixed" in options and "unexpected keyword argument 'fixed'" in str(error):
                raise UsageError(f"--fix: study {name!r} cannot pin knobs (its definition() "
                                 "takes no fixed=)") from None
            given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
            raise UsageError(f"study {name!r} rejected its options ({given}): {error}") from None
        finally:
            for warning in caught:
                print(f"autoscout run: warning: {warning.message}", file=sys.stderr)


def open_storage(
    url: str, *, must_exist: bool = False, heartbeat: bool = False
) -> optuna.storages.BaseStorage:
    """Open an Optuna storage, turning every way a URL can be wrong into a :class:`UsageError`.

    With ``must_exist``, a SQLite file that is not there is an error instead of a new empty
    database (``show`` and ``dashboard`` read; they must not create). With ``heartbeat``, a
    database storage records a heartbeat per running trial, so a trial whose worker vanished on
    another host is failed after ``HEARTBEAT_GRACE_S`` and retried once (dead workers on this
    host are recovered at once, see ``_recovery``).
    """
    if must_exist and url.startswith("sqlite:///"):
        # the query (?timeout=30, ...) is for the driver, not part of the file's name
        path = Path(url[len("sqlite:///"):].partition("?")[0])
        if not path.is_file():
            raise UsageError(f"no database at {path} (from --storage {url}); "
                             "run `autoscout run STUDY` first")
    try:
        return _connect(url, heartbeat)
    except Exception as error:  # noqa: BLE001 - sqlalchemy, driver or file errors, all usage here
        if _lost_schema_race(error):
            # Workers started together on a new database each create its tables, and all but
            # the first fail; the tables are there now: connect again.
            time.sleep(SCHEMA_RACE_RETRY_S)
            try:
                return _connect(url, heartbeat)
            except Exception as again:  # noqa: BLE001 - as above
                error = again
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UsageError(f"cannot open storage {url!r}: {first_line}") from None


def _connect(url: str, heartbeat: bool) -> optuna.storages.BaseStorage:
    from autoscout_optuna._storage import serialize_sqlite_transactions

    if heartbeat and "://" in url and not url.startswith(("redis", "journal")):
        with warnings.catch_warnings():
            # Optuna flags the heartbeat API experimental at every start: the user cannot
            # act on it, and it buries the first progress line.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=HEARTBEAT_GRACE_S,
                heartbeat_stale_trial_callback=(
                    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
                ),
            )
        # a worker (`autoscout run`) pops the queue other workers on the file pop too
        serialize_sqlite_transactions(storage)
        return storage
    return optuna.storages.get_storage(url)


def _lost_schema_race(error: BaseException) -> bool:
    """Whether ``error`` says another process created the database's tables meanwhile (seen
    with two workers on a new SQLite file: ``UNIQUE constraint failed:
    alembic_version.version_num`` or ``table studies already exists``)."""
    text = str(error)
    return "alembic_version" in text or "already exists" in text


def load_existing_study(storage: optuna.storages.BaseStorage, name: str | None) -> optuna.Study:
    """The study called ``name``, or the only study in ``storage`` when ``name`` is None."""
    names = optuna.get_all_study_names(storage)
    if name is None:
        if len(names) != 1:
            listed = ", ".join(names) if names else "none"
            raise UsageError(f"--study-name is needed: the storage holds {len(names)} studies "
                             f"({listed})")
        name = names[0]
    if name not in names:
        raise UsageError(f"no study {name!r} in storage; studies there: "
                         f"{', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=name, storage=storage)
    if len(study.directions) != 1:
        raise UsageError(f"study {name!r} is multi-objective; autoscout handles one objective")
    return study


def _check_resumable(
    storage: optuna.storages.BaseStorage, name: str, definition: Any
) -> None:
    """Refuse to resume a study whose stored trials this run's would not compare with: another
    direction (``create_study(load_if_exists=True)`` silently keeps the stored one), another
    study definition (its knobs differ: Optuna's "does not support dynamic value space" after
    the stored metric had been overwritten), or the same definition with other options (a
    70B study resumed with ``-o preset=8b-64`` mixed both workloads into one "best")."""
    if name not in optuna.get_all_study_names(storage):
        return
    stored = optuna.load_study(study_name=name, storage=storage)
    wanted = optuna.study.StudyDirection.MAXIMIZE if definition.direction == "maximize" else \
        optuna.study.StudyDirection.MINIMIZE
    if list(stored.directions) != [wanted]:
        have = ", ".join(d.name.lower() for d in stored.directions)
        raise UsageError(f"study name {name!r} is taken by a study that goes {have}, but this "
                         f"study goes {definition.direction}; pick another --study-name")
    made_by = stored.user_attrs.get(STUDY_KEY)
    if made_by is not None and made_by != definition.name:
        raise UsageError(f"study name {name!r} is taken by a study of {made_by!r}, but this "
                         f"study is {definition.name!r}; pick another --study-name")
    made_with = stored.user_attrs.get(OPTIONS_KEY)
    if made_by is None or not isinstance(made_with, dict):
        return  # made before options were stored, or by another tool: nothing to compare
    options = _resume_options(definition)
    changed = sorted(k for k in made_with.keys() | options.keys()
                     if made_with.get(k) != options.get(k))
    if changed:
        raise UsageError(f"study {name!r} was made with {_options_text(made_with, changed)}, "
                         f"this run has {_options_text(options, changed)}: their measurements "
                         "do not compare; pick another --study-name")


def _resume_options(definition: Any) -> dict[str, Any]:
    """The study's options that a resumed run must keep, as storage holds them (JSON)."""
    kept = {k: v for k, v in dict(definition.options).items() if k not in RESUME_FREE_OPTIONS}
    return json.loads(json.dumps(kept, default=repr))


def _options_text(options: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={options[k]!r}" if k in options else f"no {k}" for k in keys)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
