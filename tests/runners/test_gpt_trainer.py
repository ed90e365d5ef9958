"""The small-GPT trainer: corpus, argument parsing, a smoke run, and that it learns."""

from __future__ import annotations

import io
import re

import pytest

from autoscout_optuna.runners._data import load_corpus, unigram_bits_per_byte
from autoscout_optuna.runners.gpt import TrainConfig, parse_args, summary, train, validate

SUMMARY_KEYS = ("val_bpb", "tokens_per_s", "mfu", "peak_mem_mb", "first_step_s")


def test_stdlib_corpus_split_is_deterministic_and_the_baseline_is_sane():
    first, second = load_corpus(), load_corpus()
    assert first.digest == second.digest
    assert len(first.train) > 10 * len(first.val) / 2 > 0
    baseline = unigram_bits_per_byte(first)
    assert 3.0 < baseline < 6.0  # source text: far from uniform (8 bits), far from constant


def test_user_text_file_is_split_by_position(tmp_path):
    text = ("".join(chr(97 + i % 26) for i in range(9000)) + "Z" * 1000).encode()
    path = tmp_path / "text.txt"
    path.write_bytes(text)
    corpus = load_corpus(path, val_fraction=0.1)
    assert bytes(corpus.train) + bytes(corpus.val) == text
    assert bytes(corpus.val) == b"Z" * 1000
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(tmp_path / "missing.txt")


def test_command_line_parses_every_field_type():
    cfg = parse_args(["--time_budget", "3.5", "--n_layer=3", "--tf32", "true", "--data", "none",
                      "--dtype", "bf16"])
    assert (cfg.time_budget, cfg.n_layer, cfg.tf32, cfg.data, cfg.dtype) == (3.5, 3, True,
                                                                            None, "bf16")
    with pytest.raises(SystemExit, match="unknown option"):
        parse_args(["--no_such_knob", "1"])
    with pytest.raises(SystemExit, match="true/false"):
        parse_args(["--tf32", "yes"])


def test_config_is_validated():
    with pytest.raises(ValueError, match="total_batch"):
        validate(TrainConfig(total_batch=1000, device_batch=2, seq_len=256))
    with pytest.raises(ValueError, match="dtype"):
        validate(TrainConfig(dtype="fp8"))


def test_text_too_short_for_a_window_is_refused_before_training(tmp_path):
    # 6000 bytes leave a 600-byte validation split: a 1024-byte window used to fail indexing
    # in the evaluation, after the whole time budget was spent
    path = tmp_path / "text.txt"
    path.write_bytes(b"abcdefgh \n" * 600)
    out = io.StringIO()
    with pytest.raises(ValueError, match=r"validation split of .* 600 bytes.*seq_len"):
        train(TrainConfig(data=str(path), seq_len=1024, total_batch=1024, device_batch=1,
                          max_steps=1, n_layer=1, n_embd=64, threads=1), out=out)
    assert "tok/s" not in out.getvalue()  # refused before any training


def test_smoke_run_prints_progress_and_a_parsable_summary():
    out = io.StringIO()
    result = train(TrainConfig(max_steps=3, time_budget=120, total_batch=512, device_batch=1,
                               eval_tokens=512, n_layer=1, n_embd=64, threads=1), out=out)
    assert result.steps == 3 and not result.diverged
    assert result.tokens == 2 * 512  # the first step is not counted in the timed budget
    assert result.tokens_per_s > 0 and 0 < result.mfu
    assert result.peak_source == "measured"  # a CPU: no datasheet peak
    assert re.search(r"step 1 \| loss \S+ \| tok/s \S+", out.getvalue())
    block = summary(result)
    for key in SUMMARY_KEYS:
        match = re.search(rf"^{key}:\s*(\S+)", block, re.MULTILINE)
        assert match, key
        float(match.group(1))


@pytest.mark.slow
def test_trainer_learns_below_the_unigram_baseline():
    # a step cap instead of seconds, so a loaded machine changes the runtime, not the result
    result = train(TrainConfig(max_steps=60, time_budget=600, total_batch=1024, device_batch=4,
                               eval_tokens=2**13), out=io.StringIO())
    assert result.val_bpb < unigram_bits_per_byte(load_corpus()) - 0.1
