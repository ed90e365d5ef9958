"""One of N worker processes sharing a study on PostgreSQL (used by test_many_workers.py).

usage: _pg_worker.py URL STUDY SAMPLER N_TRIALS_TOTAL WORKER_INDEX
"""

import sys

import optuna
from optuna.study import MaxTrialsCallback

from autoscout_optuna import AutoScoutSampler, FidelityPruner, Infeasible, studies
from autoscout_optuna.fidelity import from_definition

url, name, sampler_name, total, index = sys.argv[1:6]
optuna.logging.set_verbosity(optuna.logging.ERROR)
definition = studies.load("llm_training")
samplers = {
    "autoscout": lambda: AutoScoutSampler(seed=int(index)),
    "tpe": lambda: optuna.samplers.TPESampler(seed=int(index)),
}
study = optuna.load_study(study_name=name, storage=url, sampler=samplers[sampler_name](),
                          pruner=FidelityPruner())
study.optimize(from_definition(definition, noise_seed=0), catch=(Infeasible,),
               callbacks=[MaxTrialsCallback(int(total), states=None)])
