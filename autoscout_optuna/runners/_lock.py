"""One trial per GPU: a lock file that names its owner, and that a dead owner does not keep.

The lock is a file created with ``O_EXCL`` holding ``hostname:pid``. A lock whose owner process
on this host no longer exists is stale (a worker killed by the OOM killer, a ^C at the wrong
moment) and is removed. The check-then-remove runs under an ``flock`` on a side file, so two
workers finding the same stale lock cannot both take the GPU.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
import time
from pathlib import Path

DEFAULT_LOCK_DIR = Path(tempfile.gettempdir()) / "autoscout-locks"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A dead process its parent has not reaped yet: kill(pid, 0) still finds it (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs (macOS), or gone meanwhile
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


class GpuLock:
    """An exclusive, stale-safe lock on one device, for use as a context manager.

    Example:
        >>> import tempfile
        >>> with GpuLock("0", lock_dir=tempfile.mkdtemp()) as lock:
        ...     lock.held
        True

    Args:
        name: The device, e.g. ``"0"`` for GPU 0 (any file-name-safe string).
        lock_dir: Where lock files live; every worker of a machine must use the same one.
        timeout: Seconds to wait for a live owner; 0 fails at once, None waits forever.
        poll_interval: Seconds between attempts while waiting.
    """

    def __init__(self, name: str, *, lock_dir: str | Path | None = None,
                 timeout: float | None = None, poll_interval: float = 0.5) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"name must be a file-name-safe device name, got {name!r}")
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        self.lock_dir = Path(lock_dir) if lock_dir is not None else DEFAULT_LOCK_DIR
        self.path = self.lock_dir / f"gpu-{name}.lock"
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.held = False
        self.stale_removed: str | None = None  # the owner of a stale lock this lock replaced

    def owner(self) -> str | None:
        """``hostname:pid`` written in the lock file, or None when unlocked."""
        try:
            return self.path.read_text().strip() or None
        except FileNotFoundError:
            return None

    def _is_stale(self, owner: str | None) -> bool:
        if owner is None:
            return True  # created but not yet written, or garbage: judged under the guard
        host, _, pid = owner.rpartition(":")
        if host != socket.gethostname():
            return False  # cannot check another machine's processes: respect it
        return not pid.isdigit() or not _pid_alive(int(pid))

    def try_acquire(self) -> bool:
        """Take the lock if free (or stale); False if a live process holds it."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        guard = os.open(self.lock_dir / f".{self.path.name}.guard", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            if self.path.exists():
                owner = self.owner()
                if not self._is_stale(owner):
                    return False
                self.path.unlink(missing_ok=True)
                self.stale_removed = owner or "<empty>"
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except OSError as error:  # pragma: no cover - only without the guard's protection
                if error.errno == errno.EEXIST:
                    return False
                raise
            with os.fdopen(fd, "w") as file:
                file.write(f"{socket.gethostname()}:{os.getpid()}\n")
            self.held = True
            return True
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
            os.close(guard)

    def acquire(self) -> GpuLock:
        """Wait until the lock is taken; raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self.try_acquire():
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.path} is held by {self.owner()}")
            time.sleep(self.poll_interval)
        return self

    def release(self) -> None:
        """Remove the lock file if this process still owns it."""
        if self.held and self.owner() == f"{socket.gethostname()}:{os.getpid()}":
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> GpuLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "held": False}
