"""Experiment runner: contenders x studies x seeds, Pool(2) fork, per-trial detail kept.

usage: python exp/run_exp.py VARIANT STUDY SIGMA SEEDS...   (SIGMA 'alone' for the sampler alone)
Writes /tmp/fid_out/<variant>/<study>_<sigma>_<seed>.pkl
"""
from __future__ import annotations

import functools
import math
import multiprocessing as mp
import os
import pickle
import sys
import time
import warnings

import optuna

sys.path.insert(0, "/tmp/fid")
from autoscout_optuna import studies, _keys  # noqa: E402
from autoscout_optuna.benchmark import _harness  # noqa: E402
from autoscout_optuna.benchmark.suites import fidelity as fsuite  # noqa: E402

OUT = "/tmp/fid_out"
import exp.variants as variants  # noqa: E402


def make_contender(variant: str, sigma: str):
    if sigma == "alone":
        return fsuite.contenders()[0]
    s = float(sigma)
    v = variants.VARIANTS[variant]
    return _harness.Contender(
        f"{variant}:{sigma}",
        v.get("make_sampler", fsuite.make_sampler),
        make_pruner=v.get("make_pruner", fsuite.make_pruner),
        make_objective=functools.partial(debug_objective, s, v.get("ensemble")),
    )


def debug_objective(sigma, ensemble, definition, seed):
    from autoscout_optuna.fidelity import from_definition

    def simulate(trial, config):
        true = definition.measure(config, None)
        trial.set_user_attr("dbg_true", float(true))
        return fsuite.noisy_reference(definition, sigma, seed, trial, config)

    return fsuite.stop_after_real_runs(
        from_definition(definition, noise_seed=seed, simulate=simulate,
                        ensemble_options=ensemble), fsuite.REAL_RUN_BUDGET)


def run(args):
    variant, study, sigma, seed = args
    path = f"{OUT}/{variant if sigma != 'alone' else 'alone'}/{study}_{sigma}_{seed}.pkl"
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    definition = studies.load(study)
    contender = make_contender(variant, sigma)
    job = _harness._Job("fidelity", study, definition, contender, seed, fsuite.MAX_TRIALS)
    t0 = time.time()
    # like run_job, but keep trial details
    sampler = _harness.TimedSampler(contender.make_sampler(seed))
    pruner = contender.make_pruner(seed) if contender.make_pruner is not None else None
    objective = contender.make_objective(definition, seed)
    objective = _harness._recording_failures(objective)
    st = optuna.create_study(direction=definition.direction, sampler=sampler, pruner=pruner)
    st.optimize(objective, n_trials=job.n_trials, catch=(Exception,))
    trials = st.get_trials(deepcopy=False)
    rows = _harness._rows(job, trials, sampler.seconds_by_trial)
    detail = [dict(number=t.number, state=t.state.name, params=dict(t.params),
                   user_attrs=dict(t.user_attrs), system_attrs={k: v for k, v in t.system_attrs.items() if k == _keys.STRUCTURE},
                   inter=dict(t.intermediate_values), value=t.value) for t in trials]
    with open(path + ".tmp", "wb") as f:
        pickle.dump(dict(rows=rows, detail=detail, seconds=time.time() - t0), f)
    os.replace(path + ".tmp", path)
    print(f"done {path} {time.time()-t0:.0f}s", flush=True)
    return path


if __name__ == "__main__":
    variant, study, sigma = sys.argv[1:4]
    seeds = [int(s) for s in sys.argv[4:]]
    jobs = [(variant, study, sigma, s) for s in seeds]
    with mp.get_context("fork").Pool(2) as pool:
        list(pool.imap_unordered(run, jobs))
