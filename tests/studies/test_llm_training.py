"""The 3D-parallel training study: conditional space, failures, evaluators, stored optimum."""

from __future__ import annotations

import pickle

import optuna
import pytest
from _sampling import (
    check_fixed_domains,
    check_seeded_noise,
    feasible_values,
    random_configs,
    simulator_agreement,
    suggest_fixed,
)  # tests/studies/
from autoscout_optuna.studies._training_model import reference_memory_gb

from autoscout_optuna import studies
from autoscout_optuna._enumerate import find_optimum
from autoscout_optuna._failure import Infeasible

llm_training = pytest.importorskip("autoscout_optuna.studies.llm_training")

DENSE = {"recompute_layers", "bucket_size_mb", "comm_sms"}
# A full, valid set of params for 8B on 64 GPUs; tests override single knobs.
BASE_PARAMS = dict(
    tp=2, pp=2, micro_batch=1, vpp=2, recompute="full", recompute_layers=8,
    sequence_parallel=True, zero_stage=1, overlap_grad_reduce=True, bucket_size_mb=100.0,
    comm_sms=16, cuda_graphs=False,
)


def _suggest_fixed(definition, **overrides):
    return suggest_fixed(definition, BASE_PARAMS, **overrides)


@pytest.fixture(scope="module")
def study_def():
    return studies.load("llm_training")


@pytest.fixture(scope="module")
def sample(study_def):
    return random_configs(study_def, 900)


def test_conditional_knobs_appear_only_under_their_parent_choice(sample):
    assert len(sample) > 300
    for params, config in sample:
        assert ("vpp" in params) == (config["pp"] > 1)
        assert ("recompute_layers" in params) == (config["recompute"] != "none")
        assert ("sequence_parallel" in params) == (config["tp"] > 1)
        assert ("zero_stage" in params) == (config["dp"] > 1)
        assert ("overlap_grad_reduce" in params) == (config["dp"] > 1)
        assert ("bucket_size_mb" in params) == bool(config["overlap_grad_reduce"])
        assert config["tp"] * config["pp"] * config["dp"] == config["num_gpus"]
    # Every conditional branch is visited both ways in a random sample.
    for name in ("vpp", "recompute_layers", "sequence_parallel", "bucket_size_mb"):
        present = [name in params for params, _ in sample]
        assert any(present) and not all(present)


def test_fixed_choices_remove_their_subtree(study_def):
    _, names = _suggest_fixed(study_def, pp=1, tp=1, recompute="none")
    assert not names & {"vpp", "sequence_parallel", "recompute_layers"}
    _, names = _suggest_fixed(study_def, tp=8, pp=8)  # dp == 1: no data-parallel knobs
    assert not names & {"zero_stage", "overlap_grad_reduce", "bucket_size_mb"}
    _, names = _suggest_fixed(study_def, overlap_grad_reduce=False)
    assert "bucket_size_mb" not in names and "zero_stage" in names


def test_known_oom_layout_fails_with_reason_oom(study_def):
    config, _ = _suggest_fixed(
        study_def, tp=1, pp=1, micro_batch=8, recompute="none", zero_stage=0
    )
    with pytest.raises(Infeasible) as failure:
        study_def.measure(config, None)
    assert failure.value.reason == "oom"


@pytest.mark.parametrize(
    "options, params",
    [
        ({}, dict(vpp=5)),  # 32 layers over pp*vpp = 10 stages
        ({"model": "qwen2.5-7b"}, dict(tp=8)),  # 4 KV heads over 8 ranks
        ({"global_batch": 96}, dict(tp=1, pp=1, micro_batch=2)),  # 96 % (2*64)
    ],
)
def test_indivisible_layouts_fail_while_suggesting(options, params):
    definition = studies.load("llm_training", **options)
    with pytest.raises(Infeasible) as failure:
        _suggest_fixed(definition, **params)
    assert failure.value.reason == "invalid_layout"


