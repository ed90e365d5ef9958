"""MFU arithmetic on hand-computed cases, and the peak table picked by device name."""

from __future__ import annotations

import pytest

from autoscout_optuna.runners import flops_per_token, lookup_peak, mfu
from autoscout_optuna.runners._mfu import device_peak


def test_flops_per_token_by_hand():
    # 6 * 1000 weights + 12 * 2 layers * 64 width * 128 tokens = 6000 + 196608
    assert flops_per_token(1000, 2, 64, 128) == 202_608
    assert flops_per_token(10**6, 0, 0, 0) == 6e6


def test_mfu_by_hand():
    # 10k tok/s * 1 MFLOP/token = 10 GFLOP/s of a 100 GFLOP/s device
    assert mfu(1e4, 1e6, 1e11) == pytest.approx(0.1)
    # the practitioner's RTX 5090 case: 42.6% of 209.5 TFLOP/s bf16 dense
    peak = lookup_peak("NVIDIA GeForce RTX 5090", "bf16").flops
    assert peak == pytest.approx(209.5e12)
    assert mfu(0.426 * peak / 1e9, 1e9, peak) == pytest.approx(0.426)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1.0, 1.0, 0.0)


@pytest.mark.parametrize(
    "name, dtype, tflops",
    [
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A10", "bf16", 125.0),  # not the A100's figure
        ("NVIDIA A40", "fp32", 37.4),
        ("NVIDIA L40S", "bf16", 362.1),
        ("NVIDIA L4", "bf16", 121.0),  # not the L40S's figure
        ("NVIDIA GeForce RTX 4090", "fp16", 165.2),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
    ],
)
def test_peak_is_picked_by_device_name(name, dtype, tflops):
    peak = lookup_peak(name, dtype)
    assert peak.source == "table"
    assert peak.flops == pytest.approx(tflops * 1e12)


def test_unknown_device_or_unsupported_dtype_has_no_table_entry():
    assert lookup_peak("Some Future GPU", "bf16") is None
    assert lookup_peak("Tesla V100-SXM2-16GB", "bf16") is None
    with pytest.raises(ValueError, match="dtype"):
        lookup_peak("NVIDIA H200", "int8")


@pytest.mark.parametrize("name", [
    "NVIDIA GeForce RTX 5090 Laptop GPU",  # a GB203 at laptop clocks: about half the desktop's
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 3090 Ti",  # more SMs and clock than the 3090
    "NVIDIA GeForce RTX 4090 D",  # fewer SMs than the 4090
    "NVIDIA GeForce RTX 5090 D",
    "NVIDIA GeForce RTX 4080 SUPER",
])
def test_a_variant_of_a_listed_gpu_does_not_get_its_peak(name):
    # the first entry whose tokens all occur in the name won: a laptop RTX 5090 was scored
    # against the desktop card's 209.5 TFLOP/s, its MFU read about half of what it was
    assert lookup_peak(name, "bf16") is None
    assert lookup_peak("NVIDIA GeForce RTX 5090", "bf16").source == "table"


def test_a_mig_slice_does_not_get_the_whole_boards_peak():
    # torch names a slice after its board: a 1g slice has 1/7 of the SMs, so the board's
    # figure would make its MFU (and the study's expected tokens/s) off by ~7x
    assert lookup_peak("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16") is None
    assert lookup_peak("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16") is None
    assert lookup_peak("NVIDIA H100 80GB HBM3", "bf16").source == "table"


@pytest.mark.parametrize(
    "name, tflops",
    [("Tesla V100-SXM2-16GB", 125.0), ("Tesla T4", 65.0), ("NVIDIA H100 80GB HBM3", 989.4)],
)
def test_a_gpu_run_is_scored_against_the_gpus_fastest_half_precision(monkeypatch, name, tflops):
    # a V100 has no bf16 entry: its fp32 runs were scored against a measured (emulated) bf16
    # peak, below the fp32 table figure, so fp32 kept its own 15.7 TFLOP/s denominator
    import torch

    from autoscout_optuna.runners import _mfu

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(_mfu, "measure_peak_flops", lambda device, dtype, **kw: 14e12)
    for dtype, tf32 in (("fp32", False), ("fp32", True), ("fp16", False)):
        peak = _mfu.training_peak("cuda", dtype, tf32=tf32)
        assert (peak.flops, peak.source) == (pytest.approx(tflops * 1e12), "table")


def test_cpu_peak_is_measured_and_says_so():
    peak = device_peak("cpu", "fp32")
    assert peak.source == "measured"
    assert peak.flops > 1e8  # any CPU that runs this test does more than 0.1 GFLOP/s


@pytest.mark.parametrize("peaks, best", [
    ({"fp32": 9.6e10, "bf16": 2.2e11, "fp16": 3.2e9}, 2.2e11),  # avx512_bf16 (an EPYC here)
    ({"fp32": 9.6e10, "bf16": 5e9, "fp16": 3.2e9}, 9.6e10),  # half precision emulated
])
def test_a_cpu_run_is_scored_against_the_cpus_fastest_dtype(monkeypatch, peaks, best):
    # on an EPYC with avx512_bf16 an fp32 run read 72% MFU against fp32's measured peak while
    # a bf16 run trained 26% faster and read 39%: fp32 was never held to the bf16 peak
    from autoscout_optuna.runners import _mfu

    monkeypatch.setattr(_mfu, "measure_peak_flops", lambda device, dtype, **kw: peaks[dtype])
    for dtype in ("fp32", "bf16", "fp16"):
        peak = _mfu.training_peak("cpu", dtype)
        assert (peak.flops, peak.source) == (best, "measured"), dtype
