"""The benchmark harness on a toy 2-knob study with a known optimum."""

from __future__ import annotations

import dataclasses
import functools
import math
import multiprocessing
import os
import pickle
import sys

import numpy as np
import optuna
import pandas as pd
import pytest

from autoscout_optuna import Infeasible
from autoscout_optuna._space import is_structural
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.benchmark import Contender, Suite, TimedSampler, _report, main, run_suite
from autoscout_optuna.benchmark._harness import COLUMNS

# Toy study: mode "fast" peaks at 10.0 (x = 0.3), mode "slow" at 8.0; x > 0.9 runs out of memory.
OPTIMUM = 10.0


def toy_suggest(trial):
    return {"mode": trial.suggest_categorical("mode", ["fast", "slow"]),
            "x": trial.suggest_float("x", 0.0, 1.0)}


def toy_measure(config, rng):
    if config["x"] > 0.9:
        raise Infeasible("oom", f"x={config['x']:.2f}")
    peak = OPTIMUM if config["mode"] == "fast" else 8.0
    value = peak * (1.0 - (config["x"] - 0.3) ** 2)
    return value if rng is None else value * (1.0 + 0.02 * rng.normal())


def toy_time_measure(config, rng):
    """The same study as a time to minimize: optimum 1/OPTIMUM."""
    return 1.0 / toy_measure(config, rng)


def toy_definition(direction="maximize"):
    measure = toy_measure if direction == "maximize" else toy_time_measure
    optimum = OPTIMUM if direction == "maximize" else 1.0 / OPTIMUM
    return StudyDefinition(name="toy", direction=direction, metric="units", suggest=toy_suggest,
                           measure=measure, optimum=optimum, options={"direction": direction})


def make_random(seed):
    return optuna.samplers.RandomSampler(seed=seed)


def make_tpe(seed):
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


def make_always_oom(seed):
    return optuna.samplers.PartialFixedSampler({"x": 0.95}, make_random(seed))


def toy_suite(*, n_trials=12, n_seeds=2, contenders=None, definitions=None):
    return Suite(
        name="toy_suite",
        definitions=definitions or [toy_definition()],
        contenders=contenders or [Contender("random", make_random), Contender("tpe", make_tpe)],
        n_trials=n_trials, n_seeds=n_seeds, budgets=(5, 10), description="toy",
    )


@pytest.fixture(scope="module")
def both_directions():
    suite = toy_suite(definitions=[toy_definition("maximize"), toy_definition("minimize")])
    return run_suite(suite, None, n_workers=1)


def test_one_row_per_trial(both_directions):
    frame = both_directions
    assert len(frame) == 2 * 2 * 2 * 12  # studies x contenders x seeds x trials
    assert frame["study"].nunique() == 2  # two presets of one study get distinct labels
    for _, run in frame.groupby(["study", "contender", "seed"]):
        assert run["trial"].tolist() == list(range(12))
    complete = frame[frame["state"] == "COMPLETE"]
    assert complete["is_real_run"].all() and not complete["is_low_fidelity"].any()
    # Benchmarks score the noiseless value, not the noisy measurement.
    assert (complete["true_value"] != complete["value"]).any()
    assert (frame["sampler_ms"] >= 0).all() and (frame["sampler_ms"] > 0).any()


def test_best_so_far_is_the_running_best_of_complete_true_values(both_directions):
    for _, run in both_directions.groupby(["study", "contender", "seed"]):
        maximize = run["direction"].iloc[0] == "maximize"
        true = run["true_value"].where(run["state"] == "COMPLETE")
        expected = (true.cummax() if maximize else true.cummin()).ffill()
        np.testing.assert_allclose(run["best_true_so_far"], expected)
        best = run["best_true_so_far"].dropna()
        steps = np.diff(best.to_numpy())
        assert (steps >= 0).all() if maximize else (steps <= 0).all()


