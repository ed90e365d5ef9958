"""The refine arm's successive budget over the top structures (pure: hand-made histories)."""

import dataclasses

import numpy as np
from optuna.distributions import CategoricalDistribution, FloatDistribution

from autoscout_optuna.samplers._autoscout import plan as planning
from autoscout_optuna.samplers._autoscout.reader import Seen, StudyDigest

DISTRIBUTIONS = {
    "layout": CategoricalDistribution(["a", "b", "c", "d"]),
    "x": FloatDistribution(0.0, 1.0),
}
PATIENCE = planning.PATIENCE_PER_KNOB  # one dense knob


def history_of(rows):
    """``rows``: (arm, layout, x, score) oldest first, score None: failed, "running": still
    running; returns (history, digest, space)."""
    digest, history = StudyDigest(), []
    for number, (arm, layout, x, score) in enumerate(rows):
        params = {"layout": layout, "x": x}
        kind = {None: "failed", "running": "pending"}.get(score, "real")
        seen = Seen(
            number=number, params=params, distributions=DISTRIBUTIONS, kind=kind,
            score=score if kind == "real" else None, user_attrs={},
            structure=(("layout", repr(layout)),),
            config=tuple(sorted((n, repr(v)) for n, v in params.items())), arm=arm,
        )
        if kind != "pending":  # the digest adds up finished trials only
            seen = dataclasses.replace(seen, gains=digest.add(seen))
        history.append(seen)
    return history, digest, planning.observed_space(history, digest)


def start():
    # Incumbent "a"; "b" is close behind at stage 0; "c" and "d" are far behind.
    return [("startup", "a", 0.5, 10.0), ("startup", "b", 0.5, 9.95),
            ("startup", "c", 0.5, 5.0), ("startup", "d", 0.5, 1.0)]


def choose(rows):
    history, digest, space = history_of(rows)
    return planning.refine_choice(history, digest, space, estimator="did"), digest, space


def test_incumbent_structure_is_refined_first():
    choice, digest, space = choose(start())
    structure, why = planning.refine_target(choice, digest, space)
    assert structure == {"layout": "a"}
    assert (why["rank"], why["stale"], why["patience"]) == (0, 0, PATIENCE)
    assert why["incumbent_structure"]


def test_a_close_runner_up_is_refined_once_the_incumbent_is_tuned_out():
    flat = [("refine", "a", 0.1 * i, 10.0) for i in range(PATIENCE)]
    choice, digest, space = choose(start() + flat)
    structure, why = planning.refine_target(choice, digest, space)
    assert structure == {"layout": "b"}
    assert why["rank"] == 1 and not why["incumbent_structure"]
    assert choice.stale < choice.patience  # the refine arm stays available


def test_far_structures_are_never_refined_and_the_arm_rests_when_the_top_is_tuned_out():
    flat_a = [("refine", "a", 0.1 * i, 10.0) for i in range(PATIENCE)]
    flat_b = [("refine", "b", 0.1 * i, 9.9) for i in range(PATIENCE)]
    choice, _, _ = choose(start() + flat_a + flat_b)
    # "c" (5.0) is third by potential but far below the incumbent: not worth tuning.
    assert choice.key == (("layout", "'a'"),)
    assert choice.stale >= choice.patience


def test_a_gain_gives_a_structure_back_its_patience():
    flat = [("refine", "a", 0.1 * i, 10.0) for i in range(PATIENCE - 1)]
    gain = [("refine", "a", 0.95, 10.5)]
    choice, _, _ = choose(start() + flat + gain)
    assert choice.key == (("layout", "'a'"),)
    assert choice.stale == 0


def test_failed_refinements_count_as_stale():
    failed = [("refine", "a", 0.1 * i, None) for i in range(PATIENCE)]
    choice, _, _ = choose(start() + failed)
    assert choice.key == (("layout", "'b'"),)


def test_no_choice_before_any_value():
    choice, _, _ = choose([("startup", "a", 0.5, None)])
    assert choice is None


def test_ties_in_potential_go_to_the_incumbent_structure_then_to_the_older_one():
    values = np.array([1.0, 2.0, 2.0, 2.0, 0.5, 2.5])
    assert planning._top_structures(values, 3, 3) == [5, 3, 1]
    assert planning._top_structures(values, 0, 4) == [5, 1, 2, 3]
    assert planning._top_structures(np.array([1.0]), 0, 3) == [0]


def test_stale_counts_of_the_ranked_structures_match_a_full_scan():
    rng = np.random.default_rng(5)
    def score():
        u = rng.random()
        return None if u < 0.1 else "running" if u < 0.2 else float(rng.normal(8.0, 2.0))

    rows = start() + [
        (str(rng.choice(["refine", "explore"])), str(rng.choice(list("abcd"))),
         float(rng.random()), score())
        for _ in range(120)
    ]
    history, digest, _ = history_of(rows)
    noise = digest.noise()
    full: dict = {}  # the scan without an early stop, over every structure
    gained: set = set()
    for obs in reversed(history):
        if obs.arm != "refine" or obs.structure in gained:
            continue
        gain = obs.gains.get("did")
        if obs.kind != "pending" and gain is not None and gain > noise:
            gained.add(obs.structure)
        else:
            full[obs.structure] = full.get(obs.structure, 0) + 1
    keys = list(digest.ledger.best)
    running = [obs for obs in history if obs.kind == "pending"]
    assert any(obs.arm == "refine" for obs in running)
    for wanted in (keys[:1], keys[1:3], keys):
        counts = planning._stale_counts(digest, running, "did", noise, wanted)
        assert counts == {k: full[k] for k in wanted if k in full}
        assert planning._stale_counts(digest, history, "did", noise, wanted) == counts


