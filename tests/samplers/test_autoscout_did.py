import math

import pytest

from autoscout_optuna.samplers._autoscout.did import (
    FAILURE_REWARD,
    ArmOutcome,
    arm_rewards,
    luck_allowance,
    pooled_noise,
    score_scale,
    structure_potential,
)


def test_startup_trials_get_no_reward():
    outcomes = [ArmOutcome("startup", "A", 1.0), ArmOutcome("startup", "B", 2.0)]
    assert arm_rewards(outcomes) == [None, None]


def test_failed_trial_penalizes_its_arm():
    outcomes = [ArmOutcome("startup", "A", 1.0), ArmOutcome("explore", "B", None)]
    assert arm_rewards(outcomes)[1] == FAILURE_REWARD < 0


def test_good_structure_is_not_sunk_by_a_tuned_incumbent():
    # Structure A: first 1.0, tuned by refinement to 3.0. New structure B scores 1.5: below the
    # tuned incumbent, but above A at the same stage of tuning (its first evaluation).
    outcomes = [
        ArmOutcome("startup", "A", 1.0),
        ArmOutcome("refine", "A", 2.0),
        ArmOutcome("refine", "A", 3.0),
        ArmOutcome("explore", "B", 1.5),
    ]
    assert arm_rewards(outcomes, estimator="did")[3] > 0
    assert arm_rewards(outcomes, estimator="naive")[3] == 0


def test_refinement_is_not_credited_with_a_lucky_structure():
    # B is much better than A. A step on B that makes B worse earns nothing, even though it is
    # far above A; a step that improves A earns, even though A stays below B.
    outcomes = [
        ArmOutcome("startup", "A", 1.0),
        ArmOutcome("explore", "B", 5.0),
        ArmOutcome("refine", "A", 1.1),
        ArmOutcome("refine", "B", 4.5),
    ]
    rewards = arm_rewards(outcomes, estimator="did")
    assert rewards[2] > 0
    assert rewards[3] == 0
    assert arm_rewards(outcomes, estimator="naive")[2] == 0


def test_explore_on_a_known_structure_is_not_credited_with_copied_tuning():
    # A is tuned from 1.0 to 3.0. B was met once at 1.2; an explore trial brings A's tuned
    # dense values to B (2.5): far above B's own best, but below A at the same dense values.
    # A refinement of B to the same score is B's own gain and earns.
    history = [
        ArmOutcome("startup", "A", 1.0),
        ArmOutcome("startup", "B", 1.2),
        ArmOutcome("refine", "A", 3.0),
    ]
    explore = arm_rewards([*history, ArmOutcome("explore", "B", 2.5)])[-1]
    refine = arm_rewards([*history, ArmOutcome("refine", "B", 2.5)])[-1]
    beyond = arm_rewards([*history, ArmOutcome("explore", "B", 3.5)])[-1]
    assert explore == 0
    assert refine > 0
    assert beyond > 0


def test_gains_within_measurement_noise_earn_nothing():
    outcomes = [ArmOutcome("startup", "A", 10.0), ArmOutcome("refine", "A", 10.5)]
    assert arm_rewards(outcomes, noise=0.0)[1] > 0
    assert arm_rewards(outcomes, noise=1.0)[1] == 0