def _hand_built(direction, values, states, seed):
    optimum = 10.0 if direction == "maximize" else 0.1
    rows = []
    best = math.nan
    for number, (value, state) in enumerate(zip(values, states, strict=True)):
        if state == "COMPLETE":
            better = max if direction == "maximize" else min
            best = value if math.isnan(best) else better(best, value)
        rows.append({"suite": "s", "study": direction, "definition": "t", "direction": direction,
                     "optimum": optimum, "contender": "c", "seed": seed, "trial": number,
                     "state": state, "value": value, "true_value": value,
                     "best_true_so_far": best, "is_real_run": state == "COMPLETE",
                     "is_low_fidelity": state == "PRUNED", "failure_reason": "",
                     "sampler_ms": 1.0})
    return rows


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_trials_to_99_on_a_hand_built_frame(direction):
    scale = (lambda r: 10.0 * r) if direction == "maximize" else (lambda r: 0.1 / r)
    # seed 0: ratios 0.5, fail, pruned (0.999 low-fidelity: does not count), 0.96, 0.995 -> 5
    seed0 = _hand_built(
        direction,
        [scale(0.5), math.nan, scale(0.999), scale(0.96), scale(0.995), scale(0.7)],
        ["COMPLETE", "FAIL", "PRUNED", "COMPLETE", "COMPLETE", "COMPLETE"], seed=0)
    # seed 1 never reaches 99% (nor 95%)
    seed1 = _hand_built(direction, [scale(0.9)] * 6, ["COMPLETE"] * 6, seed=1)
    frame = pd.DataFrame(seed0 + seed1)
    to99 = _report.trials_to_reach(frame, 0.99, n_trials=6)
    assert to99.tolist() == [5, 7]
    summary = _report.summarize(frame, budgets=(2, 5), n_trials=6).iloc[0]
    assert summary["trials_to_99_median"] == 6.0  # median of 5 and 7 (= n_trials + 1)
    assert summary["reached_99"] == 1 and summary["reached_95"] == 1
    assert summary["trials_to_95_median"] == (4 + 7) / 2
    assert summary["real_runs_to_99_median"] == (3 + 7) / 2  # 3 COMPLETE in seed 0's first 5
    assert summary["best@5_median"] == pytest.approx((0.995 + 0.9) / 2)
    assert summary["fail_per_seed"] == 0.5
    assert summary["optimum_source"] == "definition"
    assert math.isnan(summary["optimum_beaten_by"])


def test_unknown_optimum_falls_back_to_best_seen():
    frame = pd.DataFrame(_hand_built("maximize", [4.0, 8.0], ["COMPLETE"] * 2, seed=0))
    frame["optimum"] = math.nan
    summary = _report.summarize(frame, budgets=(1, 2), n_trials=2).iloc[0]
    assert summary["optimum"] == 8.0 and summary["optimum_source"] == "best seen"
    assert summary["best@1_median"] == 0.5 and summary["best@2_median"] == 1.0
    assert "best value seen" in _report.markdown(pd.DataFrame([summary]), (1, 2), 2)


def toy_suggest_rejecting_layouts(trial):
    """Like a study that rejects an invalid layout while suggesting, before any measurement."""
    config = toy_suggest(trial)
    if config["x"] > 0.9:
        raise Infeasible("invalid_layout")
    return config


@pytest.mark.parametrize("where", ["measure", "suggest"])
def test_infeasible_config_counts_as_fail(where):
    definition = toy_definition()
    if where == "suggest":
        definition = dataclasses.replace(definition, suggest=toy_suggest_rejecting_layouts)
    suite = toy_suite(n_trials=25, n_seeds=1, contenders=[Contender("oom", make_always_oom)],
                      definitions=[definition])
    frame = run_suite(suite, None, n_workers=1)
    assert (frame["state"] == "FAIL").all()
    reason = "oom" if where == "measure" else "invalid_layout"
    assert (frame["failure_reason"] == reason).all()
    assert frame["best_true_so_far"].isna().all()
    summary = _report.summarize(frame, suite.budgets, suite.n_trials).iloc[0]
    assert summary["fail_per_seed"] == 25 and summary["fail_after_20_per_seed"] == 5
    assert summary["best@10_median"] == 0.0 and summary["reached_95"] == 0


