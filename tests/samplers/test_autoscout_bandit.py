import numpy as np
import pytest

from autoscout_optuna.samplers._autoscout.bandit import Pull, alternate, choose_arm
from autoscout_optuna.samplers._autoscout.startup import infer_conditions, least_covered


def _share(arm, pulls, n=400, **kwargs):
    wins = 0
    for i in range(n):
        choice, _, _ = choose_arm(["explore", "refine"], pulls, np.random.default_rng(i), **kwargs)
        wins += choice == arm
    return wins / n


def test_better_arm_is_chosen_more_often():
    pulls = [Pull("explore", -0.5, age=i) for i in range(10)]
    pulls += [Pull("refine", 0.4, age=i) for i in range(10)]
    assert _share("refine", pulls) > 0.9


def test_without_evidence_arms_are_balanced():
    share = _share("explore", [])
    assert 0.35 < share < 0.65


def test_discount_forgets_old_rewards():
    # Explore was great long ago, poor recently; a strong discount follows the recent evidence.
    pulls = [Pull("explore", 0.9, age=100 + i) for i in range(30)]
    pulls += [Pull("explore", -0.5, age=i) for i in range(5)]
    pulls += [Pull("refine", 0.0, age=i) for i in range(5)]
    assert _share("explore", pulls, discount=0.9) < _share("explore", pulls, discount=1.0)


def test_pending_trials_shrink_uncertainty_not_mean():
    pulls = [Pull("explore", 0.2), Pull("refine", 0.2)]
    _, _, calm = choose_arm(["explore", "refine"], pulls, np.random.default_rng(0))
    _, _, busy = choose_arm(
        ["explore", "refine"], pulls, np.random.default_rng(0), pending={"explore": 5}
    )
    assert busy["explore"].pulls == calm["explore"].pulls + 5
    assert busy["explore"].mean == calm["explore"].mean


def test_floor_rescues_a_starving_arm():
    pulls = [Pull("refine", 0.9, age=i) for i in range(20)]
    arm, reason, _ = choose_arm(
        ["explore", "refine"], pulls, np.random.default_rng(0), recent=["refine"] * 20, floor=0.1
    )
    assert arm == "explore"
    assert reason.startswith("floor")


def test_an_unfloored_arm_starves_unless_its_draw_wins():
    pulls = [Pull("refine", 0.9, age=i) for i in range(20)]
    arms = ["explore", "model", "refine"]
    recent = ["refine"] * 14 + ["explore"] * 6  # the model arm never ran, explore 30 %
    for seed in range(20):
        arm, reason, _ = choose_arm(arms, pulls, np.random.default_rng(seed), recent=recent,
                                    floor=0.3, unfloored=("model",))
        assert arm == "refine" and reason.startswith("thompson")
    # with the floor it would have been rescued
    arm, reason, _ = choose_arm(arms, pulls, np.random.default_rng(0), recent=recent, floor=0.3)
    assert arm == "model" and reason.startswith("floor")
    # the floor's bound counts only the arms it covers
    choose_arm(arms, pulls, np.random.default_rng(0), floor=0.5, unfloored=("model",))
    with pytest.raises(ValueError, match="floor"):
        choose_arm(arms, pulls, np.random.default_rng(0), floor=0.5)


def test_same_rng_same_choice():
    pulls = [Pull("explore", 0.1), Pull("refine", 0.05)]
    a = choose_arm(["explore", "refine"], pulls, np.random.default_rng(7))
    b = choose_arm(["explore", "refine"], pulls, np.random.default_rng(7))
    assert a[0] == b[0] and a[1] == b[1]


def test_invalid_arguments_are_named():
    with pytest.raises(ValueError, match="arms"):
        choose_arm([], [], np.random.default_rng(0))
    with pytest.raises(ValueError, match="discount"):
        choose_arm(["a"], [], np.random.default_rng(0), discount=0.0)


def test_alternate_takes_turns():
    assert [alternate(["explore", "refine"], i)[0] for i in range(4)] == [
        "explore", "refine", "explore", "refine"
    ]


def test_least_covered_fills_gaps_first():
    rng = np.random.default_rng(0)
    assert least_covered(["a", "b", "c"], ["a", "b", "a"], rng) == "c"
    picks = {least_covered([1, 2, 3], [], np.random.default_rng(i)) for i in range(30)}
    assert picks == {1, 2, 3}


def test_least_covered_tells_bool_from_int():
    assert least_covered([True, 1], [1, 1], np.random.default_rng(0)) is True


def test_infer_conditions_finds_parent():
    params = [
        {"parallel": "tp", "tp_size": 2, "lr": 0.1},
        {"parallel": "tp", "tp_size": 4, "lr": 0.2},
        {"parallel": "dp", "lr": 0.3},
        {"parallel": "pp", "stages": 2, "lr": 0.1},
    ]
    conditions = infer_conditions(params, ["parallel", "tp_size", "stages"])
    assert conditions["tp_size"] == {"parallel": ["tp"]}
    assert conditions["stages"] == {"parallel": ["pp"]}
    assert "lr" not in conditions


@pytest.mark.parametrize("seed", range(5))
def test_arm_statistics_are_the_discounted_sums_of_each_arms_pulls(seed):
    # reference: one loop over the pulls per arm, in their order (the floats must match exactly)
    rng = np.random.default_rng(seed)
    arms = ["explore", "refine", "model"]
    pulls = [Pull(str(rng.choice(arms + ["other"])), float(rng.normal()), float(rng.random()),
                  int(rng.integers(0, 60))) for _ in range(300)]
    _, _, stats = choose_arm(arms, pulls, np.random.default_rng(0), floor=0.0, discount=0.93)
    for arm in arms:
        mass = total = 0.0
        for pull in pulls:
            if pull.arm == arm:
                w = pull.weight * 0.93**pull.age
                mass += w
                total += w * pull.reward
        assert stats[arm].pulls == mass
        assert stats[arm].mean == total / (mass + 1.0)
