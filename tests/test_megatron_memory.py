"""MegatronMemoryEstimate: Megatron-LM's theoretical memory formula as a ``memory_estimate``."""

from __future__ import annotations

import doctest
import math
import pickle

import optuna
import pytest
from autoscout_optuna.studies import llm_training
from autoscout_optuna.studies._hardware import gpu_spec
from autoscout_optuna.studies._models import model_shape

from autoscout_optuna import (
    AutoScoutSampler,
    Infeasible,
    MegatronMemoryEstimate,
    _megatron_memory,
    studies,
)
from autoscout_optuna._objective import reference_objective
from autoscout_optuna._space import is_structural

LLAMA3_8B = dict(layers=32, hidden=4096, ffn_hidden=14336, vocab=128256, heads=32, kv_heads=8)
JOB = dict(seq_len=8192, global_batch=512, num_gpus=64, gpu_memory_gb=80)


def _for_preset(preset: str) -> MegatronMemoryEstimate:
    base = llm_training.PRESETS[preset]
    m = model_shape(base["model"])
    return MegatronMemoryEstimate(
        layers=m.layers, hidden=m.hidden, ffn_hidden=m.ffn, vocab=m.vocab, heads=m.heads,
        kv_heads=m.kv_heads, seq_len=base["seq_len"], global_batch=base["global_batch"],
        num_gpus=base["num_gpus"], gpu_memory_gb=gpu_spec(base["gpu"]).memory_gb,
    )


def test_the_docstring_example_runs():
    assert doctest.testmod(_megatron_memory).failed == 0


@pytest.mark.parametrize("preset", ["8b-64", "70b-512", "14b-a100-128"])
def test_it_says_what_the_training_study_s_formula_says_of_every_structure_drawn(preset):
    # The study's layouts and rules are Megatron-LM's; only the names of the knobs are ours.
    definition = studies.load("llm_training", preset=preset)
    estimate = _for_preset(preset)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    outcomes = set()
    for _ in range(300):
        trial = study.ask()
        try:
            definition.suggest(trial)
        except Infeasible:
            pass
        structure = {k: v for k, v in trial.params.items() if is_structural(trial.distributions[k])}
        expected = definition.memory_estimate(structure)
        assert estimate(structure) == expected, structure
        outcomes.add("refused" if expected == math.inf else "fits" if expected <= 1 else "oom")
        study.tell(trial, 0.0)
    assert outcomes == {"refused", "fits", "oom"}


def test_names_fixed_values_and_defaults():
    renamed = MegatronMemoryEstimate(
        **LLAMA3_8B, **JOB, param_names={"tp": "tensor_parallel", "micro_batch": "mbs"},
        fixed={"zero_stage": 1},
    )
    plain = MegatronMemoryEstimate(**LLAMA3_8B, **JOB)
    structure = {"tp": 2, "micro_batch": 1, "zero_stage": 1}
    assert renamed({"tensor_parallel": 2, "mbs": 1}) == plain(structure)
    # an unnamed knob takes Megatron-LM's default: no ZeRO, so every GPU holds the optimizer
    assert plain({"tp": 2, "micro_batch": 1}) > plain(structure)
    # more memory with a larger micro-batch, less with more sharding or full recomputation
    assert plain({**structure, "micro_batch": 2}) > plain(structure)
    assert plain({**structure, "tp": 4}) < plain(structure)
    assert plain({**structure, "recompute": "full"}) < plain(structure)
    assert plain({**structure, "recompute": "full", "recompute_layers": 8}) > plain(
        {**structure, "recompute": "full"})


def test_a_layout_megatron_refuses_is_infinite_and_a_missing_micro_batch_says_nothing():
    estimate = MegatronMemoryEstimate(**LLAMA3_8B, **JOB)
    assert estimate({"tp": 3, "micro_batch": 1}) == math.inf  # 32 heads do not split over 3
    assert estimate({"tp": 8, "pp": 16, "micro_batch": 1}) == math.inf  # 128 GPUs of 64
    assert estimate({"pp": 4, "vpp": 3, "micro_batch": 1}) == math.inf  # 32 layers over 12
    assert estimate({"micro_batch": 16}) == math.inf  # 16 x 64 sequences > a batch of 512
    assert estimate({"tp": 8, "pp": 16}) == math.inf  # refused whatever the micro-batch
    assert estimate({"tp": 2}) is None
    with pytest.raises(ValueError, match="zero_stage"):
        estimate({"micro_batch": 1, "zero_stage": 4})
    with pytest.raises(ValueError, match="recompute"):
        estimate({"micro_batch": 1, "recompute": True})


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"layers": 0}, "layers"),
        ({"layers": 32.5}, "layers"),
        ({"heads": 30}, "hidden"),
        ({"kv_heads": 5}, "kv_heads"),
        ({"gpu_memory_gb": 0}, "gpu_memory_gb"),
        ({"param_names": {"tensor_parallel": "tp"}}, "tensor_parallel"),
        ({"fixed": {"zero": 1}}, "zero"),
        # each of these made every call raise (the sampler warned once and ran without it)
        ({"gpu_memory_gb": math.inf}, "gpu_memory_gb"),  # every estimate read 0.0
        ({"fixed": {"zero_stage": 5}}, "zero_stage"),
        ({"fixed": {"zero_stage": True}}, "zero_stage"),
        ({"fixed": {"recompute": "bogus"}}, "recompute"),
        ({"fixed": {"tp": 0}}, "tp"),  # ZeroDivisionError
        ({"fixed": {"micro_batch": 0}}, "micro_batch"),  # ZeroDivisionError
        ({"fixed": {"pp": "2"}}, "pp"),
        ({"fixed": {"recompute_layers": -3}}, "recompute_layers"),
    ],
)
def test_bad_arguments_are_named(changes, match):
    with pytest.raises((TypeError, ValueError), match=match):
        MegatronMemoryEstimate(**{**LLAMA3_8B, **JOB, **changes})


def test_a_sampler_calibrates_it_end_to_end_and_it_pickles():
    definition = studies.load("llm_training", preset="70b-512")
    estimate = pickle.loads(pickle.dumps(_for_preset("70b-512")))
    study = optuna.create_study(direction="maximize",
                                sampler=AutoScoutSampler(seed=0, memory_estimate=estimate))
    study.optimize(reference_objective(definition, noise_seed=0), n_trials=30,
                   catch=(Infeasible,))
    expected = [t.user_attrs["mcts:feasibility"]["memory_use"] for t in study.trials
                if "memory_use" in t.user_attrs.get("mcts:feasibility", {})]
    assert expected  # MCTS read its planned paths' memory from the estimate
