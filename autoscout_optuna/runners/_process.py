"""Watching a child process: output patterns, a line pump, killing its whole process group."""

from __future__ import annotations

import math
import os
import queue
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

_NUMBER = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf))"
# autoresearch's summary block (``val_bpb: 0.9979``), also what ``runners.gpt`` prints
AUTORESEARCH_METRICS = {"val_bpb": rf"^val_bpb:\s*{_NUMBER}"}
OOM_PATTERN = (r"CUDA out of memory|OutOfMemoryError|HIP out of memory|\bMemoryError\b|"
               r"std::bad_alloc|Cannot allocate memory")
NAN_PATTERN = r"\bloss\b\W*(?:is\s+)?[-+]?(?:nan|inf)\b"
# "tok/s 12345" (runners.gpt), "tok/sec: 12,345" (autoresearch's progress line): the digits may
# carry thousands separators, which ``progress_reading`` drops
THROUGHPUT_PATTERN = r"tok/s(?:ec)?\W*([0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?\d+)?)"


def progress_reading(text: str) -> float | None:
    """A throughput reading as a number (``"12,345"`` is 12345); None when it is none."""
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def resolve_lock_name(device: str | None = None) -> str | None:
    """The lock name of the GPU a job on ``device`` uses; None for a CPU job.

    Args:
        device: A torch device: ``"cuda:i"`` is the i-th visible GPU, ``"cuda"`` the first,
            ``"cpu"`` none. None: the first of CUDA_VISIBLE_DEVICES, else GPU 0 if one exists.

    Raises:
        ValueError: ``device`` names a GPU that CUDA_VISIBLE_DEVICES does not make visible.
    """
    if device is not None and not device.startswith("cuda"):
        return None
    index = int(device.partition(":")[2] or 0) if device is not None else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        if device is None and not Path("/dev/nvidia0").exists():
            return None
        return str(index)
    ids = [part.strip() for part in visible.split(",")]
    if device is None and not ids[0]:
        return None  # CUDA_VISIBLE_DEVICES="" hides every GPU
    if index >= len(ids) or not ids[index]:
        raise ValueError(f"device {device!r} is not among the GPUs CUDA_VISIBLE_DEVICES="
                         f"{visible!r} makes visible")
    # an old-style MIG id ("MIG-GPU-<uuid>/1/0") holds slashes, which a lock file's name
    # cannot: each becomes "_" (the name stays one per device)
    return ids[index].replace("/", "_")


def pump_lines(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    stream.close()
    lines.put(None)


def kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the whole process group (the trainer's dataloader workers too), then SIGKILL
    whatever of the group is left after the grace, even when the job itself is gone already
    (a helper that ignores SIGTERM would otherwise outlive it, holding the GPU)."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while True:
            try:
                process.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
                if not _group_alive(process.pid):
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (a zombie awaiting its reaper counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
