import numpy as np
import optuna
import pytest

from autoscout_optuna._rng import resolve_seed, trial_rng
from autoscout_optuna._storage import set_user_attr


def test_trial_rng_is_a_pure_function_of_its_inputs():
    a = trial_rng(7, 3, "arm").random(4)
    assert np.array_equal(a, trial_rng(7, 3, "arm").random(4))
    assert not np.array_equal(a, trial_rng(7, 4, "arm").random(4))
    assert not np.array_equal(a, trial_rng(7, 3, "other").random(4))
    assert not np.array_equal(a, trial_rng(8, 3, "arm").random(4))


def test_resolve_seed_validates():
    assert resolve_seed(5) == 5
    assert isinstance(resolve_seed(None), int)
    with pytest.raises(TypeError, match="seed"):
        resolve_seed("5")


def test_user_attrs_are_stored_as_json():
    study = optuna.create_study()
    trial = study.ask()
    frozen = study._storage.get_trial(trial._trial_id)
    set_user_attr(study, frozen, "k", {"a": np.int64(3), "b": (1, 2), "c": np.array([0.5])})
    assert study._storage.get_trial(trial._trial_id).user_attrs["k"] == {
        "a": 3, "b": [1, 2], "c": [0.5]}
    with pytest.raises(TypeError, match="cannot be stored"):
        set_user_attr(study, frozen, "bad", object())


def test_non_finite_numbers_are_stored_as_none():
    # Python's json would write NaN/Infinity tokens, which strict JSON readers reject.
    study = optuna.create_study()
    trial = study.ask()
    detail = {"bound": float("inf"), "error": np.float64("nan"), "n": 3, "ok": [1.5, -np.inf]}
    set_user_attr(study, trial, "detail", detail)
    stored = study._storage.get_trial(trial._trial_id).user_attrs["detail"]
    assert stored == {"bound": None, "error": None, "n": 3, "ok": [1.5, None]}