class CountingSampler(optuna.samplers.RandomSampler):
    def __init__(self, seed):
        super().__init__(seed=seed)
        self.reseeds = 0
        self.label = "inner"

    def reseed_rng(self):
        self.reseeds += 1
        super().reseed_rng()


def test_timing_proxy_forwards_and_records_time():
    inner = CountingSampler(seed=0)
    timed = TimedSampler(inner)
    timed.reseed_rng()
    assert inner.reseeds == 1
    assert timed.label == "inner" and timed._rng is inner._rng
    study = optuna.create_study(sampler=timed, direction="maximize")
    study.optimize(lambda t: toy_measure(toy_suggest(t), None), n_trials=5, catch=(Infeasible,))
    assert sorted(timed.seconds_by_trial) == [0, 1, 2, 3, 4]
    assert all(seconds > 0 for seconds in timed.seconds_by_trial.values())
    clone = pickle.loads(pickle.dumps(timed))
    assert clone.label == "inner" and dict(clone.seconds_by_trial) == dict(timed.seconds_by_trial)


def test_worker_processes_reproduce_the_sequential_run():
    suite = toy_suite(n_trials=8, n_seeds=2)
    sequential = run_suite(suite, None, n_workers=1)
    parallel = run_suite(suite, None, n_workers=2)
    columns = ["study", "contender", "seed", "trial", "state", "value", "true_value"]
    pd.testing.assert_frame_equal(sequential[columns], parallel[columns])


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_unpicklable_factories_run_in_forked_workers():
    suite = toy_suite(n_trials=4, n_seeds=2,
                      contenders=[Contender("lambda", lambda seed: make_random(seed))])
    frame = run_suite(suite, None, n_workers=2)
    assert len(frame) == 2 * 4 and set(frame["seed"]) == {0, 1}


