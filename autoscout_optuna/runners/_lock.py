"""One trial per GPU: a lock file that names its owner, and that a dead owner does not keep.

The lock is a file created with ``O_EXCL`` holding ``hostname:pid`` and the owner's start time
(``start <ticks>``), then the job it runs on the device (``job <pid> <ticks>``). A lock whose
owner process on this host no longer exists is stale (a worker killed by the OOM killer, a ^C
at the wrong moment) and is removed; a pid now used by another process (a later start time)
does not keep it. The dead owner's job may still run (it has a session of its own): its process
group is killed before the device is taken, as nobody will read its result. The
check-then-remove runs under an ``flock`` on a side file, so two workers finding the same stale
lock cannot both take the GPU.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from autoscout_optuna._recovery import process_start

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


def _running(pid: int, start: int | None) -> bool:
    """Whether ``pid`` runs and, where its start time ``start`` is known, is still the process
    that started then (not another one that was given the pid after it died)."""
    if not _pid_alive(pid):
        return False
    now = process_start(pid)
    return start is None or now is None or now == start


def _stamped(label: str, pid: int) -> str:
    """``label`` and ``pid``'s start time as a lock file line; none where it is unknown (no
    procfs), for then neither pid reuse nor an orphaned job can be told apart."""
    start = process_start(pid)
    return "" if start is None else f"{label} {start}\n"


def _numbers(lines: list[str], key: str) -> list[int]:
    """The integers after ``key`` on the lock file's line starting with it (none: [])."""
    for line in lines[1:]:
        word, *rest = line.split()
        if word == key and rest and all(part.isdigit() for part in rest):
            return [int(part) for part in rest]
    return []


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
        self.orphan_killed: int | None = None  # the pid of that owner's job, killed

    def _lines(self) -> list[str]:
        try:
            return [line for line in self.path.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            return []

    def owner(self) -> str | None:
        """``hostname:pid`` written in the lock file, or None when unlocked."""
        lines = self._lines()
        return lines[0].strip() if lines else None

    def _is_stale(self, lines: list[str]) -> bool:
        if not lines:
            return True  # created but not yet written, or garbage: judged under the guard
        host, _, pid = lines[0].strip().rpartition(":")
        if host != socket.gethostname():
            return False  # cannot check another machine's processes: respect it
        start = _numbers(lines, "start")
        return not pid.isdigit() or not _running(int(pid), start[0] if start else None)

    def _end_orphaned_job(self, lines: list[str]) -> None:
        """Kill the process group of the job a dead owner left running on the device."""
        job = _numbers(lines, "job")
        if len(job) != 2:
            return
        pid, start = job
        if process_start(pid) not in (None, start):
            return  # the pid names another process now: not the job's
        # gone leader, live helpers: a pid is not reused while it is a live group's id
        try:
            if self.path.stat().st_uid != os.getuid():
                return  # another user's file (a shared lock dir) must not make us kill anything
            os.killpg(pid, signal.SIGKILL)  # the job runs in a session (group) of its own
        except OSError:  # no such group (it ended), or not ours to signal
            return
        self.orphan_killed = pid

    def try_acquire(self) -> bool:
        """Take the lock if free (or stale); False if a live process holds it."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        guard = os.open(self.lock_dir / f".{self.path.name}.guard", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            if self.path.exists():
                lines = self._lines()
                if not self._is_stale(lines):
                    return False
                self._end_orphaned_job(lines)
                self.path.unlink(missing_ok=True)
                self.stale_removed = lines[0].strip() if lines else "<empty>"
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except OSError as error:  # pragma: no cover - only without the guard's protection
                if error.errno == errno.EEXIST:
                    return False
                raise
            with os.fdopen(fd, "w") as file:
                file.write(self._owner_lines())
            self.held = True
            return True
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
            os.close(guard)

    @staticmethod
    def _owner_lines() -> str:
        return f"{socket.gethostname()}:{os.getpid()}\n" + _stamped("start", os.getpid())

    def hold_job(self, pid: int) -> None:
        """Name ``pid`` (a process group leader) as the job this lock's owner runs on the device,
        so that the next owner ends it should this process die first."""
        if not self.held or self.owner() != f"{socket.gethostname()}:{os.getpid()}":
            return
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_text(self._owner_lines() + _stamped(f"job {pid}", pid))
        os.replace(temporary, self.path)  # readers see the old file or the new one, whole

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
