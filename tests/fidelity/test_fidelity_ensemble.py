import numpy as np
import pytest

from autoscout_optuna.fidelity import SimulatorEnsemble


def _true(config):
    layout = {"a": 1.0, "b": 0.8, "c": 1.3}[config["layout"]]
    return 100.0 * layout * (1.0 + 0.5 * np.sin(config["x"])) / (1.0 + 0.1 * config["depth"])


def _simulate(config):
    # Gets the trend right, but is 40% optimistic for layout "c" and misses the x effect.
    bias = 1.4 if config["layout"] == "c" else 1.0
    return 1.3 * bias * 100.0 * {"a": 1.0, "b": 0.8, "c": 1.3}[config["layout"]] / (
        1.0 + 0.1 * config["depth"]
    )


def _configs(rng, n):
    return [
        {
            "layout": str(rng.choice(["a", "b", "c"])),
            "x": float(rng.uniform(-1.5, 1.5)),
            "depth": int(rng.integers(1, 9)),
        }
        for _ in range(n)
    ]


def _median_relative_error(ensemble, configs):
    truth = np.array([_true(c) for c in configs])
    return float(np.median(np.abs(ensemble.predict(configs) / truth - 1.0)))


def test_accuracy_improves_as_real_results_arrive():
    rng = np.random.default_rng(0)
    held_out = _configs(rng, 200)
    train = _configs(rng, 60)
    real = [_true(c) * rng.lognormal(0, 0.02) for c in train]
    errors = []
    for n in (0, 5, 15, 60):
        ensemble = SimulatorEnsemble(simulate=_simulate).fit(train[:n], real[:n])
        errors.append(_median_relative_error(ensemble, held_out))
    raw = float(np.median([abs(_simulate(c) / _true(c) - 1) for c in held_out]))
    assert errors[0] == pytest.approx(raw)  # nothing learned yet: the raw simulator
    assert errors[1] < errors[0] and errors[3] < errors[2] < errors[1]
    assert errors[3] < 0.25 * raw


def test_member_on_the_feature_that_explains_the_bias_gets_weight():
    rng = np.random.default_rng(1)
    configs = [{**c, "x": 0.0} for c in _configs(rng, 40)]  # only layout carries bias
    ensemble = SimulatorEnsemble(simulate=_simulate).fit(configs, [_true(c) for c in configs])
    weights = ensemble.weights
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["feature:layout"] > weights["analytic"]
    assert weights["feature:layout"] > weights["feature:depth"]


def test_conditional_missing_and_unseen_values_do_not_break_prediction():
    rng = np.random.default_rng(2)
    train = _configs(rng, 20)
    for config in train[::2]:
        del config["x"]  # a conditional knob, absent from half the trials
    real = [_true({"x": 0.0, **c}) for c in train]
    ensemble = SimulatorEnsemble(simulate=_simulate).fit(train, real)
    unseen = [{"layout": "z", "depth": 3}, {"layout": "a", "depth": 3, "x": 9.0, "new": "knob"}]
    simulated = [100.0, 50.0]
    predicted = ensemble.predict(unseen, simulated)
    assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)


def test_linear_space_when_values_are_not_positive():
    configs = [{"x": float(x)} for x in np.linspace(-2, 2, 15)]
    real = [c["x"] - 3.0 for c in configs]  # negative values: no log space
    ensemble = SimulatorEnsemble(simulate=lambda c: c["x"]).fit(configs, real)
    assert ensemble.predict_one({"x": 1.0}) == pytest.approx(-2.0, abs=0.05)


def test_surrogates_alone_without_an_analytic_simulator():
    rng = np.random.default_rng(3)
    configs = _configs(rng, 60)
    ensemble = SimulatorEnsemble().fit(configs, [_true(c) for c in configs])
    held_out = _configs(rng, 100)
    flat = float(np.median([abs(np.mean([_true(c) for c in configs]) / _true(c) - 1)
                            for c in held_out]))
    assert _median_relative_error(ensemble, held_out) < 0.5 * flat


def test_non_finite_training_pairs_are_skipped():
    configs = [{"x": float(x)} for x in range(8)]
    real = [float(x + 1) for x in range(8)]
    real[3] = float("nan")
    ensemble = SimulatorEnsemble(simulate=lambda c: c["x"] + 1.0).fit(configs, real)
    assert np.isfinite(ensemble.predict_one({"x": 3.0}))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"window": 1}, "window"),
        ({"max_train": 5}, "max_train"),
        ({"ridge": 0.0}, "ridge"),
        ({"min_real": 0}, "min_real"),
        ({"sharpness": -1.0}, "sharpness"),
        ({"ridge": float("inf")}, "ridge"),
        ({"sharpness": float("inf")}, "sharpness"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SimulatorEnsemble(**kwargs)


def test_a_bias_fixed_per_value_of_a_small_numeric_knob_is_learned():
    # tp in {1, 2, 4, 8}: a simulator wrong by an arbitrary factor per value (not smooth in
    # tp or log tp), as when each parallel layout takes a different code path.
    factor = {1: 1.0, 2: 1.5, 4: 0.8, 8: 1.3}
    rng = np.random.default_rng(3)
    configs = [{"tp": int(rng.choice([1, 2, 4, 8])), "x": float(rng.uniform(0, 1))}
               for _ in range(80)]

    def true(config):
        return 100.0 / config["tp"] ** 0.5 * (1.0 + config["x"])

    def simulate(config):
        return true(config) * factor[config["tp"]]

    train, held_out = configs[:40], configs[40:]
    ensemble = SimulatorEnsemble(simulate=simulate).fit(train, [true(c) for c in train])
    predicted = ensemble.predict(held_out)
    truth = np.array([true(c) for c in held_out])
    assert np.max(np.abs(predicted / truth - 1.0)) < 0.05


def test_selected_results_do_not_pull_the_level_down():
    # Unbiased simulator; the results run because their estimate looked good were lucky draws
    # (simulated 30 % above real). Their bias is not the simulator's.
    configs = [{"x": float(i)} for i in range(20)]
    real = [10.0] * 20
    selected = [i % 2 == 1 for i in range(20)]
    simulated = [13.0 if s else 10.0 for s in selected]
    plain = SimulatorEnsemble(simulate=lambda c: 10.0, min_real=5)
    aware = SimulatorEnsemble(simulate=lambda c: 10.0, min_real=5).fit(
        configs, real, simulated, selected)
    fresh = [{"x": 3.5}]
    assert aware.predict(fresh, [10.0])[0] == pytest.approx(10.0, rel=1e-6)
    plain.fit(configs, real, simulated)
    assert plain.predict(fresh, [10.0])[0] < 9.5