def _blas_threads(pools: list[dict]) -> list[int]:
    return [pool["num_threads"] for pool in pools if pool["user_api"] == "blas"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: nothing to limit")
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_blas_runs_on_its_share_of_the_cores(method, monkeypatch):
    # numpy (and its BLAS) is loaded before the initializer runs: a forked worker inherits
    # it, a spawned one imports it to unpickle the initializer, so the thread-count variables
    # the initializer sets come too late for it on their own.
    import importlib
    from concurrent.futures import ProcessPoolExecutor

    import threadpoolctl

    from autoscout_optuna.benchmark import _harness

    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method")
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(1, mp_context=context, initializer=importlib.import_module,
                             initargs=("numpy",)) as pool:
        unlimited = _blas_threads(pool.submit(threadpoolctl.threadpool_info).result())
    with ProcessPoolExecutor(1, mp_context=context, initializer=_harness._limit_threads,
                             initargs=(1,)) as pool:
        limited = _blas_threads(pool.submit(threadpoolctl.threadpool_info).result())
    assert unlimited and max(unlimited) > 1  # else this test could not tell
    assert limited == [1] * len(unlimited)


def test_unpicklable_factories_are_refused_without_fork(monkeypatch):
    from autoscout_optuna.benchmark import _harness

    monkeypatch.setattr(_harness.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    suite = toy_suite(contenders=[Contender("lambda", lambda seed: make_random(seed))])
    with pytest.raises(TypeError, match="contender 'lambda'"):
        run_suite(suite, None, n_workers=2)


def test_cli_quick_writes_csv_png_and_logs_the_command(tmp_path, monkeypatch):
    from autoscout_optuna.benchmark import suites as registry

    asked = []

    def find(names, *, quick=False):
        asked.append((tuple(names), quick))
        return [toy_suite(n_trials=30 if not quick else 6)]

    monkeypatch.setattr(registry, "find", find)
    argv = ["--suite", "toy_suite", "--quick", "--seeds", "1", "--workers", "1",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    assert asked == [(("toy_suite",), True)]
    folder = tmp_path / "toy_suite"
    for name in ("trials.csv", "summary.csv", "summary.md", "best_so_far.png"):
        assert (folder / name).stat().st_size > 0
    trials = pd.read_csv(folder / "trials.csv")
    assert len(trials) == 2 * 1 * 6  # contenders x seeds x quick trials
    assert (folder / "best_so_far.png").read_bytes()[:4] == b"\x89PNG"
    assert "| toy[direction=maximize] | random | 1 |" in (folder / "summary.md").read_text()
    log = (tmp_path / "README.md").read_text()
    assert "--suite toy_suite --quick --seeds 1" in log


def test_cli_rejects_unknown_suite(capsys):
    assert main(["--suite", "no_such_suite", "--out", "/nonexistent"]) == 2
    assert "unknown suite" in capsys.readouterr().err


def test_importing_the_harness_does_not_import_torch():
    # Other tests may have imported torch already: check in a fresh interpreter.
    import subprocess

    code = "import sys, autoscout_optuna.benchmark; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_suite_validates_its_arguments():
    with pytest.raises(ValueError, match="n_trials"):
        toy_suite(n_trials=0)
    with pytest.raises(ValueError, match="distinct names"):
        toy_suite(contenders=[Contender("a", make_random), Contender("a", make_tpe)])
    labelled = functools.partial(toy_suite, definitions=[toy_definition(), toy_definition()])
    assert labelled().study_labels() == ["toy[direction=maximize]", "toy[direction=maximize]#2"]


def test_a_contender_can_start_from_the_studys_default_config():
    expert = {"mode": "slow", "x": 0.55}
    definition = dataclasses.replace(toy_definition(), default_config=expert)
    starts = Contender("tpe from the expert config", make_tpe, start_from_default=True)
    suite = toy_suite(definitions=[definition], contenders=[Contender("tpe", make_tpe), starts])
    frame = run_suite(suite, None, n_workers=1)
    first = frame[frame["trial"] == 0].set_index(["contender", "seed"])
    expected = toy_measure(expert, None)
    np.testing.assert_allclose(first.loc["tpe from the expert config", "true_value"], expected)
    assert not np.isclose(first.loc["tpe", "true_value"], expected).any()
    # The expert's trial is one of the budget's, not an extra one.
    assert frame.groupby(["contender", "seed"]).size().eq(12).all()


def make_tpe_seeing(seed, definition):
    assert isinstance(definition, StudyDefinition)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


def test_a_contender_can_build_its_sampler_from_the_study():
    reads = Contender("tpe reading the study", make_tpe_seeing, sampler_reads_study=True)
    plain = Contender("tpe", make_tpe)
    frame = run_suite(toy_suite(n_trials=8, n_seeds=1, contenders=[plain, reads]), None,
                      n_workers=1)
    by = {name: rows["value"].fillna(-1.0).tolist() for name, rows in frame.groupby("contender")}
    assert by["tpe reading the study"] == by["tpe"]  # the same sampler, built another way
    with pytest.raises(TypeError, match="sampler_reads_study"):
        Contender("tpe", make_tpe, sampler_reads_study="yes")


def test_starting_from_the_default_config_needs_a_study_that_has_one():
    starts = Contender("tpe from the expert config", make_tpe, start_from_default=True)
    with pytest.raises(ValueError, match=r"starts from the default config.*\['toy'\]"):
        toy_suite(contenders=[starts])
    with pytest.raises(TypeError, match="start_from_default must be a bool"):
        Contender("tpe", make_tpe, start_from_default="yes")


def test_rerunning_one_contender_merges_into_the_stored_results(tmp_path):
    from autoscout_optuna import benchmark

    argv = ["--suite", "baselines", "--quick", "--workers", "1", "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    before = pd.read_csv(tmp_path / "baselines" / "trials.csv")
    assert benchmark.main(argv + ["--contender", "random"]) == 0
    after = pd.read_csv(tmp_path / "baselines" / "trials.csv")
    # Seeded runs: re-running one contender reproduces its rows; the others are kept as stored.
    pd.testing.assert_frame_equal(
        before.drop(columns="sampler_ms"), after.drop(columns="sampler_ms"))
    assert benchmark.main(argv + ["--contender", "nobody"]) == 2


def test_a_name_one_of_the_suites_lacks_is_refused_before_any_suite_runs(
    tmp_path, monkeypatch, capsys
):
    from autoscout_optuna.benchmark import suites as registry

    first = toy_suite(n_trials=3, n_seeds=1)
    second = dataclasses.replace(first, name="other",
                                 contenders=[Contender("random", make_random)])
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [first, second])
    argv = ["--suite", "toy_suite", "other", "--workers", "1", "--out", str(tmp_path)]
    assert main(argv + ["--contender", "tpe"]) == 2
    assert "suite other has no contender named tpe" in capsys.readouterr().err
    assert not (tmp_path / "toy_suite").exists()  # the first suite was not run either
    assert main(argv + ["--study", "maximize", "--contender", "random"]) == 0


def test_a_merge_keeps_the_stored_rows_of_a_contender_the_suite_no_longer_has(
    tmp_path, monkeypatch, capsys
):
    from autoscout_optuna.benchmark import suites as registry

    old = toy_suite(n_trials=3, n_seeds=1, contenders=[
        Contender("random", make_random), Contender("dropped", make_random),
        Contender("tpe", make_tpe)])
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [old])
    argv = ["--suite", "toy_suite", "--workers", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    stored = pd.read_csv(tmp_path / "toy_suite" / "trials.csv")
    # the suite drops a contender; re-running another one merged into the stored results (it
    # raised "'dropped' is not in list" once the run was done, and the run was lost)
    new = dataclasses.replace(old, contenders=[old.contenders[0], old.contenders[2]])
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [new])
    assert main(argv + ["--contender", "tpe"]) == 0
    assert "kept the stored rows of contender 'dropped'" in capsys.readouterr().err
    merged = pd.read_csv(tmp_path / "toy_suite" / "trials.csv")
    assert list(dict.fromkeys(merged["contender"])) == ["random", "tpe", "dropped"]
    pd.testing.assert_frame_equal(
        merged.drop(columns="sampler_ms").sort_values(["contender", "trial"], ignore_index=True),
        stored.drop(columns="sampler_ms").sort_values(["contender", "trial"], ignore_index=True))


def test_a_suite_name_selects_that_suite_and_a_module_name_all_of_its_suites():
    from autoscout_optuna.benchmark import suites as registry

    # `autoscout` is both a module and one of its suites: the name means the suite alone, so
    # re-running it does not also start the 5,000-trial overhead suite of the same module
    assert [s.name for s in registry.find(["autoscout"], quick=True)] == ["autoscout"]
    assert [s.name for s in registry.find(["autoscout-overhead"], quick=True)] == [
        "autoscout-overhead"]
    module_only = [m for m in registry.module_names()
                   if len(registry.module_suites(m, quick=True)) > 1
                   and m not in {s.name for s in registry.module_suites(m, quick=True)}]
    for module in module_only:
        assert len(registry.find([module], quick=True)) > 1


@pytest.mark.parametrize("quick", [False, True])
def test_a_suites_extra_report_runs_after_its_summary_except_in_quick_runs(
        tmp_path, monkeypatch, quick):
    from autoscout_optuna.benchmark import suites as registry

    seen = []

    def extra_report(directory):  # the summary must already be there to build on
        seen.append((directory, (directory / "summary.csv").exists()))

    suite = dataclasses.replace(toy_suite(n_trials=4, n_seeds=1), extra_report=extra_report)
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [suite])
    argv = ["--suite", "toy_suite", "--workers", "1", "--out", str(tmp_path)]
    assert main(argv + (["--quick"] if quick else [])) == 0
    assert seen == ([] if quick else [(tmp_path / "toy_suite", True)])


@pytest.fixture
def saved_figures(monkeypatch):
    """Figures the plot saves, drawn (so legends have their final place)."""
    import matplotlib.figure

    saved = []
    real_savefig = matplotlib.figure.Figure.savefig

    def capture(fig, *args, **kwargs):
        fig.canvas.draw()
        saved.append(fig)
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", capture)
    return saved


def test_plot_tells_every_contender_apart_and_keeps_the_legend_inside(tmp_path, saved_figures):
    rows = []
    for k in range(12):  # more contenders than the ten colours
        values = [0.5 + 0.1 * k, 1.0 + 0.1 * k]  # below the optimum (10): no stale warning
        for row in _hand_built("maximize", values, ["COMPLETE"] * 2, seed=0):
            rows.append({**row, "contender": f"contender number {k} with a long name"})
    _report.plot_best_so_far(pd.DataFrame(rows), 2, tmp_path / "p.png", title="t")
    (fig,) = saved_figures
    lines = fig.axes[0].get_lines()
    looks = {(line.get_color(), line.get_linestyle()) for line in lines
             if not line.get_label().startswith("_")}
    assert len(looks) == 12
    legend = fig.legends[0].get_window_extent()
    width = fig.get_window_extent().width
    assert legend.x0 >= 0 and legend.x1 <= width


def test_plot_draws_a_row_per_group_and_one_for_the_contenders_no_group_names(tmp_path,
                                                                             saved_figures):
    rows = []
    for k, name in enumerate("abcd"):
        values = [0.5 + 0.1 * k, 1.0 + 0.1 * k]  # below the optimum (10): no stale warning
        for row in _hand_built("maximize", values, ["COMPLETE"] * 2, seed=0):
            rows.append({**row, "contender": name})
    groups = [("first", ["a", "b"]), ("second", ["c", "a"]), ("not run", ["zz"])]
    _report.plot_best_so_far(pd.DataFrame(rows), 2, tmp_path / "p.png", title="t",
                             groups=groups)
    (fig,) = saved_figures
    drawn = [[line.get_label().split(" (")[0] for line in ax.get_lines()
              if not line.get_label().startswith("_")] for ax in fig.axes]
    assert drawn == [["a", "b"], ["c", "a"], ["d"]]  # a group with nothing run has no row
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes] == [
        "first", "second", "other contenders"]
    width = fig.get_window_extent().width
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= 0 and legend.x1 <= width


