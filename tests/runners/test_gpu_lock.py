"""GpuLock: one owner at a time; a lock left by a dead process is cleaned up."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscout_optuna.runners import GpuLock

REPO = Path(__file__).resolve().parents[2]


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid  # reaped: no process has this pid now (pids are not reused this fast)


def test_stale_lock_of_a_dead_process_is_removed(tmp_path):
    stale = f"{socket.gethostname()}:{dead_pid()}"
    (tmp_path / "gpu-0.lock").write_text(stale + "\n")
    lock = GpuLock("0", lock_dir=tmp_path, timeout=0)
    with lock:
        assert lock.owner() == f"{socket.gethostname()}:{os.getpid()}"
        assert lock.stale_removed == stale
    assert not (tmp_path / "gpu-0.lock").exists()


def test_garbage_lock_file_is_stale(tmp_path):
    (tmp_path / "gpu-1.lock").write_text("")
    assert GpuLock("1", lock_dir=tmp_path, timeout=0).try_acquire()


def test_live_owner_keeps_the_lock(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "gpu-0.lock").write_text(f"{socket.gethostname()}:{sleeper.pid}\n")
        with pytest.raises(TimeoutError, match="held by"):
            GpuLock("0", lock_dir=tmp_path, timeout=0).acquire()
        assert (tmp_path / "gpu-0.lock").read_text().strip().endswith(str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    # once the owner is gone its lock is stale and can be taken
    assert GpuLock("0", lock_dir=tmp_path, timeout=0).try_acquire()


def test_two_locks_on_one_gpu_exclude_each_other_but_not_other_gpus(tmp_path):
    first = GpuLock("0", lock_dir=tmp_path, timeout=0).acquire()
    assert not GpuLock("0", lock_dir=tmp_path, timeout=0).try_acquire()
    assert GpuLock("1", lock_dir=tmp_path, timeout=0).try_acquire()
    first.release()
    assert GpuLock("0", lock_dir=tmp_path, timeout=0).try_acquire()


def test_another_hosts_lock_is_respected(tmp_path):
    (tmp_path / "gpu-0.lock").write_text(f"not-{socket.gethostname()}:{dead_pid()}\n")
    assert not GpuLock("0", lock_dir=tmp_path, timeout=0).try_acquire()


def test_release_never_removes_someone_elses_lock(tmp_path):
    lock = GpuLock("0", lock_dir=tmp_path, timeout=0).acquire()
    (tmp_path / "gpu-0.lock").write_text("other-host:1\n")  # taken over after a stale cleanup
    lock.release()
    assert (tmp_path / "gpu-0.lock").exists()


def test_arguments_are_validated_and_lock_pickles_unheld(tmp_path):
    with pytest.raises(ValueError, match="name"):
        GpuLock("../x", lock_dir=tmp_path)
    with pytest.raises(ValueError, match="timeout"):
        GpuLock("0", lock_dir=tmp_path, timeout=-1)
    lock = GpuLock("0", lock_dir=tmp_path).acquire()
    assert pickle.loads(pickle.dumps(lock)).held is False


def test_lock_of_a_dead_worker_its_parent_has_not_reaped_is_stale(tmp_path):
    # a worker that died holding the lock stays a zombie until its parent waits on it; the
    # lock was judged live all that time, and a worker restarted on that GPU waited forever
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            f"from autoscout_optuna.runners import GpuLock\n"
            f"GpuLock('0', lock_dir={str(tmp_path)!r}).try_acquire()\n"
            f"import os; os._exit(1)")
    child = subprocess.Popen([sys.executable, "-c", code])
    lock_file = tmp_path / "gpu-0.lock"
    stat = Path(f"/proc/{child.pid}/stat")
    for _ in range(200):  # until it has taken the lock and exited (unreaped)
        if lock_file.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    try:
        lock = GpuLock("0", lock_dir=tmp_path, timeout=0)
        assert lock.try_acquire()
        assert lock.stale_removed.endswith(f":{child.pid}")
        lock.release()
    finally:
        child.wait()


@pytest.mark.parametrize("visible, name", [
    ("1,2", "1"),
    ("MIG-GPU-5c9ea9d2-6c1b/1/0", "MIG-GPU-5c9ea9d2-6c1b_1_0"),
    ("GPU-5c9ea9d2, GPU-77", "GPU-5c9ea9d2"),
])
def test_the_lock_of_the_visible_device_has_a_file_name_safe_name(tmp_path, monkeypatch,
                                                                   visible, name):
    from autoscout_optuna.runners._process import resolve_lock_name

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert resolve_lock_name() == name
    with GpuLock(name, lock_dir=tmp_path):  # an old-style MIG id made GpuLock refuse it
        assert (tmp_path / f"gpu-{name}.lock").exists()


def test_no_visible_gpu_means_no_lock_and_an_invisible_device_is_refused(monkeypatch):
    from autoscout_optuna.runners._process import resolve_lock_name

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_lock_name() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(ValueError, match="'cuda:2' is not among the GPUs"):
        resolve_lock_name("cuda:2")


def test_a_lock_naming_a_reused_pid_is_stale(tmp_path):
    # the owner's pid alone was checked: once a dead worker's pid was reused by any process,
    # its lock was judged live and a worker on that GPU waited for it forever
    from autoscout_optuna._recovery import process_start

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stamp = process_start(sleeper.pid)
        owner = f"{socket.gethostname()}:{sleeper.pid}"
        (tmp_path / "gpu-0.lock").write_text(f"{owner}\nstart {stamp + 1}\n")
        lock = GpuLock("0", lock_dir=tmp_path, timeout=0)
        assert lock.try_acquire() and lock.stale_removed == owner
        lock.release()
        (tmp_path / "gpu-0.lock").write_text(f"{owner}\nstart {stamp}\n")  # the owner itself
        assert not GpuLock("0", lock_dir=tmp_path, timeout=0).try_acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_job_of_a_dead_lock_owner_is_ended_before_the_gpu_is_taken(tmp_path, monkeypatch):
    # a worker killed with -9 leaves its job running (the job has a session of its own); the
    # next worker removed the stale lock and started a trial beside it on the same GPU (an
    # OOM or a halved throughput recorded against the new trial's config)
    from autoscout_optuna._recovery import process_start

    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
    try:
        owner = f"{socket.gethostname()}:{dead_pid()}"
        (tmp_path / "gpu-0.lock").write_text(
            f"{owner}\njob {orphan.pid} {process_start(orphan.pid)}\n")
        lock = GpuLock("0", lock_dir=tmp_path, timeout=0)
        assert lock.try_acquire()
        assert (lock.stale_removed, lock.orphan_killed) == (owner, orphan.pid)
        assert orphan.wait(timeout=10) == -9
        lock.release()
        # a job line whose pid now names another process (reused) is left alone
        (tmp_path / "gpu-0.lock").write_text(
            f"{owner}\njob {bystander.pid} {process_start(bystander.pid) + 1}\n")
        lock = GpuLock("0", lock_dir=tmp_path, timeout=0)
        assert lock.try_acquire() and lock.orphan_killed is None
        assert bystander.poll() is None
        lock.release()
        # nor does a lock file another user wrote make us kill anything
        (tmp_path / "gpu-0.lock").write_text(
            f"{owner}\njob {bystander.pid} {process_start(bystander.pid)}\n")
        real_uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
        lock = GpuLock("0", lock_dir=tmp_path, timeout=0)
        assert lock.try_acquire() and lock.orphan_killed is None
        assert bystander.poll() is None
    finally:
        for process in (orphan, bystander):
            process.kill()
            process.wait()