@pytest.mark.parametrize("preset", sorted(llm_training.PRESETS))
def test_expert_default_is_feasible_and_beaten_by_the_optimum(preset):
    definition = studies.load("llm_training", preset=preset)
    default_value = definition.measure(dict(definition.default_config), None)
    assert default_value > 0
    if definition.optimum is not None:
        assert definition.optimum >= default_value


def test_dense_at_defaults_suggests_no_dense_knob():
    definition = studies.load("llm_training", dense_at_defaults=True)
    for params, config in random_configs(definition, 200):
        assert not DENSE & set(params)
        assert config["comm_sms"] == llm_training.COMM_SMS_DEFAULT
        if config["overlap_grad_reduce"]:
            assert config["bucket_size_mb"] == llm_training.BUCKET_MB_DEFAULT


def test_fixed_option_pins_the_structure():
    pinned = dict(tp=2, pp=1, micro_batch=1, recompute="none", sequence_parallel=True,
                  zero_stage=1, overlap_grad_reduce=True, cuda_graphs=True)
    definition = studies.load("llm_training", fixed=pinned)
    sample = random_configs(definition, 30)
    assert len(sample) == 30
    for params, config in sample:
        assert set(params) == {"bucket_size_mb", "comm_sms"}
        assert {k: config[k] for k in pinned} == pinned
    assert definition.optimum is None  # only the stored combinations have one


def test_simulator_disagrees_with_reference_but_ranks_alike(study_def, sample):
    # Measured on this sample: Spearman ~0.67, median relative error ~20%, simulator
    # optimistic (ignores stage imbalance, launch overhead, logits memory). The bounds leave
    # room for model tweaks but fail if the two models become copies or unrelated.
    n_pairs, rho, error = simulator_agreement(study_def, sample)
    assert n_pairs >= 150
    assert 0.5 <= rho <= 0.95
    assert 0.05 <= error <= 0.5


def test_measurement_noise_is_seeded_and_about_two_and_a_half_percent(study_def):
    ratios = check_seeded_noise(study_def)
    assert 0.015 <= ratios.std() <= 0.035
    assert abs(ratios.mean()) < 0.01


@pytest.mark.parametrize("dense_at_defaults", [False, True])
def test_stored_optimum_beats_every_sampled_config_and_the_default(dense_at_defaults, sample):
    definition = studies.load("llm_training", dense_at_defaults=dense_at_defaults)
    assert definition.optimum is not None
    configs = sample if not dense_at_defaults else random_configs(definition, 600, seed=1)
    values = [value for _, value in feasible_values(definition, configs)]
    assert len(values) > 100
    assert definition.optimum >= max(values) * (1 - 1e-9)
    assert definition.optimum >= definition.measure(dict(definition.default_config), None)


def test_70b_preset_is_stored_and_bigger():
    small, big = studies.load("llm_training"), studies.load("llm_training", preset="70b-512")
    assert big.options["model"] == "llama3-70b" and big.options["num_gpus"] == 512
    # A model 9x bigger runs fewer tokens/s per GPU, even with the best layout.
    assert big.optimum is not None
    assert big.optimum / 512 < small.optimum / 64


@pytest.mark.parametrize("option, value", [("preset", "1t-9"), ("model", "gpt5"), ("gpu", "TPU")])
def test_unknown_options_name_the_argument(option, value):
    with pytest.raises(ValueError, match=option):
        studies.load("llm_training", **{option: value})