# -- the structure search settles before dense tuning starts ----------------------------------


def settled(rows, proposals=3):
    history, _, _ = history_of(rows)
    return planning.structure_settled(history, proposals)


def test_not_settled_before_any_real_value():
    assert not settled([("startup", "a", 0.5, None)] * 5)


def test_settles_after_enough_proposals_fail_to_take_the_lead():
    lead = [("startup", "a", 0.5, 10.0)]
    behind = [("explore", "b", 0.5, 9.0), ("explore", "c", 0.5, None)]
    assert not settled(lead + behind)
    assert settled(lead + behind + [("explore", "d", 0.5, 1.0)])


def test_a_new_lead_structure_restarts_the_count():
    rows = [("startup", "a", 0.5, 10.0)] + [("explore", "b", 0.5, 9.0)] * 3
    assert settled(rows)
    assert not settled(rows + [("explore", "c", 0.5, 11.0)])
    # the lead structure gaining again (a better dense setting) keeps the count
    assert settled(rows + [("explore", "a", 0.6, 10.5)])


def test_refinements_neither_count_nor_restart():
    rows = [("startup", "a", 0.5, 10.0), ("startup", "b", 0.5, 9.0)]
    rows += [("refine", "a", 0.1 * i, 10.0) for i in range(5)]
    assert not settled(rows)  # one proposal after the lead, refinements do not count
    # a runner-up refined past the incumbent does not reopen the structure search
    rows += [("explore", "c", 0.5, 1.0)] * 2 + [("refine", "b", 0.9, 12.0)]
    assert settled(rows)


def test_running_trials_do_not_count():
    rows = [("startup", "a", 0.5, 10.0)] + [("explore", "b", 0.5, "running")] * 5
    assert not settled(rows)


def test_the_shortcut_from_the_best_trial_agrees_with_the_full_walk():
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows = []
        for _ in range(int(rng.integers(1, 30))):
            arm = str(rng.choice(["startup", "explore", "refine"]))
            score = None if rng.random() < 0.2 else float(rng.integers(0, 12))
            rows.append((arm, str(rng.choice(list("abcd"))), 0.5, score))
        history, digest, _ = history_of(rows)
        for proposals in (1, 3, 10):
            assert planning.structure_settled(history, proposals) == planning.structure_settled(
                history, proposals, best=digest.best.get("real"))


def test_a_small_structure_space_settles_sooner():
    def space(*sizes):
        distributions = {f"s{i}": CategoricalDistribution(list(range(n)))
                         for i, n in enumerate(sizes)}
        distributions["x"] = FloatDistribution(0.0, 1.0)
        return planning.ObservedSpace(distributions, tuple(distributions)[:-1], ("x",))

    assert planning.settle_proposals(space(2)) == 1  # the one other structure
    assert planning.settle_proposals(space(3, 3)) == 8
    assert planning.settle_proposals(space(4, 3)) == planning.SETTLE_PROPOSALS
    assert planning.settle_proposals(space()) == 0  # no structure to wait for
    # with "a" in the lead of two structures, one proposal of "b" settles it
    history, _, _ = history_of([("startup", "a", 0.5, 10.0), ("explore", "b", 0.5, 9.0)])
    assert planning.structure_settled(history, planning.settle_proposals(space(2)))


def test_a_structure_estimated_once_is_looked_at_again_unless_the_estimate_was_measurement_grade():
    # "d" was seen only through one poor estimate; the other layouts were run for real
    from autoscout_optuna import _keys

    def with_one_estimate(detail):
        rows = start()[:3]
        history, digest, _ = history_of(rows)
        params = {"layout": "d", "x": 0.5}
        estimate = Seen(
            number=len(rows), params=params, distributions=DISTRIBUTIONS, kind="estimate",
            score=0.5, user_attrs={_keys.SIM_ERROR_DETAIL: detail},
            structure=(("layout", "'d'"),),
            config=tuple(sorted((n, repr(v)) for n, v in params.items())), arm="model",
        )
        estimate = dataclasses.replace(estimate, gains=digest.add(estimate))
        history.append(estimate)
        return history, planning.observed_space(history, digest)

    noisy = {"relative_error": 0.12, "discordance": 0.1}  # a noisy look: worth another
    exact = {"relative_error": 0.02, "discordance": 0.1}  # as good as a real run: tried
    proposals = {}
    for name, detail in (("noisy", noisy), ("exact", exact)):
        history, space = with_one_estimate(detail)
        proposal = planning.model_proposal(history, space, np.random.default_rng(0))
        proposals[name] = None if proposal is None else proposal.values
    assert proposals["noisy"] == {"layout": "d"}
    assert proposals["exact"] is None  # no untried structure left
