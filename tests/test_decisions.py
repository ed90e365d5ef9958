import optuna

from autoscout_optuna import AutoScoutSampler, decisions_table


def test_one_row_per_trial_with_decisions():
    study = optuna.create_study(sampler=AutoScoutSampler(seed=0, n_startup_trials=3))

    def objective(trial):
        layout = trial.suggest_categorical("layout", ["a", "b"])
        x = trial.suggest_float("x", 0.0, 1.0)
        if trial.number == 4:
            raise RuntimeError("boom")
        if trial.number == 5:
            trial.report(9.0, step=0)
            raise optuna.TrialPruned()
        return x + (layout == "a")

    study.optimize(objective, n_trials=10, catch=(RuntimeError,))
    table = decisions_table(study)
    assert list(table["number"]) == list(range(10))
    assert list(table.columns[:5]) == [
        "number", "state", "value", "autoscout:arm", "autoscout:reason"
    ]
    assert list(table["autoscout:arm"][:3]) == ["startup"] * 3
    assert set(table["autoscout:arm"][3:]) <= {"explore", "refine"}
    assert table.loc[4, "state"] == "FAIL" and table.loc[4, "value"] is None
    assert table.loc[5, "value"] == 9.0  # a pruned trial shows its low-fidelity value
    assert "autoscout:bandit" in table.columns
    assert table.loc[0, "autoscout:bandit"] is None  # start-up trials have no bandit stats


def test_trials_of_other_samplers_have_empty_decisions():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    table = decisions_table(study)
    assert len(table) == 3
    assert table["autoscout:arm"].isna().all()
