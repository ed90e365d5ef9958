"""The study note and plot artifacts that make optuna-dashboard explain the search."""

from __future__ import annotations

import optuna
import pytest
from optuna.artifacts import get_all_artifact_meta
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from optuna_dashboard import get_note

from autoscout_optuna import _dashboard

DISTS = {"layout": CategoricalDistribution(["flat", "tree"]), "x": FloatDistribution(0.0, 1.0)}


def _trial(state, value=None, *, estimate=None, arm=None, order=None, x=0.5, layout="flat"):
    attrs = {}
    if arm is not None:
        attrs["autoscout:arm"] = arm
    if order is not None:
        attrs["mcts:order"] = order
    return create_trial(
        state=state,
        value=value,
        params={"layout": layout, "x": x},
        distributions=DISTS,
        intermediate_values={} if estimate is None else {0: estimate},
        user_attrs=attrs,
    )


def _study(tmp_path, direction="maximize"):
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / f'{direction}.db'}", study_name="note-test",
        direction=direction,
    )
    trials = [
        _trial(TrialState.COMPLETE, 1.0, estimate=1.1, arm="startup", order=["layout", "x"]),
        _trial(TrialState.COMPLETE, 2.0, estimate=1.5, arm="explore", order=["layout", "x"],
               layout="tree", x=0.9),
        _trial(TrialState.PRUNED, estimate=0.7, arm="explore", order=["x", "layout"]),
        _trial(TrialState.PRUNED, estimate=0.6, arm="refine"),
        _trial(TrialState.FAIL, arm="refine"),
        _trial(TrialState.COMPLETE, 1.5, arm="refine", x=0.7),
    ]
    for trial in trials:
        study.add_trial(trial)
    return study


def test_summary_counts_pairs_and_arms(tmp_path):
    summary = _dashboard.summarize(_study(tmp_path))
    assert (summary.n_trials, summary.real, summary.simulated, summary.failed) == (6, 3, 2, 1)
    assert summary.best_value == 2.0 and summary.best_number == 1
    assert summary.best_params == {"layout": "tree", "x": 0.9}
    assert summary.arms["explore"] == {"trials": 2, "real": 1, "simulated": 1, "failed": 0,
                                       "best": 2.0}
    assert summary.arms["refine"]["failed"] == 1 and summary.arms["refine"]["best"] == 1.5
    # only trials with both a step-0 estimate and a real value are pairs
    assert [n for n, _ in summary.simulator_errors] == [0, 1]
    assert summary.simulator_errors[0][1] == pytest.approx(0.1)
    assert summary.simulator_errors[1][1] == pytest.approx(0.25)


def test_minimize_picks_the_lowest_real_value(tmp_path):
    summary = _dashboard.summarize(_study(tmp_path, direction="minimize"))
    assert summary.best_value == 1.0 and summary.best_number == 0
    assert summary.arms["refine"]["best"] == 1.5


def test_gain_over_default_in_both_directions(tmp_path):
    study = _study(tmp_path)
    study.set_user_attr(_dashboard.DEFAULT_VALUE_KEY, 0.5)
    assert _dashboard.summarize(study).gain_over_default == pytest.approx(4.0)
    low = _study(tmp_path, "minimize")
    low.set_user_attr(_dashboard.DEFAULT_VALUE_KEY, 3.0)
    assert _dashboard.summarize(low).gain_over_default == pytest.approx(3.0)


def test_note_explains_best_config_arms_and_simulator(tmp_path):
    study = _study(tmp_path)
    study.set_user_attr(_dashboard.METRIC_KEY, "tokens/s")
    study.set_user_attr(_dashboard.DEFAULT_VALUE_KEY, 1.0)
    text = _dashboard.note_markdown(_dashboard.summarize(study))
    assert "## AutoScout: note-test" in text
    assert "**2 tokens/s** (trial #1)" in text and "gain **2.00x**" in text
    assert "| layout | tree |" in text and "| x | 0.9 |" in text
    assert "| explore | 2 | 1 | 1 | 0 | 2 |" in text
    assert "| refine | 3 | 1 | 1 | 1 | 1.5 |" in text
    assert "Trials saved by simulators: 2 of 6 (33%)" in text
    assert "17.5% over 2 trials" in text  # median of 10% and 25%


