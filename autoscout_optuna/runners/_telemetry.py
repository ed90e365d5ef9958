"""GPU telemetry during a real trial: memory used, utilization, power, clocks (via pynvml).

A background thread samples NVML every ``interval`` seconds. Without NVIDIA's library or
driver (a CPU machine, a laptop, a container without the driver) the sampler reports itself
unavailable, with the reason, and records nothing: never a crash.
"""

from __future__ import annotations

import threading
import time
from typing import Any

FIELDS = ("memory_used_mb", "utilization_pct", "power_w", "sm_clock_mhz", "mem_clock_mhz")


def _load_nvml() -> Any:
    import pynvml  # from the nvidia-ml-py package

    return pynvml


class GpuTelemetry:
    """Sample one GPU in a background thread while a trial runs.

    Example:
        >>> with GpuTelemetry(device_index=0, interval=0.5) as telemetry:
        ...     pass  # run the job
        >>> summary = telemetry.summary()  # {"available": False, "reason": ...} without NVML
        >>> "available" in summary
        True

    Args:
        device_index: NVML index of the GPU (NVML ignores ``CUDA_VISIBLE_DEVICES``).
        interval: Seconds between samples.
    """

    def __init__(self, *, device_index: int = 0, interval: float = 0.5) -> None:
        if device_index < 0:
            raise ValueError(f"device_index must be >= 0, got {device_index}")
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.device_index = device_index
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self.available = False
        self.reason = ""
        self.device_name = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: Any = None

    def start(self) -> GpuTelemetry:
        try:
            nvml = _load_nvml()
            nvml.nvmlInit()
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
            name = nvml.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as error:  # ImportError, NVMLError_LibraryNotFound, no such device...
            self.available = False
            self.reason = f"NVML unavailable: {type(error).__name__}: {error}".strip()
            return self
        self._nvml = nvml
        self.available = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> dict[str, float]:
        nvml, handle = self._nvml, self._handle
        sample: dict[str, float] = {"t": time.monotonic()}
        readers = {
            "memory_used_mb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            "utilization_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        }
        for field, read in readers.items():
            try:  # one unsupported counter (power on some boards) must not lose the others
                sample[field] = float(read())
            except Exception:
                continue
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self.available and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def __enter__(self) -> GpuTelemetry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        """JSON-serializable summary: mean and max of each field, or why there is none."""
        if not self.available:
            return {"available": False, "reason": self.reason or "not started"}
        result: dict[str, Any] = {"available": True, "device": self.device_name,
                                  "samples": len(self.samples)}
        for field in FIELDS:
            values = [s[field] for s in self.samples if field in s]
            if values:
                result[f"{field}_mean"] = round(sum(values) / len(values), 2)
                result[f"{field}_max"] = round(max(values), 2)
        return result
