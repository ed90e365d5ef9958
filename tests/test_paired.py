"""Seed ranges, study filters and the paired comparison of two benchmark runs."""

from __future__ import annotations

import pandas as pd
import pytest

from autoscout_optuna import benchmark
from autoscout_optuna.benchmark import Contender, run_suite
from autoscout_optuna.benchmark.paired import main as paired_main
from autoscout_optuna.benchmark.paired import markdown, paired_against, paired_differences
from tests.test_benchmark import make_random, make_tpe, toy_definition, toy_suite


def _rows(curves: dict[int, list[float]], *, contender="c", fails=()) -> pd.DataFrame:
    """A trials table of one maximizing study (optimum 10) from best-so-far curves per seed."""
    rows = []
    for seed, curve in curves.items():
        for number, best in enumerate(curve):
            failed = (seed, number) in fails
            rows.append({"study": "s", "direction": "maximize", "optimum": 10.0,
                         "contender": contender, "seed": seed, "trial": number,
                         "state": "FAIL" if failed else "COMPLETE", "true_value": best,
                         "best_true_so_far": best, "is_real_run": not failed})
    return pd.DataFrame(rows)


def test_first_seed_shifts_the_seeds_a_suite_runs():
    import dataclasses

    suite = dataclasses.replace(toy_suite(n_trials=4, n_seeds=2), first_seed=5)
    frame = run_suite(suite, None, n_workers=1)
    assert sorted(frame["seed"].unique()) == [5, 6]
    # seeded: seed 6 of a suite from 5 is seed 6 of a suite from 0
    plain = run_suite(toy_suite(n_trials=4, n_seeds=7), None, n_workers=1)
    pd.testing.assert_frame_equal(
        frame[frame["seed"] == 6].drop(columns="sampler_ms").reset_index(drop=True),
        plain[plain["seed"] == 6].drop(columns="sampler_ms").reset_index(drop=True))
    with pytest.raises(ValueError, match="first_seed"):
        dataclasses.replace(suite, first_seed=-1)


