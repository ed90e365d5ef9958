"""Run any training or serving command as a trial: argument templates, metrics, failures."""


from __future__ import annotations

import math
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autoscout_optuna import _storage, _validate
from autoscout_optuna._failure import clip_detail
from autoscout_optuna._keys import FAILURE_REASON
from autoscout_optuna.runners._failure import RunFailed
from autoscout_optuna.runners._lock import GpuLock
from autoscout_optuna.runners._process import (
    NAN_PATTERN,
    OOM_PATTERN,
    THROUGHPUT_PATTERN,
    kill_group,
    progress_reading,
    pump_lines,
    resolve_lock_name,
)
from autoscout_optuna.runners._telemetry import GpuTelemetry
from autoscout_optuna.runners._template import placeholders, render


class CommandRunner:
    """Run a command for a trial and return the metrics it printed.

    Example:
        >>> import sys, optuna
        >>> runner = CommandRunner(
        ...     [sys.executable, "-c", "print('val_bpb: {x}')"],
        ...     metrics={"val_bpb": r"^val_bpb:\\s*(\\S+)"}, timeout=60, log_dir=None,
        ... )
        >>> runner.run(None, {"x": 1.5})["val_bpb"]
        1.5

    Args:
        command: Argument list (never a shell string); ``{name}`` takes ``config[name]``
            (``{{``/``}}`` are literal braces), checked against the trial's distributions.
        metrics: Metric name to a regex with one group, searched per line (multiline); the
            last match wins. ``AUTORESEARCH_METRICS`` parses autoresearch's ``val_bpb:`` line.
        timeout: Wall-clock seconds before the process group is killed (reason ``timeout``).
        env: Extra environment variables; values are templates like ``command``'s. A Python
            job runs unbuffered (``PYTHONUNBUFFERED=1``) unless the environment says otherwise.
        optional_metrics: Metrics whose absence is not a failure.
        log_dir: Per-trial logs go to ``log_dir/<study>/trial-<number>.log``; None keeps none.
        artifact_store: An ``optuna.artifacts`` store: each log is also uploaded to the trial.
        expected_throughput: ``config -> tokens/s`` (e.g. the simulator's estimate), or None.
        throughput_pattern: Regex with one group for the progress rate (``tok/s 12345``,
            autoresearch's ``tok/sec: 12,345``; thousands separators are dropped, a reading
            that is no number is ignored).
        throughput_attr: User attr that holds a trial's throughput, read from the incumbent.
        too_slow_fraction: Abort when the mean rate after warm-up is below this fraction of
            the expected or the incumbent's throughput (reason ``too_slow``).
        warmup_readings: Progress readings ignored first (they include compilation).
        lock: ``"auto"`` (the GPU of ``CUDA_VISIBLE_DEVICES``, none on a CPU machine), a
            device name to lock, or None. Two trials never share a locked device.
        lock_dir: Directory of the lock files (``GpuLock``'s default when None).
        telemetry: Sample the locked GPU with NVML during the run.
        cwd: Working directory of the command.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        metrics: Mapping[str, str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        optional_metrics: Collection[str] = (),
        log_dir: str | Path | None = "autoscout-logs",
        artifact_store: Any = None,
        expected_throughput: Callable[[Mapping[str, Any]], float | None] | None = None,
        throughput_pattern: str = THROUGHPUT_PATTERN,
        throughput_attr: str = "tokens_per_s",
        too_slow_fraction: float = 0.1,
        warmup_readings: int = 1,
        lock: str | None = "auto",
        lock_dir: str | Path | None = None,
        telemetry: bool = True,
        cwd: str | Path | None = None,
    ) -> None:
        if isinstance(command, str) or not command:
            raise TypeError("command must be a non-empty list of arguments, not a shell string")
        if not isinstance(metrics, Mapping) or not metrics:
            raise ValueError("metrics must be a non-empty mapping of metric name to regex")
        for name, pattern in {**metrics, "throughput_pattern": throughput_pattern}.items():
            label = name if name == "throughput_pattern" else f"metrics[{name!r}]"
            try:
                groups = re.compile(pattern).groups
            except (re.error, TypeError) as error:
                raise ValueError(f"{label} is not a valid regex: {pattern!r} ({error})") from None
            if groups != 1:
                raise ValueError(f"{label} must have exactly one group: {pattern!r}")
        _validate.reals(timeout=timeout, too_slow_fraction=too_slow_fraction)
        _validate.integers(warmup_readings=warmup_readings)
        _validate.booleans(telemetry=telemetry)
        _validate.optional_callables(expected_throughput=expected_throughput)
        if env is not None and not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping of variable name to template, got {env!r}")
        if lock is not None and not isinstance(lock, str):
            raise TypeError(f"lock must be 'auto', a device name (str) or None, got {lock!r}")
        if timeout is None or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not 0.0 <= too_slow_fraction < 1.0:
            raise ValueError(f"too_slow_fraction must be in [0, 1), got {too_slow_fraction}")
        if warmup_readings < 0:
            raise ValueError(f"warmup_readings must be >= 0, got {warmup_readings}")
        unknown = set(optional_metrics) - set(metrics)
        if unknown:
            raise ValueError(f"optional_metrics names unknown metrics: {sorted(unknown)}")
        self.command = [str(part) for part in command]
        self.metrics = {k: re.compile(v, re.MULTILINE) for k, v in metrics.items()}
        self.timeout = float(timeout)
        self.env = dict(env or {})
        self.optional_metrics = set(optional_metrics)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.artifact_store = artifact_store
        self.expected_throughput = expected_throughput
        self.throughput = re.compile(throughput_pattern)
        self.throughput_attr = throughput_attr
        self.too_slow_fraction = too_slow_fraction
        self.warmup_readings = warmup_readings
        self.lock = resolve_lock_name() if lock == "auto" else lock
        self.lock_dir = lock_dir
        self.telemetry = telemetry
        self.cwd = cwd
        self._oom = re.compile(OOM_PATTERN)
        self._nan = re.compile(NAN_PATTERN, re.IGNORECASE)

    @property
    def placeholder_names(self) -> list[str]:
        return sorted({n for t in [*self.command, *self.env.values()] for n in placeholders(t)})

    def run(self, trial: optuna.Trial | None, config: Mapping[str, Any]) -> dict[str, float]:
        """Run the command for ``trial`` (None: record nothing) with ``config``'s values.

        Returns:
            Metric name to value. On ``trial`` each metric is also a user attr, next to
            ``run:log``, ``run:wall_s``, ``run:returncode``, ``run:telemetry`` and, where a
            device is locked, ``run:lock_wait_s`` (and ``run:stale_lock_removed``,
            ``run:orphaned_job_killed`` where a dead worker's lock, or its job, was cleared).

        Raises:
            RunFailed: with ``.reason`` in ``REASONS``, after recording ``failure_reason``.
            TypeError, ValueError, KeyError: a config value does not fit its placeholder.
        """
        distributions = dict(trial.distributions) if trial is not None else {}
        args = render(self.command, config, distributions)
        env_values = render(list(self.env.values()), config, distributions)
        # a Python job's print() to our pipe is block-buffered: its progress would reach the
        # guards 8 KB at a time (nanoGPT's train.py does not flush); a value set wins
        env = {"PYTHONUNBUFFERED": "1", **os.environ,
               **dict(zip(self.env, env_values, strict=True))}
        reference = self._reference_throughput(trial, config)
        log_path = self._log_path(trial)
        attrs: dict[str, Any] = {"run:command": args, "run:expected_throughput": reference}
        if log_path is not None:
            attrs["run:log"] = str(log_path)
        lock = GpuLock(self.lock, lock_dir=self.lock_dir) if self.lock else None
        # NVML numbers GPUs by PCI bus; CUDA does too under CUDA_DEVICE_ORDER=PCI_BUS_ID
        telemetry = GpuTelemetry(device_index=int(self.lock)) if (
            self.telemetry and self.lock and self.lock.isdigit()) else None
        try:
            if lock is not None:
                waited_from = time.monotonic()
                lock.acquire()
                # with several workers per GPU, the time queued for the device is part of the
                # cost of a trial, and a long wait points at a stuck lock holder
                attrs["run:lock_wait_s"] = round(time.monotonic() - waited_from, 3)
                if lock.stale_removed:
                    attrs["run:stale_lock_removed"] = lock.stale_removed
                if lock.orphan_killed:
                    attrs["run:orphaned_job_killed"] = lock.orphan_killed
            if telemetry is not None:
                telemetry.start()
            try:
                values = self._execute(args, env, log_path, reference, attrs, lock)
            finally:
                if telemetry is not None:
                    telemetry.stop()
                    attrs["run:telemetry"] = telemetry.summary()
        except RunFailed as error:
            error.log_path = str(log_path) if log_path else None
            self._record(trial, attrs, log_path, failure=error)
            raise
        finally:
            if lock is not None:
                lock.release()
        self._record(trial, {**attrs, **values}, log_path, failure=None)
        return values

    def _execute(self, args: list[str], env: dict[str, str], log_path: Path | None,
                 reference: float | None, attrs: dict[str, Any],
                 lock: GpuLock | None) -> dict[str, float]:
        started = time.monotonic()
        log = open(log_path, "w") if log_path is not None else None  # noqa: SIM115
        try:
            process = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                text=True, errors="replace", bufsize=1, start_new_session=True,
            )
        except OSError as error:
            if log is not None:
                log.close()
            raise RunFailed("crash", f"cannot start {args[0]!r}: {error}") from error
        if lock is not None:  # should this worker die, the next one ends the job first
            lock.hold_job(process.pid)
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=pump_lines, args=(process.stdout, lines), daemon=True)
        reader.start()
        tail: deque[str] = deque(maxlen=20)
        found: dict[str, str] = {}
        rates: list[float] = []
        abort: tuple[str, str] | None = None
        oom_seen = nan_seen = leftovers = False
        exit_seen: list[float] = []  # when the job was first seen exited, for the output grace
        try:
            while True:
                remaining = started + self.timeout - time.monotonic()
                if remaining <= 0:
                    abort = ("timeout", f"killed after {self.timeout:g} s")
                    break
                try:
                    line = lines.get(timeout=min(remaining, 0.5))
                except queue.Empty:
                    if _exited_with_output_held(process, exit_seen):
                        leftovers = True
                        break
                    continue
                if line is None:
                    break
                if log is not None:
                    log.write(line)
                    log.flush()
                tail.append(line.rstrip("\n"))
                for name, pattern in self.metrics.items():
                    match = pattern.search(line)
                    if match:
                        found[name] = match.group(1)
                oom_seen = oom_seen or bool(self._oom.search(line))
                if self._nan.search(line):
                    nan_seen = True
                    abort = ("nan", line.strip()[:300])
                    break
                rate = self.throughput.search(line)
                reading = progress_reading(rate.group(1)) if rate else None
                if reading is not None:
                    rates.append(reading)
                    abort = self._too_slow(rates, reference)
                    if abort:
                        break
            if abort is None:  # output closed: give the process the rest of its time to exit
                try:
                    process.wait(timeout=max(started + self.timeout - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    abort = ("timeout", f"killed after {self.timeout:g} s")
        finally:
            if abort is not None or process.poll() is None or leftovers:
                kill_group(process)  # leftovers: a finished job's helpers may hold the GPU
            returncode = _reap(process)
            reader.join(timeout=5.0)
            if log is not None:
                log.close()
        attrs["run:wall_s"] = round(time.monotonic() - started, 3)
        attrs["run:returncode"] = returncode
        counted = rates[self.warmup_readings:]
        if counted:
            attrs["run:throughput_mean"] = sum(counted) / len(counted)
        detail = "\n".join(tail)[-1500:]
        if returncode is None:
            raise RunFailed(abort[0] if abort else "crash",
                            f"the job (pid {process.pid}) did not exit after SIGKILL: stuck in "
                            f"the kernel or the GPU driver, the device may need a reset\n"
                            f"{detail}".strip())
        if abort is not None:
            raise RunFailed(abort[0], f"{abort[1]}\n{detail}".strip())
        if returncode != 0:
            if oom_seen or returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
                raise RunFailed("oom", f"exit {returncode}\n{detail}")
            raise RunFailed("nan" if nan_seen else "crash", f"exit {returncode}\n{detail}")
        values: dict[str, float] = {}
        for name in self.metrics:
            if name not in found:
                if name not in self.optional_metrics:
                    raise RunFailed("no_metric", f"no {name!r} in the output\n{detail}")
                continue
            try:
                values[name] = float(found[name])
            except ValueError:
                raise RunFailed("no_metric", f"{name!r} is not a number: {found[name]!r}") from None
            if not math.isfinite(values[name]):
                raise RunFailed("nan", f"{name} = {found[name]}")
        return values

    def _too_slow(self, rates: list[float], reference: float | None) -> tuple[str, str] | None:
        counted = rates[self.warmup_readings:]
        if not counted or not reference or self.too_slow_fraction <= 0:
            return None
        mean = sum(counted) / len(counted)
        if mean < self.too_slow_fraction * reference:
            return ("too_slow", f"{mean:.4g} tok/s after warm-up, below "
                                f"{self.too_slow_fraction:g} x the expected {reference:.4g}")
        return None

    def _reference_throughput(self, trial: optuna.Trial | None,
                              config: Mapping[str, Any]) -> float | None:
        """The throughput a healthy run should reach: the larger of estimate and incumbent."""
        references = []
        if self.expected_throughput is not None:
            expected = self.expected_throughput(config)
            if expected is not None and math.isfinite(expected) and expected > 0:
                references.append(float(expected))
        if trial is not None and len(trial.study.directions) == 1:
            completed = _storage.get_trials(trial.study, states=(TrialState.COMPLETE,))
            scored = [t for t in completed if t.value is not None
                      and isinstance(t.user_attrs.get(self.throughput_attr), (int, float))]
            if scored:
                pick = min if trial.study.direction.name == "MINIMIZE" else max
                best = pick(scored, key=lambda t: t.value)
                references.append(float(best.user_attrs[self.throughput_attr]))
        return max(references) if references else None

    def _log_path(self, trial: optuna.Trial | None) -> Path | None:
        if self.log_dir is None:
            return None
        if trial is None:
            folder, name = self.log_dir / "no-study", f"run-{time.time_ns()}-{os.getpid()}.log"
        else:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", trial.study.study_name)
            folder, name = self.log_dir / safe, f"trial-{trial.number:05d}.log"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def _record(self, trial: optuna.Trial | None, attrs: Mapping[str, Any],
                log_path: Path | None, *, failure: RunFailed | None) -> None:
        if trial is None:
            return
        for key, value in attrs.items():
            if value is not None:
                trial.set_user_attr(key, value)
        if failure is not None:
            trial.set_user_attr(FAILURE_REASON, failure.reason)
            trial.set_user_attr("failure_detail", clip_detail(failure.detail))
        if self.artifact_store is not None and log_path is not None and log_path.exists():
            from optuna.artifacts import upload_artifact

            artifact_id = upload_artifact(artifact_store=self.artifact_store,
                                          file_path=str(log_path), study_or_trial=trial,
                                          mimetype="text/plain")
            trial.set_user_attr("run:log_artifact_id", artifact_id)


# Seconds to wait for a killed job to exit: one stuck in the GPU driver (D state) outlives
# SIGKILL, and waiting for it without a limit hung the worker with its trial RUNNING.
UNKILLABLE_WAIT_S = 30.0


def _reap(process: subprocess.Popen) -> int | None:
    """The killed (or exited) job's return code; None if it did not exit in time."""
    try:
        return process.wait(timeout=UNKILLABLE_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


# Seconds the output may stay open after the job exited: a helper it started (a compile worker,
# a logging daemon) inherits stdout and keeps it open; waiting for EOF would then run into the
# timeout and record a finished run as ``timeout``.
OUTPUT_GRACE_S = 2.0


def _exited_with_output_held(process: subprocess.Popen, exit_seen: list[float]) -> bool:
    """True once ``process`` has exited and its output stayed quiet for ``OUTPUT_GRACE_S``.

    Args:
        process: The job.
        exit_seen: Empty until the job is first seen exited; then holds that moment.
    """
    if process.poll() is None:
        return False
    if not exit_seen:
        exit_seen.append(time.monotonic())
    return time.monotonic() - exit_seen[0] >= OUTPUT_GRACE_S