@pytest.mark.parametrize("options, message", [
    (dict(num_gpus=True), "num_gpus must be a positive int"),  # -o num_gpus=yes
    (dict(num_gpus=24), "no tp/pp/micro_batch layout"),  # 3 x dp never divides 512
    (dict(num_gpus=1), r"can run \(24 oom\)"),
    (dict(model="llama3-70b", num_gpus=8), "can run"),
    (dict(seq_len=10_000_000), "can run"),
    (dict(fixed={"foo": 1}), r"unknown knob\(s\) \['foo'\]"),
    (dict(fixed={"tp": 3}), "tp must be one of"),
    (dict(fixed={"tp": "2"}), "tp must be one of"),  # crashed mid-run: int % str
    (dict(fixed={"tp": True}), "tp must be one of"),
    (dict(fixed={"bucket_size_mb": 0.0}), "bucket_size_mb must be in"),  # ZeroDivisionError
    (dict(fixed={"comm_sms": 0}), "comm_sms must be in"),  # ZeroDivisionError mid-run
    (dict(fixed={"recompute_layers": 33}), "recompute_layers must be in"),
    (dict(fixed={"recompute": "bogus"}), "recompute must be one of"),
])
def test_bad_or_hopeless_options_are_refused_before_anything_runs(options, message):
    with pytest.raises(ValueError, match=message):
        studies.load("llm_training", **options)


# 8B on 8 H100 with tp=pp=1 and overlapped gradient reduction fixed: at this seq_len only
# gradient buckets under the 160 MB default leave room (every layout at 160 MB runs out).
BUCKET_EDGE = dict(num_gpus=8, seq_len=52600, fixed={"overlap_grad_reduce": True, "tp": 1, "pp": 1})


def test_a_setup_that_runs_only_with_small_buckets_is_not_refused():
    definition = studies.load("llm_training", **BUCKET_EDGE)
    config, _ = suggest_fixed(definition, dict(
        micro_batch=1, recompute="full", recompute_layers=32, zero_stage=3, bucket_size_mb=4.0,
        comm_sms=16, cuda_graphs=False))
    assert definition.measure(config, None) > 0
    with pytest.raises(Infeasible, match="oom"):
        definition.measure(dict(config, bucket_size_mb=llm_training.BUCKET_MB_DEFAULT), None)


def test_a_setup_that_runs_only_off_the_dense_defaults_is_refused_at_them():
    with pytest.raises(ValueError, match="can run"):
        studies.load("llm_training", dense_at_defaults=True, **BUCKET_EDGE)


def test_a_cluster_the_expert_recipe_does_not_fit_still_builds_its_study():
    # The recipe's TP8 x PP4 does not divide 16 GPUs (this raised Infeasible from definition,
    # a traceback in the CLI), but other layouts run: the study builds, without a default.
    definition = studies.load("llm_training", model="llama3-70b", gpu="H200", num_gpus=16)
    assert definition.default_config is None
    values = feasible_values(definition, random_configs(definition, 200))
    assert values


@pytest.mark.parametrize("preset", sorted(llm_training.PRESETS))
def test_the_knobs_the_space_suggests_are_those_fixed_is_checked_against(preset):
    options = llm_training.PRESETS[preset]
    check_fixed_domains(
        "llm_training", lambda trial: llm_training.suggest_config(trial, **options),
        llm_training.knob_domains(options["model"]), preset=preset)


def test_stored_structural_optimum_is_what_enumeration_finds():
    definition = studies.load("llm_training", dense_at_defaults=True)
    value, config = find_optimum(definition)
    assert value == pytest.approx(definition.optimum, rel=1e-9)
    assert definition.measure(config, None) == pytest.approx(value, rel=1e-12)


@pytest.mark.slow
def test_stored_optimum_is_what_enumeration_finds():
    """The full space (dense knobs on a 5-point grid, then refined): ~30 s of one core."""
    definition = studies.load("llm_training")
    value, config = find_optimum(definition)
    assert value == pytest.approx(definition.optimum, rel=1e-9)
    assert definition.measure(config, None) == pytest.approx(value, rel=1e-12)


def test_definition_pickles_for_spawned_benchmark_workers():
    definition = studies.load("llm_training", dense_at_defaults=True)
    copy = pickle.loads(pickle.dumps(definition))
    assert copy.optimum == definition.optimum
    config = copy.suggest(optuna.trial.FixedTrial(dict(BASE_PARAMS)))
    assert copy.measure(config, None) == definition.measure(config, None)