def test_restricting_a_run_to_some_contenders_keeps_their_plot_groups(tmp_path, monkeypatch):
    from autoscout_optuna import benchmark
    from autoscout_optuna.benchmark import suites as registry

    suite = dataclasses.replace(
        toy_suite(n_trials=3, n_seeds=1),
        plot_groups=[("first", ["random", "tpe"]), ("second", ["tpe"])],
    )
    assert [c.name for c in suite.contenders][:2] == ["random", "tpe"]
    assert benchmark._only(suite, ["random"]).plot_groups == [("first", ["random"])]
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [suite])
    argv = ["--suite", "toy_suite", "--contender", "random", "--workers", "1",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    assert (tmp_path / "toy_suite" / "best_so_far.png").is_file()


def test_a_run_beating_the_stored_optimum_is_flagged_not_hidden():
    rows = _hand_built("maximize", [5.0, 10.5], ["COMPLETE"] * 2, seed=0)  # optimum 10.0
    with pytest.warns(UserWarning, match="'maximize'.*1.0500x its stored optimum 10.*stale"):
        summary = _report.summarize(pd.DataFrame(rows), [1, 2], 2)
    assert summary.loc[0, "best@2_median"] == pytest.approx(1.05)  # kept, not clipped to 1
    assert summary.loc[0, "optimum_source"] == "definition, beaten by a run (1.0500x)"
    assert summary.loc[0, "optimum_beaten_by"] == pytest.approx(1.05)
    assert "**beaten by a run** (1.0500x)" in _report.markdown(summary, [1, 2], 2)
    # reaching it exactly is no warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _report.summarize(pd.DataFrame(_hand_built("minimize", [0.2, 0.1], ["COMPLETE"] * 2,
                                                   seed=0)), [1, 2], 2)


