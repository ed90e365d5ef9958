"""A user's memory estimate, calibrated on measured peaks, answers for out-of-memory failures."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import optuna
import pytest
from _memory_space import N_VALUES, OFFSETS, VALUES, every_structure  # tests/samplers/

from autoscout_optuna import AutoScoutSampler, Infeasible, MCTSSampler
from autoscout_optuna.samplers._autoscout import surrogate
from autoscout_optuna.samplers._mcts.estimate import (
    MIN_CALIBRATION_ROWS,
    PRIOR_SIGMA,
    EstimateCalibration,
    MemoryEstimator,
    as_estimator,
    calibrate,
)
from autoscout_optuna.samplers._mcts.feasibility import (
    EXPLAINED_P_OOM,
    fit_feasibility,
    memory_features,
    numeric_trends,
)
from autoscout_optuna.samplers._mcts.memory import MIN_SIGMA
from autoscout_optuna.samplers._mcts.tree import unique_rows


def true_fraction(codes):
    """A sum, not a product: weights split over tp, activations grow with micro-batch / tp,
    recompute saves most activations, and a constant context."""
    mb, tp = VALUES[0][codes[:, 0]], VALUES[1][codes[:, 1]]
    activations = 0.25 * mb / tp * np.where(codes[:, 2] == 1, 0.3, 1.0)
    return 0.4 / tp + activations + 0.06


def formula(codes):
    """What a practitioner's formula says: the same terms, no context, activations 20 % low."""
    mb, tp = VALUES[0][codes[:, 0]], VALUES[1][codes[:, 1]]
    return 0.4 / tp + 0.2 * mb / tp * np.where(codes[:, 2] == 1, 0.3, 1.0)


# The test space's columns by name, and each column's codes, as the samplers see them.
COLUMNS = ["mb", "tp", "recompute"]
COLUMN_CODES = [range(5), range(4), range(2)]


def formula_estimate():
    """``formula`` as a user hands it over (params -> peak over capacity), for the columns."""
    return MemoryEstimator(lambda params: float(formula(np.array(
        [[params[name] for name in COLUMNS]]))[0])).for_columns(COLUMNS, COLUMN_CODES)


def features_of(rows):
    trends = numeric_trends(VALUES, OFFSETS)
    return memory_features(rows, OFFSETS, trends)


def test_calibration_recovers_a_scale_and_a_constant_the_formula_leaves_out():
    rows = every_structure()
    truth = 1.1 * formula(rows) + 0.07
    structures, structure, _ = unique_rows(rows)
    calibration = calibrate(formula(structures), features_of(structures), structure, truth)
    assert calibration.scale == pytest.approx(1.1, rel=0.02)
    assert calibration.overhead == pytest.approx(0.07, rel=0.05)
    predicted = calibration.log_fraction(formula(rows), features_of(rows))
    assert np.allclose(predicted, np.log(truth), atol=0.02)
    assert calibration.sigma == pytest.approx(MIN_SIGMA)  # exact: only the floor is left


def test_calibrated_estimate_tells_the_sides_of_the_wall_apart_where_the_formula_does_not():
    rows = every_structure()
    truth = true_fraction(rows)
    ran = truth <= 0.8  # only what fits reported a peak, none of it beyond 0.8
    structures, structure, _ = unique_rows(rows[ran])
    calibration = calibrate(formula(structures), features_of(structures), structure,
                            truth[ran])
    p = calibration.p_out_of_memory(formula(rows), features_of(rows))
    raw = EstimateCalibration().p_out_of_memory(formula(rows), features_of(rows))
    over, under = truth > 1.15, truth < 0.85
    assert np.all(p[over] > 0.9) and np.all(p[under] < 0.1)
    # the formula alone calls structures that do not fit likely to fit
    assert raw[over].min() < 0.5