def test_rewards_bounded_and_scale_invariant():
    base = [
        ArmOutcome("startup", "A", 1.0),
        ArmOutcome("refine", "A", 4.0),
        ArmOutcome("explore", "B", -3.0),
        ArmOutcome("explore", "C", 9.0),
        ArmOutcome("refine", "C", None),
    ]
    scaled = [ArmOutcome(o.arm, o.structure, None if o.score is None else o.score * 1000)
              for o in base]
    r1, r2 = arm_rewards(base), arm_rewards(scaled)
    for a, b in zip(r1, r2, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert -1 <= a < 1
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_potential_favours_a_structure_that_beat_the_incumbent_at_the_same_stage():
    outcomes = [
        ArmOutcome("startup", "A", 1.0),
        ArmOutcome("refine", "A", 2.0),
        ArmOutcome("refine", "A", 3.0),  # A gained 2.0 by tuning
        ArmOutcome("explore", "B", 2.5),  # B, untuned, is 1.5 above untuned A
    ]
    potential = structure_potential(outcomes)
    assert potential["A"] == 3.0
    assert potential["B"] == pytest.approx(4.5)
    assert structure_potential(outcomes, estimator="naive")["B"] == 2.5
    # Measurement noise discounts the incumbent's gain (the best of many is lucky).
    assert structure_potential(outcomes, noise=1.0)["B"] == pytest.approx(2.5)


def test_pooled_noise():
    assert pooled_noise([[1.0], [2.0]]) == 0.0
    assert pooled_noise([[1.0, 3.0], [5.0, 5.0]]) == pytest.approx(math.sqrt(2.0 / 2))


def test_score_scale_never_zero():
    assert score_scale([]) == 1.0
    assert score_scale([2.0, 2.0, 2.0]) > 0


def test_unknown_estimator_is_rejected():
    with pytest.raises(ValueError, match="estimator"):
        arm_rewards([], estimator="magic")
    with pytest.raises(ValueError, match="estimator"):
        structure_potential([], estimator="magic")


def test_real_values_take_precedence_over_estimates_of_a_structure():
    from autoscout_optuna.samplers._autoscout.did import Ledger

    ledger = Ledger()
    ledger.add(ArmOutcome("startup", "A", 1.0))
    ledger.add(ArmOutcome("explore", "B", 3.0, estimate=True))  # a lucky estimate
    assert ledger.incumbent == "B" and ledger.best["B"] == 3.0
    ledger.add(ArmOutcome("refine", "B", 1.2))  # its first real value replaces the estimate
    assert (ledger.first["B"], ledger.best["B"]) == (1.2, 1.2)
    assert ledger.incumbent == "B"
    ledger.add(ArmOutcome("refine", "B", 5.0, estimate=True))  # measured: estimates ignored
    assert ledger.best["B"] == 1.2
    ledger.add(ArmOutcome("refine", "B", 1.5))
    assert (ledger.first["B"], ledger.best["B"]) == (1.2, 1.5)
    ledger.add(ArmOutcome("explore", "C", 0.5))
    ledger.add(ArmOutcome("refine", "B", 0.1))
    assert ledger.incumbent == "B"


def test_luck_allowance_grows_with_the_draws_that_could_have_been_the_best():
    assert luck_allowance([5.0], noise=1.0) == 0.0
    two = luck_allowance([4.0, 5.0], noise=1.0)
    ten = luck_allowance([4.2 + 0.08 * i for i in range(10)] + [5.0], noise=1.0)
    assert 0.5 < two < 0.7
    assert 1.5 < ten < 1.7
    # Scores far below the best could not have been it by luck: they add nothing.
    assert luck_allowance([0.0, 0.5, 1.0, 4.0, 5.0], noise=1.0) == pytest.approx(two)


def test_potential_discounts_a_best_of_many_noisy_measurements():
    # A measured 8 times at about one level: its best is the luckiest draw. B, measured once
    # below that best, ranks above A once the luck is discounted.
    a_scores = [10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 10.9]
    outcomes = [ArmOutcome("startup", "A", a_scores[0])]
    outcomes += [ArmOutcome("refine", "A", v) for v in a_scores[1:]]
    outcomes.append(ArmOutcome("model", "B", 10.3))
    assert structure_potential(outcomes, noise=0.0)["A"] == 10.9  # no noise, no luck
    noisy = structure_potential(outcomes, noise=0.5)
    luck = luck_allowance(a_scores, 0.5)
    assert 0.6 < luck < 0.8
    assert noisy["A"] == pytest.approx(10.9 - luck)
    assert noisy["B"] == 10.3  # measured once: no luck to discount, no gain beyond the noise
    assert noisy["A"] < noisy["B"]
    assert structure_potential(outcomes, estimator="naive", noise=0.5)["A"] == 10.9


def test_estimates_carry_no_luck_allowance():
    # Only real scores are discounted (an estimate-only structure keeps its best estimate).
    outcomes = [ArmOutcome("startup", "A", 3.0), ArmOutcome("refine", "A", 3.1),
                ArmOutcome("model", "C", 2.0, estimate=True),
                ArmOutcome("model", "C", 2.9, estimate=True)]
    assert structure_potential(outcomes, noise=0.2)["C"] == 2.9