def test_rescore_rescores_stored_trials_against_a_raised_optimum(tmp_path, monkeypatch):
    from autoscout_optuna.benchmark import suites as registry

    suite = toy_suite(n_trials=6, n_seeds=1)
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [suite])
    assert main(["--suite", "toy_suite", "--workers", "1", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "toy_suite"
    before = pd.read_csv(folder / "trials.csv")
    old_summary = pd.read_csv(folder / "summary.csv")
    # a better search raised the study's optimum by a quarter
    raised = dataclasses.replace(toy_definition(), optimum=1.25 * OPTIMUM)
    reported = []
    suite = dataclasses.replace(suite, definitions=[raised], rescore_report=reported.append)
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [suite])
    assert main(["--suite", "toy_suite", "--rescore", "--out", str(tmp_path)]) == 0
    after = pd.read_csv(folder / "trials.csv")
    assert (after["optimum"] == 1.25 * OPTIMUM).all()
    columns = [c for c in before.columns if c != "optimum"]
    pd.testing.assert_frame_equal(before[columns], after[columns])  # nothing re-run
    new_summary = pd.read_csv(folder / "summary.csv")
    assert new_summary["best@5_median"].to_numpy() == pytest.approx(
        old_summary["best@5_median"].to_numpy() / 1.25)
    assert reported == [folder]
    assert "--rescore" in (tmp_path / "README.md").read_text()


def test_rescore_refuses_run_options_and_missing_results(tmp_path, monkeypatch, capsys):
    from autoscout_optuna.benchmark import suites as registry

    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [toy_suite()])
    argv = ["--suite", "toy_suite", "--rescore", "--out", str(tmp_path)]
    assert main(argv + ["--seeds", "3", "--contender", "tpe"]) == 2
    assert "takes no --seeds, --contender" in capsys.readouterr().err
    assert main(argv) == 2
    assert "missing: " + str(tmp_path / "toy_suite" / "trials.csv") in capsys.readouterr().err
    assert not (tmp_path / "toy_suite").exists() and not (tmp_path / "README.md").exists()