def test_a_study_filter_runs_those_studies_and_keeps_the_others_stored(tmp_path, monkeypatch):
    from autoscout_optuna.benchmark import suites as registry

    suite = toy_suite(n_trials=5, n_seeds=1,
                      definitions=[toy_definition("maximize"), toy_definition("minimize")])
    monkeypatch.setattr(registry, "find", lambda names, quick=False: [suite])
    argv = ["--suite", "toy_suite", "--workers", "1", "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    stored = pd.read_csv(tmp_path / "toy_suite" / "trials.csv")
    assert benchmark.main(argv + ["--study", "minimize", "--contender", "tpe",
                                  "--first-seed", "3"]) == 0
    merged = pd.read_csv(tmp_path / "toy_suite" / "trials.csv")
    replaced = (merged["study"] == "toy[direction=minimize]") & (merged["contender"] == "tpe")
    assert sorted(merged.loc[replaced, "seed"].unique()) == [3]
    # every other (study, contender) pair is exactly as stored
    kept = stored[~((stored["study"] == "toy[direction=minimize]")
                    & (stored["contender"] == "tpe"))].reset_index(drop=True)
    pd.testing.assert_frame_equal(merged[~replaced].reset_index(drop=True), kept)
    assert benchmark.main(argv + ["--study", "nothing like it"]) == 2
    assert benchmark.main(argv + ["--contender", "tpe", "misspelt"]) == 2


def test_a_rerun_on_other_seeds_says_which_stored_seeds_it_dropped(tmp_path, monkeypatch,
                                                                   capsys):
    from autoscout_optuna.benchmark import suites as registry

    monkeypatch.setattr(registry, "find",
                        lambda names, quick=False: [toy_suite(n_trials=3, n_seeds=4)])
    argv = ["--suite", "toy_suite", "--workers", "1", "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    capsys.readouterr()
    assert benchmark.main(argv + ["--contender", "tpe"]) == 0  # the same seeds: nothing to say
    assert "dropped" not in capsys.readouterr().err
    assert benchmark.main(argv + ["--contender", "tpe", "--first-seed", "6", "--seeds", "1"]) == 0
    assert ("'tpe' on 'toy[direction=maximize]': stored seeds 0-3 dropped, replaced by seeds 6"
            in capsys.readouterr().err)


def test_paired_differences_pair_seeds_and_count_what_moved():
    before = _rows({0: [5, 9, 9.95], 1: [5, 6, 7], 2: [1, 2, 3]}, fails={(1, 2)})
    after = _rows({0: [5, 9, 9.95], 1: [5, 8, 9.95], 3: [4, 4, 4]})
    table = paired_differences(before, after, budgets=[2, 3, 50])
    assert list(table["budget"]) == [2, 3]  # 50 is beyond the runs
    at3 = table[table["budget"] == 3].iloc[0]
    assert at3["seeds"] == 2  # seeds 0 and 1: 2 and 3 are in one run only
    assert at3["mean_difference"] == pytest.approx((0.0 + (0.995 - 0.7)) / 2)
    assert (at3["better"], at3["worse"]) == (1, 0)
    assert (at3["before_at_99"], at3["after_at_99"]) == (1, 2)
    # FAIL counts only after the first 20 trials: none in three-trial runs
    assert at3["before_fails"] == 0.0
    text = markdown(table)
    assert "| s | 3 | 2 | 0.847 -> 0.995 | +0.1475 +- " in text


def test_paired_differences_count_late_failures_up_to_the_budget():
    curve = [5.0] * 30
    before = _rows({0: curve, 1: curve}, fails={(0, 25), (1, 21), (1, 29)})
    after = _rows({0: curve, 1: curve})
    table = paired_differences(before, after, budgets=[20, 26, 30]).set_index("budget")
    assert list(table["before_fails"]) == [0.0, 1.0, 1.5]
    assert list(table["after_fails"]) == [0.0, 0.0, 0.0]


def test_paired_differences_need_one_named_contender_and_common_seeds():
    both = pd.concat([_rows({0: [1.0]}, contender="a"), _rows({0: [2.0]}, contender="b")])
    with pytest.raises(ValueError, match=r"contenders \['a', 'b'\]: name one"):
        paired_differences(both, both)
    with pytest.raises(ValueError, match="no contender 'c'"):
        paired_differences(both, both, contender_before="c", contender_after="a")
    table = paired_differences(both, both, contender_before="a", contender_after="b",
                               budgets=[1])
    assert table.iloc[0]["mean_difference"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="share no"):
        paired_differences(_rows({0: [1.0]}), _rows({1: [1.0]}))
    with pytest.raises(ValueError, match="lacks best_true_so_far"):
        paired_differences(_rows({0: [1.0]}).drop(columns="best_true_so_far"), _rows({0: [1]}))


def test_paired_command_line_compares_two_stored_runs(tmp_path, capsys):
    suite = toy_suite(n_trials=6, n_seeds=2, contenders=[Contender("random", make_random)])
    other = toy_suite(n_trials=6, n_seeds=2, contenders=[Contender("tpe", make_tpe)])
    run_suite(suite, tmp_path / "a", n_workers=1)
    run_suite(other, tmp_path / "b", n_workers=1)
    a, b = (tmp_path / x / "toy_suite" / "trials.csv" for x in "ab")
    assert paired_main([str(a), str(a), "--budgets", "6"]) == 0
    out = capsys.readouterr().out
    assert "| toy[direction=maximize] | 6 | 2 |" in out and "+0.0000 +- 0.0000 | 0 / 0 |" in out
    assert paired_main([str(a), str(b), "--budgets", "3", "6"]) == 0
    assert out.count("\n") == 3  # header, rule, one budget
    assert paired_main([str(a), str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_paired_command_line_refuses_budgets_it_cannot_compare_and_unreadable_files(
    tmp_path, capsys
):
    path = tmp_path / "trials.csv"
    pd.concat([_rows({0: [5.0, 9.0]}, contender="ref"),
               _rows({0: [5.0, 9.9]}, contender="b")]).to_csv(path, index=False)
    # every budget beyond the runs' 2 trials: a table of headers alone, exit 0, before
    assert paired_main([str(path), "--against", "ref"]) == 2
    assert "no budget of [20, 50, 100] is within the trials" in capsys.readouterr().err
    assert paired_main([str(path), "--against", "ref", "--budgets", "0", "-3"]) == 2
    assert "--budgets must be trial counts >= 1" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert paired_main([str(empty), "--against", "ref"]) == 2  # EmptyDataError before
    assert f"cannot read {empty} as a trials table" in capsys.readouterr().err
    assert paired_main([str(path), "--against", "ref", "--budgets", "2", "50"]) == 0
    assert "| b | s | 2 | 1 |" in capsys.readouterr().out


def test_every_contender_against_one_keeps_the_runs_order(tmp_path, capsys):
    run = pd.concat([_rows({0: [5.0, 9.0], 1: [5.0, 6.0]}, contender="ref"),
                     _rows({0: [5.0, 9.9], 1: [5.0, 5.0]}, contender="z-first"),
                     _rows({0: [1.0, 2.0]}, contender="a-second")])
    table = paired_against(run, "ref", budgets=[2])
    assert list(table["contender"]) == ["z-first", "a-second"]
    assert list(table["seeds"]) == [2, 1]
    assert table.iloc[0]["mean_difference"] == pytest.approx((0.09 - 0.1) / 2)
    assert markdown(table).splitlines()[2].startswith("| z-first | s | 2 | 2 |")
    with pytest.raises(ValueError, match="no contender 'nobody'"):
        paired_against(run, "nobody")
    with pytest.raises(ValueError, match="no contender besides 'ref'"):
        paired_against(run[run["contender"] == "ref"], "ref")
    path = tmp_path / "trials.csv"
    run.to_csv(path, index=False)
    assert paired_main([str(path), "--against", "ref", "--budgets", "2"]) == 0
    assert "| a-second | s | 2 | 1 |" in capsys.readouterr().out
    assert paired_main([str(path)]) == 2  # neither AFTER nor --against
    assert paired_main([str(path), str(path), "--against", "ref"]) == 2
    assert paired_main([str(path), "--against", "nobody"]) == 2
    assert "no contender 'nobody'" in capsys.readouterr().err


def test_a_contender_rerun_on_other_seeds_is_left_out_of_the_comparison_not_fatal():
    # "ablation" re-run on seeds 40-41 and merged into a run of seeds 0-1 (--contender
    # --first-seed 40): the suite's paired report raised "share no (study, seed)" for all
    run = pd.concat([_rows({0: [5.0, 9.0], 1: [5.0, 6.0]}, contender="ref"),
                     _rows({0: [5.0, 9.9], 1: [5.0, 5.0]}, contender="b"),
                     _rows({40: [1.0, 2.0], 41: [3.0, 4.0]}, contender="ablation")])
    with pytest.warns(UserWarning, match="sharing no \\(study, seed\\) with it: 'ablation'"):
        table = paired_against(run, "ref", budgets=[2])
    assert list(table["contender"]) == ["b"]
    with pytest.raises(ValueError, match="no contender shares a \\(study, seed\\) with 'ref'"):
        paired_against(run[run["contender"] != "b"], "ref", budgets=[2])


def test_the_autoscout_suite_writes_its_paired_table_after_a_run(tmp_path):
    from autoscout_optuna.benchmark.suites.autoscout import suites, write_paired_report

    assert next(s for s in suites() if s.name == "autoscout").extra_report is write_paired_report
    run = pd.concat([_rows({0: [5.0] * 20}, contender="autoscout"),
                     _rows({0: [9.95] * 20}, contender="tpe")])
    run.to_csv(tmp_path / "trials.csv", index=False)
    text = write_paired_report(tmp_path).read_text()
    row = "| tpe | s | 20 | 1 | 0.500 -> 0.995 | +0.4950 +- n/a (one seed) | 1 / 0 | 0 -> 1 |"
    assert row in text


def test_a_run_without_autoscout_rows_writes_its_trials_and_no_paired_table(tmp_path, capsys):
    # `--contender tpe --out NEW_DIR`: the run is kept; the report had raised after it
    from autoscout_optuna.benchmark.suites.autoscout import write_paired_report

    _rows({0: [9.95] * 20}, contender="tpe").to_csv(tmp_path / "trials.csv", index=False)
    assert write_paired_report(tmp_path) is None
    assert "no 'autoscout' rows" in capsys.readouterr().err
    assert not (tmp_path / "paired.md").exists()


def test_baselines_from_the_expert_config_are_paired_with_autoscout_started_alike(tmp_path):
    from autoscout_optuna.benchmark.suites.autoscout import write_paired_report

    run = pd.concat([_rows({0: [5.0] * 20}, contender="autoscout"),
                     _rows({0: [9.0] * 20}, contender="autoscout from the expert config"),
                     _rows({0: [6.0] * 20}, contender="tpe from the expert config")])
    run.to_csv(tmp_path / "trials.csv", index=False)
    first, _, second = write_paired_report(tmp_path).read_text().partition(
        "## From the expert config")
    # AutoScout from the expert config against AutoScout from scratch; the baseline that starts
    # from it only against AutoScout started alike
    assert "| autoscout from the expert config | s | 20 | 1 | 0.500 -> 0.900 |" in first
    assert "tpe from the expert config" not in first
    assert "| tpe from the expert config | s | 20 | 1 | 0.900 -> 0.600 |" in second


def test_without_a_known_optimum_both_runs_are_scored_on_the_best_either_saw():
    before = _rows({0: [4.0, 5.0]}).assign(optimum=float("nan"))
    after = _rows({0: [4.0, 10.0]}).assign(optimum=float("nan"))
    row = paired_differences(before, after, budgets=[2]).iloc[0]
    assert (row["before_median"], row["after_median"]) == (0.5, 1.0)
    both = pd.concat([before, after.assign(contender="d")])
    row = paired_against(both, "c", budgets=[2]).iloc[0]
    assert (row["before_median"], row["after_median"]) == (0.5, 1.0)