def test_note_of_a_study_without_real_runs(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'e.db'}")
    study.add_trial(_trial(TrialState.PRUNED, estimate=0.3))
    text = _dashboard.note_markdown(_dashboard.summarize(study))
    assert "No real run has completed yet." in text
    assert "| (none) | 1 | 0 | 1 | 0 | - |" in text


def test_publish_saves_note_and_linked_plots_and_reuses_artifact_ids(tmp_path):
    study = _study(tmp_path)
    store_dir = tmp_path / "artifacts"
    text = _dashboard.publish(study, artifact_dir=store_dir)
    assert get_note(study) == text
    metas = get_all_artifact_meta(study)
    assert sorted(m.filename for m in metas) == [
        "best_so_far_by_arm.png", "feature_order.png", "simulator_error.png"]
    for meta in metas:
        assert f"/artifacts/{study._study_id}/{meta.artifact_id}" in text
        assert (store_dir / meta.artifact_id).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A later update rewrites the same artifacts instead of piling up copies.
    study.add_trial(_trial(TrialState.COMPLETE, 3.0, arm="refine", x=0.95))
    text2 = _dashboard.publish(study, artifact_dir=store_dir)
    assert {m.artifact_id for m in get_all_artifact_meta(study)} == {m.artifact_id for m in metas}
    assert "**3** (trial #6)" in text2 and get_note(study) == text2


def test_only_plots_with_data_are_drawn(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'p.db'}")
    study.add_trial(_trial(TrialState.COMPLETE, 1.0))
    written = _dashboard.render_plots(study, tmp_path / "plots")
    assert list(written) == ["Best so far by arm"]  # no estimates, no feature orders
    assert _dashboard.render_plots(optuna.create_study(), tmp_path / "none") == {}


def test_gain_compares_noiseless_values_when_the_study_records_them(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'n.db'}", direction="maximize")
    lucky = _trial(TrialState.COMPLETE, 2.2)  # measured with noise; truly worth 2.0
    lucky.set_user_attr("true_value", 2.0)
    study.add_trial(lucky)
    study.set_user_attr(_dashboard.DEFAULT_VALUE_KEY, 1.0)
    summary = _dashboard.summarize(study)
    assert summary.best_value == 2.2 and summary.best_true_value == 2.0
    assert summary.gain_over_default == pytest.approx(2.0)
    assert "(trial #0, noiseless 2)" in _dashboard.note_markdown(summary)


def test_without_a_separate_measurement_the_default_comes_from_its_trial():
    marked = {"autoscout:default_config": True}
    lost = create_trial(state=TrialState.FAIL, params={"layout": "flat", "x": 0.5},
                        distributions=DISTS, user_attrs=marked)
    rerun = _trial(TrialState.COMPLETE, 1.25, x=0.5)
    others = [_trial(TrialState.COMPLETE, 3.0, x=0.9), _trial(TrialState.COMPLETE, 1.0, x=0.5,
                                                               layout="tree")]
    # Its worker died, and the sampler re-proposed the same config later: that run counts.
    assert _dashboard.default_trial_value([lost, *others, rerun]) == 1.25
    ran = create_trial(state=TrialState.COMPLETE, value=1.5, params={"layout": "flat", "x": 0.5},
                       distributions=DISTS, user_attrs={**marked, "true_value": 1.4})
    assert _dashboard.default_trial_value([ran, *others]) == 1.4  # noiseless where recorded
    assert _dashboard.default_trial_value([lost, *others]) is None  # no real run of it yet
    assert _dashboard.default_trial_value(others) is None  # none was queued