@pytest.mark.parametrize("text", ["", "study,contender\ntoy,tpe\n", "a,b\n1,2,3,4\n5\n"])
def test_a_malformed_trials_csv_is_refused_in_one_line_before_anything_runs_or_is_rewritten(
    tmp_path, monkeypatch, capsys, text
):
    from autoscout_optuna.benchmark import suites as registry

    good = toy_suite(n_trials=3, n_seeds=1)
    bad = dataclasses.replace(good, name="bad")
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [good])
    assert main(["--suite", "toy_suite", "--workers", "1", "--out", str(tmp_path)]) == 0
    written = (tmp_path / "toy_suite" / "summary.md").stat().st_mtime_ns
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "trials.csv").write_text(text)
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [good, bad])
    assert main(["--suite", "toy_suite", "bad", "--rescore", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path / 'bad' / 'trials.csv'} is not a benchmark trials table" in error
    assert "Traceback" not in error
    # neither suite rewritten: the good one comes first, but every file is read before
    assert (tmp_path / "toy_suite" / "summary.md").stat().st_mtime_ns == written
    assert (tmp_path / "bad" / "trials.csv").read_text() == text
    # a re-run merged into it is refused before it runs, not after
    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [bad])
    monkeypatch.setattr("autoscout_optuna.benchmark.run_suite", None)  # must not be called
    assert main(["--suite", "bad", "--contender", "tpe", "--out", str(tmp_path)]) == 2
    assert "cannot merge into the stored results" in capsys.readouterr().err


def test_rescore_refuses_a_trials_csv_without_trials(tmp_path, monkeypatch, capsys):
    from autoscout_optuna.benchmark import suites as registry

    monkeypatch.setattr(registry, "find", lambda names, *, quick=False: [toy_suite()])
    (tmp_path / "toy_suite").mkdir()
    path = tmp_path / "toy_suite" / "trials.csv"
    path.write_text(",".join(COLUMNS) + "\n")
    assert main(["--suite", "toy_suite", "--rescore", "--out", str(tmp_path)]) == 2
    assert f"--rescore: {path} holds no trials" in capsys.readouterr().err


