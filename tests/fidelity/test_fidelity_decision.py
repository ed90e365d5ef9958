import pytest

from autoscout_optuna.fidelity._decision import FidelitySettings, decide

SETTINGS = FidelitySettings(
    error_threshold=0.3, rank_error_threshold=0.35, rank_tolerance=0.05, top_fraction=None,
    optimism=1.0, validation_period=10, n_warmup_real=3, window=10, min_pairs=3,
)
# A simulator 10% optimistic everywhere: right order, calibrated scale 1/1.1.
GOOD = dict(
    pair_estimates=[1.1, 2.2, 3.3, 4.4, 5.5], pair_reals=[1.0, 2.0, 3.0, 4.0, 5.0], best_real=5.0
)


def _decide(**overrides):
    arguments = dict(
        trial_number=1, estimate=3.3, maximize=True, pool_estimates=[1.1, 2.2, 3.3, 4.4, 5.5],
        settings=SETTINGS, last_real_number=0, **GOOD,
    )
    arguments.update(overrides)
    return decide(**arguments)


def test_estimate_that_cannot_beat_the_best_is_trusted():
    decision = _decide(estimate=4.4)  # calibrated: 4.0 < 5.0
    assert (decision.fidelity, decision.reason) == ("simulator", "not_promising")
    assert decision.error.scale == pytest.approx(1 / 1.1)


def test_estimate_that_could_beat_the_best_runs_for_real():
    # Raw 5.6 looks better than 5.0 only after calibration is ignored: calibrated it is 5.09.
    assert _decide(estimate=5.6).reason == "could_beat_best"
    assert _decide(estimate=5.4).fidelity == "simulator"  # calibrated 4.91, no noise to doubt


def test_optimism_gives_noisy_estimates_the_benefit_of_the_doubt():
    noisy = dict(pair_estimates=[1.0, 2.3, 2.8, 4.4, 4.8], pair_reals=[1.0, 2.0, 3.0, 4.0, 5.0])
    assert _decide(estimate=4.7, **{**GOOD, **noisy}).reason == "could_beat_best"
    cautious = FidelitySettings(**{**SETTINGS.__dict__, "optimism": 0.0})
    assert _decide(estimate=4.7, settings=cautious, **{**GOOD, **noisy}).fidelity == "simulator"


def test_minimize_mirrors_maximize():
    mirrored = dict(pair_estimates=[-v for v in GOOD["pair_estimates"]],
                    pair_reals=[-v for v in GOOD["pair_reals"]], best_real=-5.0)
    for estimate in (4.4, 5.6):
        high = _decide(estimate=estimate)
        low = _decide(estimate=-estimate, maximize=False, **mirrored)
        assert (high.fidelity, high.reason) == (low.fidelity, low.reason)


def test_top_fraction_is_an_optional_second_trigger():
    ranked = FidelitySettings(**{**SETTINGS.__dict__, "top_fraction": 0.5})
    decision = _decide(estimate=5.0, settings=ranked, pool_estimates=[1.0, 2.0, 6.0])
    assert decision.reason == "top_fraction" and decision.estimate_rank == pytest.approx(1 / 3)


@pytest.mark.parametrize("estimate", [None, float("nan"), float("inf")])
def test_no_estimate_runs_for_real(estimate):
    assert _decide(estimate=estimate).reason == "no_estimate"


def test_warm_up_until_enough_pairs():
    assert _decide(pair_estimates=[1.0, 2.0], pair_reals=[1.0, 2.0]).reason == "warm_up"


def test_bad_simulator_switches_to_real_and_recovers():
    bad = _decide(pair_estimates=[5.0, 4.0, 3.0, 2.0, 1.0])
    assert (bad.fidelity, bad.reason) == ("real", "simulator_error_high")
    assert bad.error.discordance == pytest.approx(1.0)
    # The reversed pairs slide out of the window once enough good pairs follow.
    estimates = [5.0, 4.0, 3.0, 2.0, 1.0] + [float(v) for v in range(1, 11)]
    reals = [1.0, 2.0, 3.0, 4.0, 5.0] + [float(v) for v in range(1, 11)]
    recovered = _decide(pair_estimates=estimates, pair_reals=reals, best_real=10.0)
    assert recovered.fidelity == "simulator"


