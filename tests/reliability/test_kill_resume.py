"""kill -9 at 20 points (sampling, objective, storage write) and resume from SQLite."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from autoscout_optuna._keys import FAILURE_REASON, ORPHANED

WORKER = Path(__file__).with_name("_kill_worker.py")
N_COMPLETE = 80
HOOKS = ["sample", "objective", "storage_write", "storage_commit"]


def run_worker(url, *kill):
    return subprocess.run(
        [sys.executable, str(WORKER), url, "s", str(N_COMPLETE), *map(str, kill)],
        capture_output=True, text=True, timeout=300,
    )


def complete(url):
    study = optuna.load_study(study_name="s", storage=url)
    return [(t.number, t.params, t.value) for t in study.get_trials(states=(TrialState.COMPLETE,))]


@pytest.mark.slow
def test_twenty_kills_lose_nothing_and_resume_as_one_study(tmp_path):
    reference_url = f"sqlite:///{tmp_path / 'reference.db'}"
    assert run_worker(reference_url).returncode == 0
    uninterrupted = complete(reference_url)
    assert len(uninterrupted) == N_COMPLETE

    url = f"sqlite:///{tmp_path / 'killed.db'}"
    rng = np.random.default_rng(2026)
    kills = 0
    seen: dict[int, tuple] = {}
    for attempt in range(60):
        if kills == 20:
            break
        hook = HOOKS[attempt % len(HOOKS)]
        count = int(rng.integers(1, 6))
        result = run_worker(url, hook, count)
        if result.returncode == -signal.SIGKILL:
            kills += 1
        else:
            assert result.returncode == 0, result.stderr[-2000:]
        now = {n: (p, v) for n, p, v in complete(url)}
        # No COMPLETE trial is ever lost or altered by a kill.
        assert all(now.get(n) == pv for n, pv in seen.items())
        seen = now
    assert kills == 20
    assert run_worker(url).returncode == 0

    study = optuna.load_study(study_name="s", storage=url)
    orphans = [t for t in study.trials if t.system_attrs.get(ORPHANED)]
    assert orphans, "some kills must have left RUNNING trials behind"
    assert all(t.state == TrialState.FAIL for t in orphans)
    assert all(t.user_attrs[FAILURE_REASON] == "worker_died" for t in orphans)
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    # The resumed study proposed, in order, exactly what the uninterrupted one did.
    resumed = [(p, v) for _, p, v in complete(url)][:N_COMPLETE]
    assert resumed == [(p, v) for _, p, v in uninterrupted]
