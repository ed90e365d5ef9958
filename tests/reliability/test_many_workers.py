"""8 worker processes on one PostgreSQL study: nothing lost, no more duplicates than TPE.

Needs a server: ``.ci/run`` starts PostgreSQL and sets AUTOSCOUT_TEST_POSTGRES_URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

WORKER = Path(__file__).with_name("_pg_worker.py")
N_WORKERS = 8
N_TRIALS = 500
RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "reliability"


def run_workers(url: str, sampler: str) -> optuna.Study:
    name = f"workers-{sampler}-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=url, direction="maximize")
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), url, name, sampler, str(N_TRIALS), str(i)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(N_WORKERS)
    ]
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            errors.append(err[-2000:])
    assert errors == [], errors
    return optuna.load_study(study_name=name, storage=url)


def duplicate_fraction(study: optuna.Study) -> float:
    keys = [json.dumps(t.params, sort_keys=True) for t in study.trials]
    return 1 - len(set(keys)) / len(keys)


@pytest.mark.postgres
@pytest.mark.slow
def test_eight_workers_account_for_every_trial_and_spread_out():
    url = os.environ["AUTOSCOUT_TEST_POSTGRES_URL"]
    figures = {}
    for sampler in ("autoscout", "tpe"):
        study = run_workers(url, sampler)
        trials = study.trials
        # MaxTrialsCallback is checked per worker: up to N_WORKERS-1 extra trials may start.
        assert N_TRIALS <= len(trials) < N_TRIALS + N_WORKERS
        assert [t.number for t in trials] == list(range(len(trials)))
        assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                   for t in trials)
        failed = [t for t in trials if t.state == TrialState.FAIL]
        assert all("failure_reason" in t.user_attrs for t in failed)
        figures[sampler] = {
            "trials": len(trials),
            "complete": sum(t.state == TrialState.COMPLETE for t in trials),
            "pruned": sum(t.state == TrialState.PRUNED for t in trials),
            "failed": len(failed),
            "duplicate_fraction": round(duplicate_fraction(study), 4),
            "best": study.best_value,
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "many_workers.json").write_text(json.dumps(figures, indent=2) + "\n")
    assert figures["autoscout"]["duplicate_fraction"] <= figures["tpe"]["duplicate_fraction"]
