"""The confirmation benchmark: what confirming the winner changes in what a search ships."""

from __future__ import annotations

import pytest

from autoscout_optuna.benchmark import confirmation


def test_one_seed_scores_both_answers_against_the_noiseless_reference(tmp_path):
    status = confirmation.main(["--seeds", "1", "--first-seed", "3", "--trials", "12",
                                "--workers", "1", "--out", str(tmp_path)])
    assert status == 0
    out = tmp_path / "confirmation"
    import pandas as pd

    rows = pd.read_csv(out / "confirmation.csv")
    assert list(rows["study"]) == ["llm_training (8B, 64 H100)",
                                   "llm_training (70B, 512 H100)", "llm_serving"]
    assert (rows["seed"] == 3).all() and (rows["trials"] == 12).all()
    # each shipped config is a real config of the study: never above its optimum
    assert (rows["single_true"] <= rows["optimum"] * (1 + 1e-9)).all()
    assert (rows["confirmed_true"] <= rows["optimum"] * (1 + 1e-9)).all()
    # the top 3 and the default, 2 runs each at most (fewer where the default is among them)
    assert rows["confirmation_trials"].between(4, 8).all()
    # the true gains are of the shipped configs over the same default
    assert list(rows["confirmed_gain_true"]) == pytest.approx(
        list(rows["confirmed_true"] / rows["default_true"]))
    summary = (out / "summary.md").read_text()
    assert "python -m autoscout_optuna.benchmark.confirmation --seeds 1" in summary
    assert summary.count("| llm_") == 3
    assert (out / "confirmation.png").stat().st_size > 0


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--trials", "0"], ["--first-seed", "-1"]])
def test_bad_arguments_exit_2_and_run_nothing(argv, tmp_path, capsys):
    assert confirmation.main([*argv, "--out", str(tmp_path)]) == 2
    assert "must be" in capsys.readouterr().err
    assert not (tmp_path / "confirmation").exists()