def test_a_report_warns_once_of_a_beaten_optimum(tmp_path):
    import warnings

    rows = _hand_built("maximize", [5.0, 10.5], ["COMPLETE"] * 2, seed=0)  # optimum 10.0
    suite = dataclasses.replace(toy_suite(n_trials=2, n_seeds=1), budgets=[1, 2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _report.write_report(suite, pd.DataFrame(rows), tmp_path)
    stale = [w for w in caught if "stored optimum" in str(w.message)]
    assert len(stale) == 1  # the summary and the plot share one frame
    assert "**beaten by a run** (1.0500x)" in (tmp_path / "summary.md").read_text()


def test_fixed_layout_studies_take_the_stored_optimums_structure_and_can_reach_it():
    from autoscout_optuna.studies._optima import stored_config

    from autoscout_optuna import studies
    from autoscout_optuna.benchmark.suites import coordinate

    fixed = coordinate.fixed_studies()
    assert [d.name for d in fixed] == list(coordinate.FIXED_LAYOUT_STUDIES)
    for definition in fixed:
        free = studies.load(definition.name)
        config = stored_config(free.name, free.options)
        # the stored optimum's config is a point of the fixed study, at the optimum's value
        replayed = definition.suggest(optuna.trial.FixedTrial(config))
        assert definition.measure(replayed, None) == pytest.approx(definition.optimum, rel=1e-9)
        # and the layout holds every structural param that config asks, none of the dense ones
        layout = definition.options["fixed"]
        assert layout == coordinate.optimum_layout(free)
        assert all(config[name] == value for name, value in layout.items())
        asked = optuna.trial.FixedTrial(config)
        free.suggest(asked)
        structural = {n for n, d in asked.distributions.items() if is_structural(d)}
        assert set(layout) == structural and len(structural) < len(asked.params)
        assert not {"max_num_seqs", "bucket_size_mb", "comm_sms"} & set(layout)


def test_a_study_without_a_stored_optimum_has_no_fixed_layout():
    from autoscout_optuna.benchmark.suites import coordinate

    assert coordinate.optimum_layout(toy_definition()) is None


@pytest.mark.slow
def test_the_script_that_reruns_every_autoscout_row_runs_each_of_its_steps(tmp_path):
    # a renamed contender or suite must break this, not the session that needs the re-run
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "rerun_autoscout_rows.sh"
    done = subprocess.run(
        ["bash", str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "QUICK": "1", "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("== done in") == 9
    written = {p.parent.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("trials.csv")}
    assert written == {"autoscout", "autoscout-long", "autoscout-overhead", "fidelity",
                       "fidelity-long", "coordinate", "mcts", "held-out/autoscout",
                       "held-out/fidelity-long"}


def test_a_median_over_seeds_half_of_which_never_reached_is_shown_as_a_lower_bound():
    # two seeds: one reaches 99 % at trial 2, one never does in 4 trials (counted as 5)
    rows = (_hand_built("maximize", [5.0, 9.95, 9.95, 9.95], ["COMPLETE"] * 4, seed=0)
            + _hand_built("maximize", [5.0, 6.0, 7.0, 8.0], ["COMPLETE"] * 4, seed=1))
    summary = _report.summarize(pd.DataFrame(rows), [4], 4)
    assert summary.loc[0, "trials_to_99_median"] == 3.5  # (2 + 5) / 2: the stored number
    text = _report.markdown(summary, [4], 4)
    # "3.5" read as a median of 3.5 trials; the seed that never got there could need any number
    assert "| >=3.5 (1/2) | >=3.5 (1/2) | >=3.5 |" in text
    assert "`>=`: half the seeds never reached" in text
    # all seeds reached: a plain median, and no note
    summary = _report.summarize(pd.DataFrame(rows[:4]), [4], 4)
    text = _report.markdown(summary, [4], 4)
    assert "| 2 (1/1) | 2 (1/1) | 2 |" in text and ">=" not in text
