from __future__ import annotations
import glob, pickle, sys, collections
import numpy as np
import pandas as pd
sys.path.insert(0, "/tmp/fid")
from autoscout_optuna.benchmark.suites._fidelity_report import run_stats

def load(variant, study, sigma, seeds):
    out = {}
    for s in seeds:
        p = f"/tmp/fid_out/{variant}/{study}_{sigma}_{s}.pkl"
        try:
            out[s] = pickle.load(open(p, "rb"))
        except FileNotFoundError:
            pass
    return out

def stats(variant, study, sigma, seeds):
    d = load(variant, study, sigma, seeds)
    if not d:
        return None
    rows = [r for v in d.values() for r in v["rows"]]
    st = run_stats(pd.DataFrame(rows))
    return st

def summary(variant, study, sigma, seeds):
    st = stats(variant, study, sigma, seeds)
    if st is None:
        return f"{variant:>14} {study} {sigma}: none"
    n = len(st)
    r99 = st.real_runs_to_99.to_numpy(); r95 = st.real_runs_to_95.to_numpy()
    per = " ".join(f"{int(x)}{'' if ok else '*'}" for x, ok in zip(r99, st.reached_99))
    return (f"{variant:>14} {study:>12} {sigma:>5}: 99% {st.reached_99.sum()}/{n} med {np.median(r99):6.1f} | "
            f"95% {st.reached_95.sum()}/{n} med {np.median(r95):6.1f} | real {np.median(st.real_runs_total):5.1f} "
            f"final {np.median(st.final_best_ratio):.3f} | per-seed99 {per}")

if __name__ == "__main__":
    study, sigma = sys.argv[1], sys.argv[2]
    seeds = range(int(sys.argv[3]), int(sys.argv[4]) + 1)
    for v in sys.argv[5:]:
        print(summary(v, study, sigma, seeds))