def test_the_config_to_ship_leaves_out_a_pin_its_structure_never_asks():
    # --fix vpp=2: a pp=1 config never asks vpp and runs vpp=1; shipping {pp: 1, vpp: 2}
    # claimed a config that did not run (and one Megatron-LM refuses)
    from autoscout_optuna import studies
    from autoscout_optuna._keys import PINS_UNUSED, STUDY_OPTIONS
    from autoscout_optuna._objective import reference_objective

    definition = studies.load("llm_training", fixed={"vpp": 2})
    study = optuna.create_study(direction=definition.direction)
    study.set_user_attr(STUDY_OPTIONS, {"fixed": {"vpp": 2}})
    layout = dict(tp=2, micro_batch=1, recompute="none", sequence_parallel=True, zero_stage=1,
                  overlap_grad_reduce=False, comm_sms=16, cuda_graphs=False)
    study.enqueue_trial(dict(layout, pp=1))
    study.enqueue_trial(dict(layout, pp=2))
    study.optimize(reference_objective(definition, noise_seed=None), n_trials=2)
    flat, piped = study.trials
    assert flat.user_attrs[PINS_UNUSED] == ["vpp"] and PINS_UNUSED not in piped.user_attrs
    summary = _dashboard.summarize(study)
    assert summary.pinned == {"vpp": 2}
    assert summary.best_number == flat.number  # pp=1 is the faster: noiseless, measured
    ship = summary.ship_params
    assert ship == {**layout, "pp": 1}
    record = summary.to_record()
    assert record["ship"]["params"] == ship and record["pinned"] == {"vpp": 2}
    # the summary says where the pin went rather than drop it without a word
    from autoscout_optuna._progress import summary_text

    assert "pinned but not asked by this config's structure: vpp=2" in summary_text(study)


def test_a_study_with_every_knob_pinned_ships_its_pins():
    # one config measured (every knob pinned, e.g. to confirm it): its trials have no params,
    # and the config to ship was empty
    from autoscout_optuna._keys import STUDY_OPTIONS

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(STUDY_OPTIONS, {"fixed": {"tp": 4, "cuda_graphs": False}})
    study.add_trial(create_trial(value=2.0, params={}, distributions={}))
    summary = _dashboard.summarize(study)
    assert summary.ship_params == {"tp": 4, "cuda_graphs": False}
    assert summary.to_record()["ship"]["params"] == {"tp": 4, "cuda_graphs": False}
    empty = optuna.create_study(direction="maximize")
    empty.set_user_attr(STUDY_OPTIONS, {"fixed": {"tp": 4}})
    assert _dashboard.summarize(empty).ship_params == {}  # no run: nothing to ship


def test_the_best_runs_mfu_reads_as_a_percentage():
    # "0.3586 MFU" beside "22,810 tokens/s": MFU is a share, and everywhere else a percentage
    from autoscout_optuna._progress import summary_text

    study = optuna.create_study(direction="minimize")
    study.add_trial(create_trial(value=3.7, params={}, distributions={},
                                 user_attrs={"tokens_per_s": 22810.3, "mfu": 0.3586}))
    assert "best run           22,810 tokens/s, 35.9% MFU" in summary_text(study)


def test_the_failed_count_says_how_many_trials_never_ran():
    # two workers confirming at once retire duplicates and stop search trials unrun; a Ctrl-C
    # stops a trial: all of them counted as "failed" configs, with nothing saying so
    from autoscout_optuna._keys import FAILURE_REASON
    from autoscout_optuna._progress import summary_text

    study = optuna.create_study(direction="maximize")
    study.add_trial(create_trial(value=2.0, params={}, distributions={}))
    for reason in ("oom", "duplicate_confirmation", "confirmation_queue_empty", "interrupted"):
        study.add_trial(create_trial(state=optuna.trial.TrialState.FAIL,
                                     user_attrs={FAILURE_REASON: reason}))
    summary = _dashboard.summarize(study)
    assert summary.failed == 4 and summary.never_run == 3
    assert summary.to_record()["trials"]["never_run"] == 3
    assert "failed             4 (" in summary_text(study)
    assert "; 3 of them never ran (interrupted, a dead worker's or a duplicate)" in \
        summary_text(study)