def test_trust_returns_only_when_the_longer_window_agrees():
    hysteresis = FidelitySettings(**{**SETTINGS.__dict__, "trust_window": 20})
    reversed_pairs = ([float(v) for v in range(20, 0, -1)], [float(v) for v in range(1, 21)])
    right = [float(v) for v in range(1, 11)]
    # A bad stretch, then one window of right estimates: the last 10 pairs look fine...
    lucky = dict(pair_estimates=reversed_pairs[0] + right, pair_reals=reversed_pairs[1] + right,
                 best_real=20.0)
    assert _decide(**lucky).fidelity == "simulator"  # the recent window alone would trust it
    decision = _decide(settings=hysteresis, **lucky)
    assert decision.error.discordance == 0.0
    assert (decision.fidelity, decision.reason) == ("real", "simulator_error_high")
    assert decision.trust_error.n_pairs == 20 and decision.trust_error.discordance > 0.35
    # ...but only a recovery that fills the longer window wins trust back.
    recovered = dict(pair_estimates=reversed_pairs[0] + right * 2,
                     pair_reals=reversed_pairs[1] + right * 2, best_real=20.0)
    assert _decide(settings=hysteresis, **recovered).fidelity == "simulator"


def test_a_few_lucky_pairs_do_not_earn_trust_under_a_confidence_bound():
    # Six pairs, four of them nearly exact, two off by ~60%: the median error is 6%, but six
    # pairs cannot tell this simulator from one whose typical error is large.
    few = dict(pair_estimates=[1.0, 2.1, 3.7, 8.4, 27.0, 12.0],
               pair_reals=[1.0, 2.0, 4.0, 8.0, 16.0, 32.0], best_real=32.0)
    median_only = FidelitySettings(**{**SETTINGS.__dict__, "trust_window": 20})
    assert _decide(estimate=2.0, settings=median_only, **few).fidelity == "simulator"
    bounded = FidelitySettings(**{**median_only.__dict__, "trust_confidence": 0.9})
    decision = _decide(estimate=2.0, settings=bounded, **few)
    assert (decision.fidelity, decision.reason) == ("real", "simulator_error_high")
    bound = decision.trust_error.relative_error_bound
    assert decision.trust_error.relative_error < 0.1 and bound > 0.3
    # The same two outliers among twenty pairs leave the bound below the threshold.
    many = dict(pair_estimates=[1.0, 2.1, 3.7, 8.4] * 4 + [27.0, 12.0] + [1.0, 2.1],
                pair_reals=[1.0, 2.0, 4.0, 8.0] * 4 + [16.0, 32.0] + [1.0, 2.0], best_real=32.0)
    assert _decide(estimate=2.0, settings=bounded, **many).fidelity == "simulator"


def test_noisy_simulator_in_right_order_still_fails_on_relative_error():
    scattered = dict(pair_estimates=[0.5, 2.0, 4.5, 4.0, 9.0], pair_reals=[1.0, 2.0, 3.0, 4.0, 5.0])
    decision = _decide(**{**GOOD, **scattered})
    assert decision.reason == "simulator_error_high"
    assert decision.error.relative_error > 0.3


def test_near_ties_do_not_count_as_rank_errors():
    # Reals within 2% of each other: misordering them is harmless.
    close = dict(pair_estimates=[5.0, 4.9, 4.8, 4.7, 4.6], pair_reals=[4.9, 4.92, 4.94, 4.96, 4.98])
    assert _decide(**{**GOOD, **close}).error.discordance is None
    assert _decide(**{**GOOD, **close}).reason != "simulator_error_high"


def test_periodic_validation_by_trial_number():
    assert _decide(trial_number=20).reason == "periodic_validation"
    no_validation = FidelitySettings(**{**SETTINGS.__dict__, "validation_period": None})
    assert _decide(trial_number=20, settings=no_validation).reason == "not_promising"


def test_a_validation_slot_is_filled_once():
    # Slot 20..29: trial 23 validates while nothing ran for real since 20, not once 21 did.
    assert _decide(trial_number=23, last_real_number=19).reason == "periodic_validation"
    assert _decide(trial_number=23, last_real_number=21).reason == "not_promising"


def test_targeted_slots_validate_only_well_ranked_recent_estimates():
    targeted = FidelitySettings(**{**SETTINGS.__dict__, "validation_top": 0.5})
    recent = [1.0, 2.0, 3.0, 4.0, 4.2, 4.3, 4.5, 4.6]  # oldest first; window 10 sees them all
    poor, good = 2.5, 4.4  # neither could beat the best real value (5.0) once calibrated
    # Slot 30..39 is targeted (odd slot): a poorly ranked estimate leaves it open...
    for estimate, reason in ((poor, "not_promising"), (good, "periodic_validation")):
        decision = _decide(trial_number=31, estimate=estimate, pool_estimates=recent,
                           settings=targeted, last_real_number=29)
        assert decision.reason == reason
    # ...while slot 40..49 (even) stays blind: any estimate validates.
    blind = _decide(trial_number=41, estimate=poor, pool_estimates=recent, settings=targeted,
                    last_real_number=39)
    assert blind.reason == "periodic_validation"
    # Ranked against the recent estimates only: an old, better one does not push it out.
    old_and_recent = [9.0] * 30 + recent
    assert _decide(trial_number=31, estimate=good, pool_estimates=old_and_recent,
                   settings=targeted, last_real_number=29).reason == "periodic_validation"


