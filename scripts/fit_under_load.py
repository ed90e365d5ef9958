"""Time MCTS's feasibility fit while other processes keep every core busy.

    OPENBLAS_NUM_THREADS=1 python scripts/fit_under_load.py
    python scripts/fit_under_load.py            # numpy's default BLAS threads (one per core)

The fit (``_mcts/feasibility._logistic``) runs once per MCTS plan once a trial has failed. It
is timed next to the textbook dense Newton iteration it replaced (one-hot design matrix, BLAS
matrix products), on a random table of the same shape as a long study's (rows of structural
codes, a few failures), first on an idle machine, then with ``--busy`` processes spinning. A
dense fit whose BLAS threads wait for busy cores is what a sampler shared with parallel
workers, or with the job being tuned, would pay on every plan.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time

import numpy as np

from autoscout_optuna.samplers._mcts.feasibility import L2, NEWTON_STEPS, _logistic, one_hot


def _dense_fit(codes: np.ndarray, offsets: np.ndarray, y: np.ndarray) -> float:
    design = np.hstack([np.ones((len(codes), 1)), one_hot(codes, offsets)])
    penalty = np.full(design.shape[1], L2)
    penalty[0] = 1e-6
    beta = np.zeros(design.shape[1])
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ beta, -30.0, 30.0)))
        gradient = design.T @ (p - y) + penalty * beta
        hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.max(np.abs(step)) < 1e-6:
            break
    return float(beta[0])


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _ms_per_call(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1000.0 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=700)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    # SIGTERM unwinds through the finally below: Python's default ends this process alone,
    # and the spinners, never told to stop, ran on at 100 % of a core each
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rng = np.random.default_rng(0)
    n_values = [3, 5, 8, 3, 16, 6, 3, 2, 3]  # the 15-knob overhead space's structural params
    offsets = np.concatenate([[0], np.cumsum(n_values)]).astype(int)
    codes = np.stack([rng.integers(0, n, size=args.rows) for n in n_values], axis=1)
    y = np.zeros(args.rows)
    y[rng.choice(args.rows, size=3, replace=False)] = 1.0
    fits = {
        "index fit (ours)": lambda: _logistic(codes, offsets, y),
        "dense BLAS fit": lambda: _dense_fit(codes, offsets, y),
    }
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    for label, busy in (("idle", 0), (f"{args.busy} busy processes", args.busy)):
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
                    for _ in range(busy)]
        for process in spinners:
            process.start()
        try:
            for name, fn in fits.items():
                ms = _ms_per_call(fn, args.repeats)
                print(f"OPENBLAS_NUM_THREADS={threads} {label:>18}: {name:<16} {ms:8.1f} ms/fit")
        finally:
            stop.set()
            for process in spinners:
                process.join()


if __name__ == "__main__":
    main()
