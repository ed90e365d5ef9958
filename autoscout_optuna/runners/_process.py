"""Watching a child process: output patterns, a line pump, killing its whole process group."""

from __future__ import annotations

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
THROUGHPUT_PATTERN = r"tok/s\W*([0-9]+\.?[0-9]*(?:[eE][-+]?\d+)?)"


def resolve_lock_name() -> str | None:
    """GPU this process may use: first of CUDA_VISIBLE_DEVICES, else GPU 0 if one exists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # an old-style MIG id ("MIG-GPU-<uuid>/1/0") holds slashes, which a lock file's name
        # cannot: each becomes "_" (the name stays one per device)
        first = visible.split(",")[0].strip().replace("/", "_")
        return first or None
    return "0" if Path("/dev/nvidia0").exists() else None


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
