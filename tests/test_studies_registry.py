import optuna
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


class _CallLog:
    """A trial-like object that logs each suggest call and answers its low end / first choice."""

    def __init__(self):
        self.calls = []

    def suggest_categorical(self, name, choices):
        self.calls.append(("categorical", name, choices))
        return choices[0]

    def suggest_int(self, name, low, high, *, step=1, log=False):
        self.calls.append(("int", name, low, high, step, log))
        return low

    def suggest_float(self, name, low, high, *, step=None, log=False):
        self.calls.append(("float", name, low, high, step, log))
        return low


_SPACE = dict(
    layout=optuna.distributions.CategoricalDistribution([4, 1, 2]),
    seqs=optuna.distributions.IntDistribution(8, 1024, log=True),
    share=optuna.distributions.FloatDistribution(0.5, 0.99, step=0.01),
)


def test_knobs_suggest_makes_the_call_the_declared_distribution_names():
    from autoscout_optuna._study_definition import Knobs

    trial = _CallLog()
    knobs = Knobs(trial, space=_SPACE)
    assert [knobs.suggest(name, default=None) for name in _SPACE] == [4, 8, 0.5]
    assert trial.calls == [("categorical", "layout", [4, 1, 2]),
                           ("int", "seqs", 8, 1024, 1, True),
                           ("float", "share", 0.5, 0.99, 0.01, False)]


def test_knobs_suggest_pins_fixed_knobs_and_holds_dense_ones_at_their_defaults():
    from autoscout_optuna._study_definition import Knobs

    trial = _CallLog()
    knobs = Knobs(trial, space=_SPACE, fixed=dict(layout=2), dense_at_defaults=True)
    assert knobs.suggest("layout") == 2
    assert knobs.suggest("seqs", default=256) == 256
    assert knobs.suggest("share", default=0.9) == 0.9
    assert trial.calls == []


def test_knobs_suggest_names_a_knob_missing_from_the_space():
    from autoscout_optuna._study_definition import Knobs

    with pytest.raises(KeyError, match=r"knob 'sequs' is not in the space; knobs are \['layout'"):
        Knobs(_CallLog(), space=_SPACE, fixed=dict(sequs=1)).suggest("sequs")


@pytest.mark.parametrize(("name", "fixed"), [
    ("llm_training", {"pp": 2}),  # the recipe's VPP follows the pinned PP
    ("llm_training", {"recompute": "full", "tp": 4}),  # recompute_layers at its default
    ("llm_serving", {"speculative": True}),  # num_speculative_tokens at its default
    ("llm_serving", {"tp": 4, "pp": 2}),
])
def test_the_default_config_is_what_trial_0_runs_under_the_pins(name, fixed):
    # a pinned knob is never suggested: the queued default ran with the pins while the study's
    # default config (the gain's base, the dashboard's baseline) was the recipe without them
    definition = studies.load(name, fixed=fixed)
    assert {k: definition.default_config[k] for k in fixed} == fixed
    study = optuna.create_study(direction=definition.direction)
    definition.enqueue_default(study)
    assert definition.suggest(study.ask()) == definition.default_config


def test_a_config_built_without_a_trial_names_a_knob_with_no_value():
    from autoscout_optuna._study_definition import Knobs

    knobs = Knobs(None, fixed={"a": 1})
    assert knobs.categorical("a", [1, 2]) == 1
    assert knobs.int("b", 1, 9, default=4) == 4
    with pytest.raises(ValueError, match="knob 'c' has no value"):
        knobs.categorical("c", [1, 2])