def test_too_few_measured_peaks_take_the_estimate_as_it_is():
    rows = every_structure()[: MIN_CALIBRATION_ROWS - 1]
    structures, structure, _ = unique_rows(rows)
    fraction = true_fraction(rows)
    calibration = calibrate(formula(structures), features_of(structures), structure, fraction)
    assert calibration == EstimateCalibration()
    assert calibration.sigma == PRIOR_SIGMA
    # peaks that are not numbers, or rows without an estimate, do not count either
    rows = every_structure()[:10]
    structures, structure, _ = unique_rows(rows)
    fraction = np.full(10, np.nan)
    fraction[:2] = 0.5
    fraction[2:4] = math.inf  # ran out of memory: no measured peak
    estimates = formula(structures)
    estimates[4:] = np.nan
    assert calibrate(estimates, features_of(structures), structure, fraction) == (
        EstimateCalibration())


def test_an_infinite_estimate_is_certain_to_fail_and_a_missing_one_says_nothing():
    calibration = EstimateCalibration()
    features = features_of(every_structure()[:4])
    p = calibration.p_out_of_memory(np.array([math.inf, math.nan, 0.01, 100.0]), features)
    assert p[0] == 1.0 and p[1] == 0.0
    assert p[2] < 1e-6 and p[3] > 1 - 1e-6


