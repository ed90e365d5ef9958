"""One worker process per GPU, all on one storage.

Each worker is the same command (typically ``autoscout run STUDY --storage URL``) started with
``CUDA_VISIBLE_DEVICES`` set to one GPU, so inside it ``cuda`` means that GPU and the runner's
lock names it. Workers share nothing but the storage: the samplers rebuild their state from it
and treat the other workers' RUNNING trials as pending.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from autoscout_optuna.runners._template import placeholders, render


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else the NVML count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [part.strip() for part in visible.split(",") if part.strip()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA library or driver: no GPUs
        return []


def launch_workers(
    command: Sequence[str],
    *,
    gpus: Sequence[int | str] | None = None,
    env: Mapping[str, str] | None = None,
    log_dir: str | Path | None = None,
) -> list[subprocess.Popen]:
    """Start ``command`` once per GPU, each pinned with ``CUDA_VISIBLE_DEVICES``.

    ``{gpu}`` in an argument takes the worker's GPU id (e.g. a per-worker log name). The
    arguments are templates as in ``CommandRunner``: ``{{`` and ``}}`` are literal braces (a
    Python ``-c`` argument or a JSON value must double its braces), and ``{gpu}`` is the only
    placeholder.

    Example:
        >>> import sys
        >>> workers = launch_workers([sys.executable, "-c", "print('worker on {gpu}')"],
        ...                          gpus=["0", "1"])
        >>> [w.wait() for w in workers]
        [0, 0]

    Args:
        command: The worker command, e.g. ``["autoscout", "run", "gpt_training", "--storage",
            "postgresql://...", "--n-trials", "20"]``; every worker must name the same storage.
        gpus: GPU ids; default: every GPU of ``visible_gpus()``.
        env: Extra environment for every worker.
        log_dir: If set, worker ``i`` writes its output to ``log_dir/worker-gpu<i>.log``.

    Returns:
        The started processes (``wait()`` on them).

    Raises:
        ValueError: no GPUs given or found, a GPU id listed twice, or a placeholder other
            than ``{gpu}`` in ``command``.
        TypeError: ``gpus`` is one string (``"0,1"``) instead of a list of ids.
    """
    if isinstance(gpus, (str, bytes)):
        # a string is a Sequence: "0,1" would start three workers, one pinned to ","
        raise TypeError(f"gpus must be a list of GPU ids such as ['0', '1'], not the string "
                        f"{gpus!r}")
    if isinstance(command, str) or not command:
        raise TypeError("command must be a non-empty list of arguments, not a shell string")
    unknown = sorted({n for part in command for n in placeholders(str(part))} - {"gpu"})
    if unknown:
        raise ValueError(f"command has placeholders {', '.join(f'{{{n}}}' for n in unknown)}, "
                         "but launch_workers fills only {gpu} (write {{ and }} for literal "
                         "braces)")
    ids = [str(g) for g in (visible_gpus() if gpus is None else gpus)]
    if not ids:
        raise ValueError("gpus is empty and no GPU is visible: nothing to pin workers to")
    if len(set(ids)) != len(ids):
        raise ValueError(f"gpus lists a GPU twice: {ids}")
    processes: list[subprocess.Popen] = []
    try:
        for gpu in ids:
            args = render([str(part) for part in command], {"gpu": gpu})
            # PCI bus order makes CUDA's GPU ids the ones NVML (telemetry) and nvidia-smi use
            worker_env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **os.environ, **dict(env or {}),
                          "CUDA_VISIBLE_DEVICES": gpu}
            output = None
            if log_dir is not None:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                output = open(Path(log_dir) / f"worker-gpu{gpu}.log", "w")  # noqa: SIM115
            try:
                processes.append(subprocess.Popen(args, env=worker_env, stdout=output,
                                                  stderr=subprocess.STDOUT if output else None))
            finally:
                if output is not None:
                    output.close()  # the child holds its own descriptor
    except BaseException:
        # the caller gets no handle on the workers already started: stop them, or they run
        # on unsupervised, each holding its GPU
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        raise
    return processes
