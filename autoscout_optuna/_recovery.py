"""Trials orphaned by a dead worker: detect, fail with a reason, retry in place of the original.

A worker that dies (SIGKILL, OOM killer, power loss) leaves its trial RUNNING forever. Each trial
our samplers start is tagged with the worker's identity (host, pid, process start time, so a
reused pid is not mistaken for the original). On resume, a RUNNING trial whose worker is gone
from this host is failed with ``failure_reason="worker_died"`` and marked orphaned; with
``retry=True`` the configuration is run again. Our samplers skip orphaned trials and number their
decisions without them (``_history.decision_number``), so the next trial sees exactly what the
orphan saw and proposes the same configuration by itself, recording the same decisions: a
resumed study with a fixed seed and a deterministic objective proposes what the uninterrupted
study would have. For any other sampler the orphan's params are enqueued instead.

Workers on other hosts are left to Optuna's heartbeat (``RDBStorage(heartbeat_interval=...)``).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoscout_optuna._keys import FAILURE_REASON, ORPHANED, RETRY_OF, WORKER
from autoscout_optuna._storage import fail_trial, get_trials, set_system_attr, set_user_attr

WORKER_DIED = "worker_died"  # the failure reason of a trial orphaned by its dead worker
INTERRUPTED = "interrupted"  # the failure reason of a trial stopped by Ctrl-C
# Trials that failed with these reasons are runs that were never made, not failed configs.
LOST_RUN_REASONS = frozenset({WORKER_DIED, INTERRUPTED})


def worker_identity(pid: int | None = None) -> dict[str, Any]:
    """This process's identity: host, pid and the pid's start time (guards against pid reuse)."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid": pid, "start": process_start(pid)}


def tag_worker(study: optuna.Study, trial: FrozenTrial) -> None:
    """Record which process runs ``trial`` (called when a trial starts)."""
    set_system_attr(study, trial, WORKER, worker_identity())


def worker_gone(identity: Any) -> bool:
    """True when ``identity`` (from :func:`worker_identity`) names a process of this host that
    no longer exists; False while it lives, and for other hosts (whose processes we cannot see)."""
    if not isinstance(identity, dict) or identity.get("host") != socket.gethostname():
        return False
    pid = identity.get("pid")
    return not isinstance(pid, int) or process_start(pid) != identity.get("start")


def is_orphaned(trial: FrozenTrial) -> bool:
    """True for a RUNNING trial whose tagged worker no longer exists on this host."""
    if trial.state != TrialState.RUNNING:
        return False
    return worker_gone(trial.system_attrs.get(WORKER))


def mark_interrupted(trial: optuna.Trial) -> None:
    """Record that Ctrl-C stopped ``trial`` in mid-run (Optuna then fails it).

    Like a dead worker's trial, its run was never made: orphaned, our samplers skip it and
    propose its config again when the study resumes, as the uninterrupted study would have run
    it, and a confirmation run it was is asked for again (``_confirm``) instead of failing its
    config.
    """
    trial.set_user_attr(FAILURE_REASON, INTERRUPTED)
    set_system_attr(trial.study, trial, ORPHANED, True)


def recover_orphaned_trials(study: optuna.Study, *, retry: bool = True) -> list[int]:
    """Fail the trials of dead workers on this host, optionally re-enqueue their params.

    Returns:
        The numbers of the trials that were failed.
    """
    recovered = []
    for trial in get_trials(study, states=(TrialState.RUNNING,)):
        if not is_orphaned(trial):
            continue
        set_system_attr(study, trial, ORPHANED, True)
        set_user_attr(study, trial, FAILURE_REASON, WORKER_DIED)
        fail_trial(study, trial)
        if retry and not getattr(study.sampler, "reproposes_orphans", False):
            study.enqueue_trial(dict(trial.params), user_attrs={RETRY_OF: trial.number},
                                skip_if_exists=False)
        recovered.append(trial.number)
    return recovered


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux); None if there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces: fields after it follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])
