"""The committed benchmark rows are what the code in this repository produces.

Every sampler draw is keyed by (seed, trial number, purpose), so a suite's run is reproducible
trial for trial. A change that moves any decision of AutoScoutSampler or FidelityPruner must
re-run the rows it moves (``scripts/rerun_autoscout_rows.sh``); a refactor said to change
nothing must change nothing. Session 57 found 16 of the ``autoscout`` suite's 1,440 AutoScout
runs (and a whole ablation of ``autoscout-long``) no longer reproduced by the code, from
changes each checked on a few seeds only; session 58 found the ``coordinate`` suite's rows (31
of its first 126 runs) and two of ``autoscout``'s MCTSSampler-alone runs drifted the same way,
rows no re-run script covered. These runs replay a few committed seeds of each searcher, the
seeds that had drifted among them.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoscout_optuna.benchmark import _report, run_suite
from autoscout_optuna.benchmark.suites import autoscout, coordinate, fidelity, mcts

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _replay(suite, contenders, first_seed, n_seeds, folder):
    chosen = [c for c in suite.contenders if c.name in contenders]
    assert [c.name for c in chosen] == list(contenders)
    rerun = dataclasses.replace(suite, contenders=chosen, first_seed=first_seed, n_seeds=n_seeds,
                                plot_groups=())
    # through the CSV writer, as the committed rows went: values to six significant digits
    fresh = pd.read_csv(io.StringIO(run_suite(rerun, None, n_workers=2).to_csv(
        index=False, float_format=_report.CSV_FLOAT_FORMAT)))
    stored = pd.read_csv(RESULTS / folder / "trials.csv", low_memory=False)
    key = ["study", "contender", "seed", "trial"]
    merged = fresh.merge(stored, on=key, how="left", suffixes=("", "_stored"))
    assert len(merged) == len(fresh) and merged["state_stored"].notna().all(), \
        "a replayed trial has no committed row"
    same_value = (merged["value"] == merged["value_stored"]) | (
        merged["value"].isna() & merged["value_stored"].isna())
    drifted = merged[(merged["state"] != merged["state_stored"]) | ~same_value]
    first = drifted.groupby(["study", "contender", "seed"])["trial"].min()
    assert drifted.empty, (
        f"committed rows in {folder}/ no longer reproduce (first differing trial per run):\n"
        f"{first.to_string()}\nre-run the suites the change moves "
        "(scripts/rerun_autoscout_rows.sh), or find what moved the decisions")
    return fresh


def _suite(module, name):
    return next(s for s in module.suites() if s.name == name)


@pytest.mark.slow
def test_the_autoscout_suite_rows_replay_trial_for_trial():
    fresh = _replay(_suite(autoscout, "autoscout"), ["autoscout", "variant: memory estimate"],
                    first_seed=2, n_seeds=1, folder="autoscout")
    assert np.isfinite(fresh["value"]).sum() > 100  # the studies ran, not just failed


@pytest.mark.slow
def test_the_fidelity_suite_rows_replay_trial_for_trial():
    _replay(_suite(fidelity, "fidelity"), ["autoscout+sim noise 20%"], first_seed=0,
            n_seeds=1, folder="fidelity")


@pytest.mark.slow
def test_the_searches_alone_replay_trial_for_trial():
    # CoordinateDescentSampler and MCTSSampler on their own: rows no AutoScout re-run rewrites
    _replay(_suite(coordinate, "coordinate"), ["cd-cyclic", "cd-random", "cd-sensitivity"],
            first_seed=1, n_seeds=1, folder="coordinate")
    _replay(_suite(mcts, "mcts"), ["mcts"], first_seed=0, n_seeds=1, folder="mcts")
    _replay(_suite(autoscout, "autoscout"), ["variant: MCTSSampler alone"], first_seed=3,
            n_seeds=1, folder="autoscout")
