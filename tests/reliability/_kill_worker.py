"""A study worker that SIGKILLs itself at a chosen point (used by test_kill_resume.py).

usage: _kill_worker.py STORAGE STUDY N_COMPLETE [HOOK COUNT]
HOOK is one of sample, objective, storage_write, storage_commit: the process kills itself the
COUNT-th time it reaches that point (inside sampling, inside the objective's "real run", just
before a trial-state write reaches storage, just after it was committed).
"""

import math
import os
import signal
import sys

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from autoscout_optuna import AutoScoutSampler
from autoscout_optuna._recovery import recover_orphaned_trials

storage_url, study_name, n_complete = sys.argv[1], sys.argv[2], int(sys.argv[3])
hook, count = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else (None, 0)
hits = {"sample": 0, "objective": 0, "storage_write": 0, "storage_commit": 0}


def reach(point):
    hits[point] += 1
    if point == hook and hits[point] == count:
        os.kill(os.getpid(), signal.SIGKILL)


class KillingSampler(AutoScoutSampler):
    def sample_independent(self, study, trial, name, dist):
        reach("sample")
        return super().sample_independent(study, trial, name, dist)


def objective(trial):
    layout = trial.suggest_categorical("layout", ["a", "b", "c"])
    x = trial.suggest_float("x", -2.0, 2.0)
    if layout == "b":
        k = trial.suggest_int("k", 1, 8)
        value = (x - 0.5) ** 2 + 0.1 * k
    else:
        value = (x + 0.25) ** 2 + (0.3 if layout == "a" else 0.6)
    reach("objective")
    return math.log1p(value)


optuna.logging.set_verbosity(optuna.logging.ERROR)
storage = optuna.storages.RDBStorage(storage_url)
write = storage.set_trial_state_values


def watched_write(trial_id, state, values=None):
    if state.is_finished():
        reach("storage_write")
    done = write(trial_id, state, values)
    if state.is_finished():
        reach("storage_commit")
    return done


storage.set_trial_state_values = watched_write
study = optuna.create_study(storage=storage, study_name=study_name, load_if_exists=True,
                            sampler=KillingSampler(seed=0))
recover_orphaned_trials(study, retry=True)
study.optimize(objective, callbacks=[MaxTrialsCallback(n_complete, states=(TrialState.COMPLETE,))])