def test_selection_aware_calibration_ignores_pairs_the_estimate_chose():
    # Blind pairs: estimates right. Pairs run because their estimate looked good: 25 % lucky.
    pairs = dict(pair_estimates=[1.0, 2.0, 3.0, 5.0, 6.25, 7.5, 8.75],
                 pair_reals=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], best_real=7.0)
    selected = [False, False, False, True, True, True, True]
    aware = FidelitySettings(**{**SETTINGS.__dict__, "selection_aware": True, "optimism": 0.0})
    plain = FidelitySettings(**{**SETTINGS.__dict__, "optimism": 0.0})
    # Calibrated on every pair, 7.2 becomes 7.2 * 0.8 = 5.76: pruned. On the blind ones: 7.2.
    assert _decide(estimate=7.2, settings=plain, pair_selected=selected, **pairs).fidelity == (
        "simulator")
    assert _decide(estimate=7.2, settings=aware, pair_selected=selected, **pairs).reason == (
        "could_beat_best")
    # Too few blind pairs (min_pairs 3): the usual calibration.
    few = [False, False, True, True, True, True, True]
    assert _decide(estimate=7.2, settings=aware, pair_selected=few, **pairs).fidelity == (
        "simulator")


def test_selection_free_scale():
    from autoscout_optuna.fidelity._decision import selection_free_scale

    selected = [False, False, False, True, True]
    scale = selection_free_scale([2.0, 2.0, 4.0, 1.0, 1.0], [1.0, 1.0, 2.0, 1.0, 1.0],
                                 selected, window=10, min_pairs=3, fallback=0.9)
    assert scale == pytest.approx(0.5)
    assert selection_free_scale([2.0, 2.0], [1.0, 1.0], [False, True], window=10, min_pairs=3,
                                fallback=0.9) == 0.9


def test_a_measured_structure_runs_for_real_while_the_simulator_is_short_of_measurement_grade():
    # 6.7 % calibrated error, the order right: trusted, but not as good as a measurement
    noisy = dict(pair_estimates=[1.0, 2.3, 2.8, 4.4, 4.8], pair_reals=[1.0, 2.0, 3.0, 4.0, 5.0])
    on = FidelitySettings(**{**SETTINGS.__dict__, "real_for_measured_structures": True})
    decision = _decide(estimate=2.0, settings=on, measured_structure=True, **{**GOOD, **noisy})
    assert (decision.fidelity, decision.reason) == ("real", "measured_structure")
    # a new structure is still judged by its estimate, and so is everything with the rule off
    assert _decide(estimate=2.0, settings=on, measured_structure=False,
                   **{**GOOD, **noisy}).reason == "not_promising"
    assert _decide(estimate=2.0, measured_structure=True,
                   **{**GOOD, **noisy}).reason == "not_promising"
    # a simulator as good as a measurement (right order, a constant factor) is trusted outright
    assert _decide(estimate=2.0, settings=on, measured_structure=True).reason == "not_promising"


def test_a_structure_whose_own_estimates_are_measurement_grade_is_judged_by_them():
    # wrong between structures (a bias per structure), right within this one: 30 % high on
    # every one of its runs (min_pairs = 3 here: two pairs tell nothing yet)
    noisy = dict(pair_estimates=[1.0, 2.3, 2.8, 4.4, 4.8], pair_reals=[1.0, 2.0, 3.0, 4.0, 5.0])
    on = FidelitySettings(**{**SETTINGS.__dict__, "real_for_measured_structures": True})
    biased = ([1.3, 1.56, 1.82, 2.08], [1.0, 1.2, 1.4, 1.6])
    scattered = ([1.3, 1.2, 2.0, 1.7], [1.0, 1.2, 1.4, 1.6])
    kwargs = dict(estimate=2.0, settings=on, measured_structure=True, **{**GOOD, **noisy})
    assert _decide(structure_pairs=biased, **kwargs).reason == "not_promising"
    assert _decide(structure_pairs=scattered, **kwargs).reason == "measured_structure"
    assert _decide(structure_pairs=(biased[0][:2], biased[1][:2]),
                   **kwargs).reason == "measured_structure"  # too few pairs to tell