@pytest.mark.parametrize("make_objective", ["reference_objective", "simulator_objective"])
def test_objectives_record_a_layout_that_fails_while_suggesting(make_objective):
    # The reason shows in optuna-dashboard and trials_dataframe, and a rule broken after the
    # last structural choice feeds the samplers' rule patterns: the CLI's objectives must
    # record it also when the layout breaks before any measurement starts.
    from autoscout_optuna import _objective

    definition = studies.load("llm_training")
    study = optuna.create_study(direction=definition.direction)
    study.enqueue_trial({**BASE_PARAMS, "vpp": 5})  # 32 layers over pp*vpp = 10 stages
    objective = getattr(_objective, make_objective)(definition)
    study.optimize(objective, n_trials=1, catch=(Infeasible,))
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["failure_reason"] == "invalid_layout"
    assert "pp*vpp=10" in trial.user_attrs["failure_detail"]


@pytest.mark.parametrize("make_objective", ["reference_objective", "from_definition"])
def test_objectives_record_the_peak_memory_a_real_run_would_report(make_objective):
    # A trial that ran reports its peak over the GPU's capacity (the samplers' memory model
    # learns from it); one that ran out of memory reports only its reason, as a real OOM does.
    from autoscout_optuna import _objective, fidelity

    definition = studies.load("llm_training")
    study = optuna.create_study(direction=definition.direction)
    fits = dict(BASE_PARAMS)
    too_big = {**BASE_PARAMS, "tp": 1, "pp": 1, "micro_batch": 8, "recompute": "none",
               "zero_stage": 0}
    for params in (fits, too_big):
        study.enqueue_trial({k: v for k, v in params.items()
                             if not (params["pp"] == 1 and k == "vpp")
                             and not (params["tp"] == 1 and k == "sequence_parallel")
                             and not (params["recompute"] == "none" and k == "recompute_layers")})
    if make_objective == "reference_objective":
        objective = _objective.reference_objective(definition)
    else:  # every trial runs for real: no pruner trusts an estimate
        objective = fidelity.from_definition(definition, use_ensemble=False)
    study.optimize(objective, n_trials=2, catch=(Infeasible,))
    ran, failed = study.trials
    assert ran.state == optuna.trial.TrialState.COMPLETE
    config = definition.suggest(optuna.trial.FixedTrial(ran.params))
    expected = reference_memory_gb(config) / 80.0  # an H100's 80 GB
    assert ran.user_attrs["memory_use"] == pytest.approx(expected)
    assert 0.0 < ran.user_attrs["memory_use"] <= 1.0
    assert failed.state == optuna.trial.TrialState.FAIL
    assert failed.user_attrs["failure_reason"] == "oom"
    assert "memory_use" not in failed.user_attrs


def test_memory_estimate_is_a_formula_not_the_reference():
    # What the samplers' memory_estimate gets: the structure's params, dense knobs left out.
    definition = studies.load("llm_training")
    structure = {k: v for k, v in BASE_PARAMS.items() if k not in DENSE}
    estimate = definition.memory_estimate(structure)
    config = definition.suggest(optuna.trial.FixedTrial(dict(BASE_PARAMS)))
    reference = reference_memory_gb(config) / 80.0
    assert 0.0 < estimate < 1.0
    assert estimate != pytest.approx(reference, rel=0.01)  # it leaves terms out, by design
    # heavier structures are estimated heavier
    assert definition.memory_estimate({**structure, "micro_batch": 4}) > estimate
    assert definition.memory_estimate({**structure, "zero_stage": 0}) > estimate
    # a layout Megatron-LM would refuse cannot run at all; a missing param: no estimate
    assert definition.memory_estimate({**structure, "vpp": 5}) == float("inf")
    assert definition.memory_estimate({"tp": 2}) is None
    copy = pickle.loads(pickle.dumps(definition))  # the benchmark's spawned workers
    assert copy.memory_estimate(structure) == estimate
