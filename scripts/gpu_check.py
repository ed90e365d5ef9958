"""Run the GPT-training study on this machine's GPU for a fixed time; write a results table.

Called by ``scripts/gpu_check.sh`` (``make gpu-check``), which first installs what the image
lacks from a local folder of wheels. Works from a source checkout without installing the
package: ``studies/`` is mapped to ``autoscout_optuna.studies`` here, and the trainer
subprocesses find the package through ``PYTHONPATH``.

Output (``--out``, default ``benchmarks/gpu``): ``results.csv`` (one row per trial: config,
tokens/s, MFU, val_bpb, failure reason, simulator estimate) and ``results.md``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import importlib.util
import os
import platform
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ["number", "state", "failure_reason", "val_bpb", "tokens_per_s", "mfu", "peak_mem_mb",
           "first_step_s", "sim_val_bpb", "sim_tokens_per_s", "wall_s", "fidelity",
           "fidelity_reason", "worker_pid", "lock_wait_s", "nvml_util_mean_pct",
           "nvml_mem_max_mb", "nvml_power_mean_w", "nvml_sm_clock_max_mhz"]
TELEMETRY = {"nvml_util_mean_pct": "utilization_pct_mean", "nvml_mem_max_mb": "memory_used_mb_max",
             "nvml_power_mean_w": "power_w_mean", "nvml_sm_clock_max_mhz": "sm_clock_mhz_max"}
# Mirrors studies/gpt_training.DERIVED_BATCH_KEYS (this script also runs where the package is not
# importable before ``import_package``).
DERIVED_BATCH_KEYS = ("total_batch", "device_batch_effective", "grad_accum")
KNOBS = [*DERIVED_BATCH_KEYS, "dtype", "tf32", "compile",
         "optimizer", "attention", "lr_mult", "warmup_frac"]


def import_package():
    """``autoscout_optuna`` with its ``studies`` subpackage, installed or from the checkout."""
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    import autoscout_optuna

    try:
        import autoscout_optuna.studies  # noqa: F401 - installed package
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "autoscout_optuna.studies", REPO / "studies" / "__init__.py",
            submodule_search_locations=[str(REPO / "studies")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["autoscout_optuna.studies"] = module
        spec.loader.exec_module(module)
        autoscout_optuna.studies = module
    return autoscout_optuna


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="wall-clock cap (default 8)")
    parser.add_argument("--time-budget", type=float, default=30.0,
                        help="training seconds per trial (default 30)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "gpu"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default=str(REPO / "autoscout-logs" / "gpu-check"),
                        help="per-trial trainer logs (default: autoscout-logs/gpu-check)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU smoke test of this script: tiny budget, device cpu")
    parser.add_argument("--summarize", metavar="STORAGE",
                        help="run nothing: write the tables of the study in STORAGE (e.g. the "
                             "one `autoscout run gpt_training` workers filled)")
    parser.add_argument("--study-name", default="gpt_training", help="with --summarize")
    args = parser.parse_args(argv)
    if args.summarize:
        return summarize(args)
    if args.dry_run:
        args.device, args.time_budget = "cpu", min(args.time_budget, 2.0)
    # `timeout` in gpu_check.sh sends SIGTERM: exit through the runner's cleanup, which kills
    # the trainer's process group instead of leaving it on the GPU
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    deadline = started + args.minutes * 60.0

    package = import_package()
    import optuna
    import torch

    from autoscout_optuna import Infeasible

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trial_timeout = args.time_budget + (15.0 if args.dry_run else 150.0)
    # a trial needs its budget plus start-up and evaluation; below this, no trial is started
    min_trial_s = args.time_budget + (5.0 if args.dry_run else 30.0)

    def load(timeout: float):
        return package.studies.load(
            "gpt_training", device=args.device, time_budget=args.time_budget,
            timeout=timeout, log_dir=args.log_dir)

    definition = load(trial_timeout)
    try:
        sampler = package.AutoScoutSampler(seed=args.seed)
    except Exception as error:  # noqa: BLE001 - the check must still produce its table
        print(f"AutoScoutSampler unavailable ({error}); using TPE", file=sys.stderr)
        sampler = optuna.samplers.TPESampler(seed=args.seed)
    study = optuna.create_study(direction=definition.direction, sampler=sampler)

    def objective(trial: optuna.Trial, definition=definition) -> float:
        config = definition.suggest(trial)
        trial.set_user_attr("gpu_check:config", {k: config.get(k) for k in KNOBS})
        try:  # the simulator's view, kept next to the measurement to judge its error
            trial.set_user_attr("sim_val_bpb", definition.simulate(config))
        except Infeasible as error:
            trial.set_user_attr("failure_reason", f"predicted_{error.reason}")
            raise
        return definition.measure_trial(trial, config)

    study.enqueue_trial(package.studies.gpt_training.default_params(definition))
    # Trials run back to back until the cap. The last ones get a timeout cut to the time left
    # (first seen on an H200: two of five trials were max-autotune compiles killed at the full
    # timeout, and waiting for a whole timeout's worth of time left wasted half the check).
    while (left := deadline - time.monotonic() - 5.0) >= min_trial_s:
        timeout = min(trial_timeout, left)
        trial_definition = definition if timeout == trial_timeout else load(timeout)
        study.optimize(functools.partial(objective, definition=trial_definition), n_trials=1,
                       catch=(Infeasible,))
        write_results(study, out, definition, args, torch)
        print(_line(study.trials[-1]), flush=True)
    write_results(study, out, definition, args, torch)
    print(f"{len(study.trials)} trials in {time.monotonic() - started:.0f} s; "
          f"results in {out / 'results.csv'} and {out / 'results.md'}")
    return 0


def _line(trial) -> str:
    attrs = trial.user_attrs
    return (f"trial {trial.number}: {trial.state.name} val_bpb={trial.value} "
            f"tok/s={attrs.get('tokens_per_s')} mfu={attrs.get('mfu')} "
            f"reason={attrs.get('failure_reason', '')}")


def rows(study) -> list[dict]:
    from autoscout_optuna import _keys

    table = []
    for trial in study.trials:
        if not trial.state.is_finished():
            continue
        attrs = trial.user_attrs
        config = attrs.get("gpu_check:config", {})
        # a pruned trial's value is the simulator's estimate, not a measurement
        measured = trial.state.name == "COMPLETE"
        telemetry = attrs.get("run:telemetry") or {}
        row = {
            "number": trial.number, "state": trial.state.name,
            "failure_reason": attrs.get(_keys.FAILURE_REASON, ""),
            "val_bpb": trial.value if measured else "",
            "tokens_per_s": attrs.get("tokens_per_s", attrs.get("run:throughput_mean", "")),
            "mfu": attrs.get("mfu", ""), "peak_mem_mb": attrs.get("peak_mem_mb", ""),
            "first_step_s": attrs.get("first_step_s", ""),
            "sim_val_bpb": attrs.get("sim_val_bpb", attrs.get(_keys.ESTIMATE, "")),
            "sim_tokens_per_s": attrs.get("run:expected_throughput", ""),
            "wall_s": attrs.get("run:wall_s", ""),
            "fidelity": attrs.get(_keys.FIDELITY, ""),
            "fidelity_reason": attrs.get(_keys.FIDELITY_REASON, ""),
            "worker_pid": (trial.system_attrs.get(_keys.WORKER) or {}).get("pid", ""),
            "lock_wait_s": attrs.get("run:lock_wait_s", ""),
            **{column: telemetry.get(key, "") for column, key in TELEMETRY.items()},
        }
        if not config:  # trials of `autoscout run`: params plus the derived batch split
            config = dict(trial.params, total_batch=2 ** trial.params.get("total_batch_log2", 0))
            config.update({k: attrs[k] for k in DERIVED_BATCH_KEYS if k in attrs})
        for knob in KNOBS:
            row[knob] = config.get(knob, "")
        table.append(row)
    return table


MD_COLUMNS = ["number", "state", "failure_reason", "fidelity", "val_bpb", "tokens_per_s", "mfu",
              "peak_mem_mb", "nvml_mem_max_mb", "nvml_util_mean_pct", "first_step_s",
              "sim_val_bpb", "worker_pid", "lock_wait_s"]


def write_results(study, out: Path, definition, args, torch) -> None:
    options = definition.options
    write_tables(rows(study), out, [
        f"- device: {options['device_name']} ({options['device']}); torch {torch.__version__}; "
        f"Python {platform.python_version()}",
        f"- training budget per trial: {options['time_budget']:g} s; model size "
        f"{options['size']}{' (dry run)' if args.dry_run else ''}",
    ])


def write_tables(table: list[dict], out: Path, header: list[str]) -> None:
    """``results.csv`` (every column) and ``results.md`` (the main ones) of ``rows(study)``."""
    with open(out / "results.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS + KNOBS)
        writer.writeheader()
        writer.writerows(table)
    lines = [
        "# GPT-training study: GPU check",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        *header,
        f"- {len(table)} finished trials",
        "",
        "| " + " | ".join(MD_COLUMNS + KNOBS) + " |",
        "|" + "---|" * (len(MD_COLUMNS) + len(KNOBS)),
    ]
    for row in table:
        lines.append("| " + " | ".join(_fmt(row[c]) for c in MD_COLUMNS + KNOBS) + " |")
    complete = [r for r in table if r["state"] == "COMPLETE"]
    if complete:
        best = min(complete, key=lambda r: r["val_bpb"])
        lines += ["", f"Best: trial {best['number']}, val_bpb {_fmt(best['val_bpb'])}, "
                      f"{_fmt(best['tokens_per_s'])} tokens/s, MFU {_fmt(best['mfu'])}."]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def summarize(args) -> int:
    """Tables of the study that ``autoscout run gpt_training`` workers filled."""
    import optuna

    study = optuna.load_study(study_name=args.study_name, storage=args.summarize)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch

        device = (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
        versions = f"torch {torch.__version__}"
    except ImportError:
        device, versions = "unknown", "no torch"
    table = rows(study)
    workers = {row["worker_pid"] for row in table if row["worker_pid"] != ""}
    write_tables(table, out, [
        f"- device: {device}; {versions}; Python {platform.python_version()}",
        f"- study {args.study_name!r} in {args.summarize}: {len(workers)} worker process(es)",
    ])
    print(f"{len(study.trials)} trials; results in {out / 'results.csv'} and {out / 'results.md'}")
    return 0


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "/")


if __name__ == "__main__":
    sys.exit(main())