def test_estimator_calls_the_function_once_per_structure_and_decodes_rows():
    calls = []

    def estimate(params):
        calls.append(dict(params))
        return 0.1 * params["micro_batch"] / params["tp"]

    estimator = MemoryEstimator(estimate)
    names, values = ["micro_batch", "tp"], [[1, 2, 4], [1, 2]]
    of_codes = estimator.for_columns(names, values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing param is no error worth a warning
        out = of_codes(np.array([[2, 0], [2, 0], [0, 1], [-1, 1], [-1, -1]]))
    assert out[:3] == pytest.approx([0.4, 0.4, 0.05])
    assert math.isnan(out[3])  # micro_batch not asked: the function raised KeyError
    assert math.isnan(out[4]) and {} not in calls  # nothing asked: not even called
    assert calls.count({"micro_batch": 4, "tp": 1}) == 1
    of_codes(np.array([[2, 0]]))
    assert len(calls) == 3  # cached: a deterministic function, not state


@pytest.mark.parametrize("answer", [None, math.nan, 0.0, -1.0, "x", ValueError("no")])
def test_an_estimate_it_cannot_give_is_none_and_warns_once(answer):
    def estimate(params):
        if isinstance(answer, Exception):
            raise answer
        return answer

    estimator = MemoryEstimator(estimate)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert math.isnan(estimator({"tp": 1}))
        assert math.isnan(estimator({"tp": 2}))
    assert len(caught) == (0 if answer is None else 1)
    if caught:
        assert "memory_estimate" in str(caught[0].message)


def test_infinity_passes_through_and_the_estimator_pickles_without_its_cache():
    estimator = MemoryEstimator(_infinite_for_tp_1)
    assert estimator({"tp": 1}) == math.inf
    assert estimator({"tp": 2}) == 0.5
    copy = pickle.loads(pickle.dumps(estimator))
    assert copy.function is _infinite_for_tp_1 and copy._cache == {} and copy._by_codes == {}
    assert as_estimator(estimator) is estimator and as_estimator(None) is None


def _infinite_for_tp_1(params):
    return math.inf if params["tp"] == 1 else 0.5


@pytest.mark.parametrize("sampler", [MCTSSampler, AutoScoutSampler])
def test_a_memory_estimate_that_is_not_callable_is_refused(sampler):
    with pytest.raises(TypeError, match="memory_estimate must be callable"):
        sampler(memory_estimate=0.5)


def test_out_of_memory_failures_train_the_calibration_not_the_logistic():
    # tp 1 (code 0) failed with every heavy companion; a light tp 1 fits, by the formula
    rows = every_structure()
    truth = true_fraction(rows)
    ran = np.flatnonzero((rows[:, 1] > 0) | (rows[:, 0] >= 3))
    codes = rows[ran]
    failed = truth[ran] > 1.0
    assert failed[codes[:, 1] == 0].all()  # every tp 1 trial ran out of memory
    memory = np.where(failed, math.inf, truth[ran])
    estimate = formula_estimate()
    kwargs = dict(numeric=VALUES, memory=memory)
    learned = fit_feasibility(codes, N_VALUES, failed, ~failed, **kwargs)
    told = fit_feasibility(codes, N_VALUES, failed, ~failed, estimate=estimate, **kwargs)
    light_tp1 = np.array([[0, 0, 1], [1, 0, 1]])  # micro-batch 1-2 with recompute: 0.5-0.6
    assert np.all(true_fraction(light_tp1) < 0.7)
    # every failure ran out of memory: the estimate explains them all, no logistic is fitted
    assert learned.weights is not None and told.weights is None and told.dominance is None
    assert np.all(told.p_fail(light_tp1) < 0.1)
    heavy = rows[truth > 1.3]
    assert np.all(told.p_fail(heavy) > 0.9)
    assert told.predicts_memory
    assert told.memory_use(light_tp1) == pytest.approx(true_fraction(light_tp1), rel=0.15)


def test_out_of_memory_failures_the_estimate_did_not_see_coming_train_the_logistic():
    # The formula leaves out a term only large micro-batches pay (their logits), and only
    # small micro-batches ran (as behind a pruner, where mostly the near-top structures run):
    # the calibration sees none of that term, and calls most of the heavy failures fits.
    rows = every_structure()
    micro_batch = VALUES[0][rows[:, 0]]
    truth = true_fraction(rows) + 0.6 * (micro_batch >= 8)
    ran = (micro_batch <= 4) | (truth > 1.0)
    codes, failed = rows[ran], truth[ran] > 1.0
    memory = np.where(failed, math.inf, truth[ran])
    estimate = formula_estimate()
    model = fit_feasibility(codes, N_VALUES, failed, ~failed, numeric=VALUES, memory=memory,
                            estimate=estimate)
    p_oom = model.calibration.p_out_of_memory(estimate(codes), features_of(codes))
    unseen = failed & (p_oom < EXPLAINED_P_OOM)
    assert model.calibration.informative and unseen.sum() >= 4
    # those failures are the logistic's again: each is expected to fail once more
    assert model.weights is not None
    assert np.all(model.p_fail(codes[unseen]) > 0.9)
    # the ones the estimate explains (tp 1 with a small micro-batch) stay its own
    explained_only = fit_feasibility(codes[~unseen], N_VALUES, failed[~unseen],
                                     ~failed[~unseen], numeric=VALUES,
                                     memory=memory[~unseen], estimate=estimate)
    assert explained_only.weights is None


def _objective(trial: optuna.Trial) -> float:
    mb = trial.suggest_categorical("micro_batch", [1, 2, 4, 8, 16])
    tp = trial.suggest_categorical("tp", [1, 2, 4, 8])
    recompute = trial.suggest_categorical("recompute", ["none", "full"])
    codes = np.array([[[1, 2, 4, 8, 16].index(mb), [1, 2, 4, 8].index(tp),
                       int(recompute == "full")]])
    fraction = float(true_fraction(codes)[0])
    if fraction > 1.0:
        trial.set_user_attr("failure_reason", "oom")
        raise Infeasible("oom")
    trial.set_user_attr("memory_use", fraction)
    # bigger micro-batches run faster; parallelism and recomputation cost a little
    return math.log(mb) - 0.15 * math.log(tp) - (0.3 if recompute == "full" else 0.0)


def _estimate(params):
    codes = np.array([[[1, 2, 4, 8, 16].index(params["micro_batch"]),
                       [1, 2, 4, 8].index(params["tp"]), int(params["recompute"] == "full")]])
    return float(formula(codes)[0])


@pytest.mark.parametrize("sampler", [MCTSSampler, AutoScoutSampler])
def test_samplers_run_fewer_structures_that_do_not_fit_given_an_estimate(sampler):
    def failures(**options) -> int:
        total = 0
        for seed in range(4):
            study = optuna.create_study(direction="maximize",
                                        sampler=sampler(seed=seed, **options))
            study.optimize(_objective, n_trials=30, catch=(Infeasible,))
            total += sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
        return total

    assert failures(memory_estimate=_estimate) < failures()


def test_the_plan_records_the_calibrated_memory_it_expects():
    study = optuna.create_study(direction="maximize",
                                sampler=MCTSSampler(seed=0, memory_estimate=_estimate))
    study.optimize(_objective, n_trials=25, catch=(Infeasible,))
    checked = 0
    for trial in study.trials[10:]:
        record = trial.user_attrs.get("mcts:feasibility", {})
        if "memory_use" in record and "memory_use" in trial.user_attrs:
            assert record["memory_use"] == pytest.approx(trial.user_attrs["memory_use"], rel=0.2)
            checked += 1
    assert checked >= 5


def test_a_study_resumed_from_sqlite_decides_as_one_uninterrupted_study(tmp_path):
    # the calibration is refitted from storage on every plan; the estimator's cache is a cache
    def sampler():
        return AutoScoutSampler(seed=3, memory_estimate=_estimate)

    whole = optuna.create_study(direction="maximize", sampler=sampler())
    whole.optimize(_objective, n_trials=30, catch=(Infeasible,))
    storage = f"sqlite:///{tmp_path / 'estimate.db'}"
    first = optuna.create_study(direction="maximize", sampler=sampler(), storage=storage,
                                study_name="s")
    first.optimize(_objective, n_trials=18, catch=(Infeasible,))
    resumed = optuna.load_study(study_name="s", storage=storage, sampler=sampler())
    resumed.optimize(_objective, n_trials=12, catch=(Infeasible,))
    assert [t.params for t in resumed.trials] == [t.params for t in whole.trials]
    assert [t.user_attrs.get("mcts:feasibility") for t in resumed.trials] == [
        t.user_attrs.get("mcts:feasibility") for t in whole.trials]


def test_an_estimate_that_does_not_track_the_peaks_leaves_the_failures_to_the_logistic():
    rows = every_structure()
    truth = true_fraction(rows)
    failed = truth > 1.0
    memory = np.where(failed, math.inf, truth)
    kwargs = dict(numeric=VALUES, memory=memory)
    constant = MemoryEstimator(lambda params: 0.5).for_columns(COLUMNS, COLUMN_CODES)
    blind = fit_feasibility(rows, N_VALUES, failed, ~failed, estimate=constant, **kwargs)
    assert not blind.calibration.informative
    assert blind.weights is not None  # out-of-memory failures train the logistic again
    told = fit_feasibility(rows, N_VALUES, failed, ~failed, estimate=formula_estimate(),
                           **kwargs)
    assert told.calibration.informative and told.weights is None


def test_the_model_arm_checks_and_plans_the_params_its_inferred_conditions_leave_out():
    # The inferred conditions say recompute is asked only under tp 8 (wrong, as after failed
    # prefixes): a candidate without it has no estimate, and the trial would draw it at random.
    # A big micro-batch at tp 2 fits only with full recompute.
    estimate = formula_estimate()
    rows = every_structure()
    ran = rows[true_fraction(rows) < 1.0]  # what ran fitted
    truth = true_fraction(ran)
    # bigger micro-batches and less tensor parallelism run faster; recompute costs a little
    scores = np.log(VALUES[0][ran[:, 0]]) - 0.5 * np.log(VALUES[1][ran[:, 1]]) - 0.1 * ran[:, 2]
    for seed in range(10):
        proposal = surrogate.propose_encoded(
            COLUMNS, COLUMN_CODES, ran, ["real"] * len(ran), scores, {"recompute": {"tp": [3]}},
            np.random.default_rng(seed), memory=truth, memory_estimate=estimate)
        assert set(proposal.values) == set(COLUMNS)  # the trial runs what was checked
        planned = np.array([[proposal.values[name] for name in COLUMNS]])
        assert true_fraction(planned)[0] < 1.0
        assert proposal.p_fail <= surrogate.MAX_FAIL_PROBABILITY
