"""GpuTelemetry: absent NVIDIA library reported, not a crash; samples summarized when present."""

from __future__ import annotations

import json
import types

import pytest

from autoscout_optuna.runners import GpuTelemetry, _telemetry


def test_missing_nvml_is_reported_as_unavailable(monkeypatch):
    def no_library():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(_telemetry, "_load_nvml", no_library)
    with GpuTelemetry(interval=0.01) as telemetry:
        pass
    summary = telemetry.summary()
    assert summary["available"] is False
    assert "ImportError" in summary["reason"]
    assert telemetry.samples == []


def test_this_machine_without_a_driver_does_not_crash():
    # nvidia-ml-py is installed but there is no libnvidia-ml here: nvmlInit raises
    with GpuTelemetry(interval=0.01) as telemetry:
        pass
    summary = telemetry.summary()
    json.dumps(summary)
    if not summary["available"]:
        assert "NVML unavailable" in summary["reason"]


def fake_nvml(power_fails: bool):
    def power(handle):
        if power_fails:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 250_000  # milliwatts

    return types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: f"gpu{index}",
        nvmlDeviceGetName=lambda handle: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30),
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=87),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetClockInfo=lambda handle, clock: 1980 if clock == 1 else 2619,
    )


@pytest.mark.parametrize("power_fails", [False, True])
def test_samples_are_summarized(monkeypatch, power_fails):
    monkeypatch.setattr(_telemetry, "_load_nvml", lambda: fake_nvml(power_fails))
    telemetry = GpuTelemetry(device_index=0, interval=0.01).start()
    telemetry.stop()
    summary = telemetry.summary()
    assert summary["available"] is True and summary["device"] == "NVIDIA H200"
    assert summary["samples"] >= 1
    assert summary["memory_used_mb_max"] == pytest.approx(3072.0)
    assert summary["utilization_pct_mean"] == pytest.approx(87.0)
    assert summary["sm_clock_mhz_max"] == pytest.approx(1980.0)
    assert ("power_w_mean" in summary) is not power_fails
    json.dumps(summary)


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="interval"):
        GpuTelemetry(interval=0)
    with pytest.raises(ValueError, match="device_index"):
        GpuTelemetry(device_index=-1)
