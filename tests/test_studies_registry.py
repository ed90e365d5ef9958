import pytest

from autoscout_optuna import studies


def test_unknown_study_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown study 'nope'"):
        studies.load("nope")


def test_study_file_by_path(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "from autoscout_optuna._study_definition import StudyDefinition\n"
        "def definition(**options):\n"
        "    return StudyDefinition(name='mine', direction='minimize', metric='s',\n"
        "        suggest=lambda t: {'x': t.suggest_float('x', 0, 1)},\n"
        "        measure=lambda c, rng: c['x'] ** 2)\n"
    )
    assert studies.load(str(path)).name == "mine"
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no definition"):
        studies.load(str(tmp_path / "empty.py"))
    with pytest.raises(ValueError, match="does not exist"):
        studies.load(str(tmp_path / "missing.py"))


def test_bad_direction_is_rejected():
    from autoscout_optuna._study_definition import StudyDefinition

    with pytest.raises(ValueError, match="direction"):
        StudyDefinition(name="x", direction="up", metric="", suggest=None, measure=None)


def test_the_default_config_is_enqueued_as_a_tagged_trial():
    import optuna

    from autoscout_optuna._keys import DEFAULT_CONFIG
    from autoscout_optuna._study_definition import StudyDefinition

    definition = StudyDefinition(
        name="x", direction="maximize", metric="", measure=None, default_config={"a": 2},
        suggest=lambda trial: {"a": trial.suggest_int("a", 0, 3)},
    )
    study = optuna.create_study(direction="maximize")
    definition.enqueue_default(study)
    study.optimize(lambda trial: definition.suggest(trial)["a"], n_trials=1)
    trial = study.trials[0]
    assert trial.params == {"a": 2} and trial.user_attrs[DEFAULT_CONFIG] is True
    without = StudyDefinition(name="y", direction="maximize", metric="", suggest=None,
                              measure=None)
    with pytest.raises(ValueError, match="'y' has no default config"):
        without.enqueue_default(study)
    assert len(study.trials) == 1  # nothing queued
