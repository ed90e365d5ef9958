"""What a CUDA device supports, probed in a short-lived subprocess.

The GPT study offers only the attention backends that run on the device. Trying them in the
study process put the whole study at the mercy of the CUDA libraries: a backend that segfaults
or aborts inside one (cuDNN attention was unstable on a practitioner's RTX 5090) killed
``autoscout run`` without a word, an error other than ``RuntimeError`` (a ``ValueError``) or
one that leaves the CUDA context unusable crashed ``definition()``, and the probe's CUDA
context (hundreds of MB) stayed in the study process beside every trial's own on the same GPU.
Here a child process does it:

- The child (``python .../studies/_device_probe.py --device cuda:0 --backends flash,...``)
  prints one line per fact, ``PREFIX`` and JSON, flushed as it goes: the device's
  facts (or why it cannot be used), then for each backend the one it is ``trying`` and its
  result. A backend that raises is unsupported; if the CUDA context no longer works after it,
  the child exits so that the next backends are not judged on a broken context.
- The parent reads which backend the child was trying when it died or hung (past ``timeout``),
  records that backend as failed with the signal or the timeout, and probes the remaining ones
  in a fresh child. One child probes every backend when nothing goes wrong, so a healthy device
  pays one torch import and CUDA start (seconds), not one per backend, and a crash in one
  backend still hides none of the others.

Only the standard library is imported here at module level (torch only in the child), so
``import autoscout_optuna`` stays torch-free and the file runs as a script too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The SDPA backends, in the order the study prefers them (its default is the first offered).
BACKENDS = ("flash", "efficient", "cudnn", "math")
#: Starts each line of the child's answer: whatever else a library prints is not read.
PREFIX = "autoscout-device-probe: "
#: Seconds one child may take: importing torch and starting CUDA take seconds; a backend that
#: hangs is given up on after this.
DEFAULT_TIMEOUT_S = 120.0
# The child's exit status when a backend left the CUDA context unusable (the parent goes on
# with a fresh child) and when the device itself cannot be used.
_BROKEN_CONTEXT = 3
_NO_DEVICE = 2
#: Why a backend whose output on a small random input held NaN or inf is not offered.
NOT_FINITE = "its output on a small random input is not finite"


class DeviceProbeError(ValueError):
    """The device itself could not be probed: no CUDA device, no such index, or the probe died.

    A ``ValueError``, as for any option the study cannot use: ``autoscout run`` reports it in one
    line with the study's options.
    """


class DeviceProbeWarning(UserWarning):
    """An attention backend crashed, hung or broke CUDA in the probe, and is not offered."""


@dataclass
class CudaProbe:
    """What the probe found: the device's facts and each attention backend's fate.

    Attributes:
        device: The probed device (``"cuda"``, ``"cuda:1"``).
        name: The GPU's name.
        memory_bytes: Its total memory.
        major: Compute capability, major (8 for Ampere).
        hip: Whether torch runs on ROCm.
        attention: The backends that ran, in :data:`BACKENDS` order.
        unsupported: Backends that raised, with the error (the device or build lacks them).
        failed: Backends that killed, hung or broke the probe (or computed NaN), with how:
            not expected of any backend, worth a warning.
    """

    device: str
    name: str
    memory_bytes: float
    major: int
    hip: bool
    attention: list[str] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def probe_cuda(device: str, *, command: Sequence[str] | None = None,
               timeout: float = DEFAULT_TIMEOUT_S) -> CudaProbe:
    """Probe ``device`` (``"cuda"`` or ``"cuda:i"``) in child processes.

    Args:
        device: The CUDA device to probe.
        command: The child's command, to which ``--device`` and ``--backends`` are appended
            (default: this module under the running Python).
        timeout: Seconds each child may run.

    Raises:
        DeviceProbeError: The device's facts could not be read: why, in words.
    """
    command = list(command) if command is not None else default_command()
    found: CudaProbe | None = None
    remaining = list(BACKENDS)
    while remaining:
        child = _run_child([*command, "--device", device, "--backends", ",".join(remaining)],
                           timeout)
        if found is None:
            found = _facts(device, child)
        for name in (name for name in remaining if name in child.results):
            error = child.results[name]
            if error is None:
                found.attention.append(name)
            else:
                (found.failed if name in child.failed else found.unsupported)[name] = error
        left = [name for name in remaining if name not in child.results]
        if child.trying in left and child.ended is not None:
            # it died or hung inside this backend: that one failed, the rest are tried again
            found.failed[child.trying] = f"the probe {child.ended} while running it"
            left.remove(child.trying)
        if child.ended is None or len(left) == len(remaining):
            # done, or it died having probed none of them: another child would do no better
            why = ("not reported by the probe" if child.ended is None
                   else f"the probe {child.ended} before trying it")
            found.failed.update(dict.fromkeys(left, why))
            left = []
        remaining = left
    assert found is not None  # BACKENDS is not empty
    return found


def default_command() -> list[str]:
    """The child's command: this file under the running Python.

    The file, not ``-m``: the child runs the very code the parent imported, however the
    package is installed (its module-level imports are the standard library's).
    """
    return [sys.executable, __file__]


@dataclass
class _Child:
    facts: dict[str, Any] | None = None
    error: str | None = None  # the child's own word on why the device cannot be used
    results: dict[str, str | None] = field(default_factory=dict)  # backend -> error or None
    failed: set[str] = field(default_factory=set)  # backends that broke CUDA or gave NaN
    trying: str | None = None  # the backend it started and never reported
    ended: str | None = None  # how it ended, if not with status 0: a signal, a timeout, ...
    output: str = ""


def _run_child(argv: list[str], timeout: float) -> _Child:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as expired:  # run() has killed it
        child = _read(_text(expired.stdout))
        child.ended = f"gave no answer within {timeout:g} s (hung) and was killed"
        return child
    except OSError as error:  # the command itself cannot start
        return _Child(ended=f"could not start ({argv[0]!r}: {error})")
    child = _read(done.stdout)
    if done.returncode < 0:
        child.ended = f"was killed by {_signal_name(-done.returncode)}"
    elif done.returncode > 0:
        last = done.stderr.strip().splitlines()[-1:] or [""]
        child.ended = f"exited with status {done.returncode}" + (f": {last[0]}" if last[0] else "")
    return child


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):  # TimeoutExpired keeps the bytes read so far, undecoded
        return output.decode(errors="replace")
    return output or ""


def _read(stdout: str) -> _Child:
    child = _Child(output=stdout)
    for line in stdout.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            record = json.loads(line[len(PREFIX):])
        except ValueError:
            continue  # a torn line (the child died while printing it) is no answer
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("device"), dict):
            child.facts = record["device"]
        elif "error" in record:
            child.error = str(record["error"])
        elif "trying" in record:
            child.trying = str(record["trying"])
        elif "backend" in record:
            name = str(record["backend"])
            child.results[name] = None if record.get("ok") else str(record.get("why") or "failed")
            if record.get("failed"):
                child.failed.add(name)
            if child.trying == name:
                child.trying = None
    return child


def _facts(device: str, child: _Child) -> CudaProbe:
    facts = child.facts
    try:
        if facts is not None:
            return CudaProbe(device=device, name=str(facts["name"]),
                             memory_bytes=float(facts["memory_bytes"]),
                             major=int(facts["major"]), hip=bool(facts.get("hip")))
    except (KeyError, TypeError, ValueError):
        pass
    why = child.error or (f"the probe {child.ended}" if child.ended else
                          f"the probe printed no answer ({_tail(child.output) or 'nothing'})")
    raise DeviceProbeError(f"cannot probe device {device!r}: {why}")


def _tail(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def native_bf16(facts: Mapping[str, Any]) -> bool:
    """Whether the GPU computes bf16 natively: Ampere (8.x) and later, or ROCm.

    Not ``torch.cuda.is_bf16_supported()``: it also says True on a V100 or T4, where bf16 is
    emulated, many times slower than fp16, and the study's default dtype is the first offered.
    """
    return bool(facts.get("hip")) or int(facts["major"]) >= 8


# --- the child ---------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None, *, emit: Callable[[dict], None] | None = None) -> int:
    """The child: print the device's facts, then try each backend; the exit status.

    Status 0 after every backend, 2 when the device cannot be used, 3 when a backend left the
    CUDA context unusable (the remaining backends were not tried).
    """
    parser = argparse.ArgumentParser(prog="_device_probe.py")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args(argv)
    emit = emit or _print
    import torch

    try:
        facts = device_facts(torch, args.device)
        dtype = torch.bfloat16 if native_bf16(facts) else torch.float16
        q = torch.randn(1, 4, 128, 128, device=args.device, dtype=dtype)  # starts CUDA here
    except Exception as error:  # noqa: BLE001 - whatever it is, the device is unusable
        emit({"error": _describe(error)})
        return _NO_DEVICE
    emit({"device": facts})
    for name in filter(None, args.backends.split(",")):
        emit({"trying": name})
        why = try_backend(torch, name, q)
        if why is None:
            emit({"backend": name, "ok": True})
        elif not _context_works(torch, args.device):
            # a sticky CUDA error: every later backend would fail on this context
            emit({"backend": name, "ok": False, "failed": True,
                  "why": f"{why} (and the CUDA context was unusable after it)"})
            return _BROKEN_CONTEXT
        else:  # a kernel that computes garbage is no more expected than one that crashes
            emit({"backend": name, "ok": False, "why": why, "failed": why == NOT_FINITE})
    return 0


def _print(record: dict) -> None:
    print(PREFIX + json.dumps(record), flush=True)  # flushed: a crash right after keeps it


def device_facts(torch: Any, device: str) -> dict[str, Any]:
    """Name, memory and compute capability of ``device``; ``RuntimeError`` saying why not."""
    if not torch.cuda.is_available():
        if not (torch.version.cuda or torch.version.hip):
            hint = f" (torch {torch.__version__} is built without CUDA)"
        elif "CUDA_VISIBLE_DEVICES" in os.environ:
            hint = f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
        else:
            hint = ""
        raise RuntimeError(f"torch sees no CUDA device{hint}")
    index = torch.device(device).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise RuntimeError(f"there is no {device}: torch sees {count} CUDA device(s), "
                           f"cuda:0 to cuda:{count - 1} (CUDA_VISIBLE_DEVICES renumbers them)")
    props = torch.cuda.get_device_properties(torch.device(device))
    return {"name": props.name, "memory_bytes": float(props.total_memory),
            "major": int(props.major), "minor": int(props.minor), "hip": bool(torch.version.hip)}


def try_backend(torch: Any, name: str, q: Any) -> str | None:
    """Run causal SDPA on ``q`` with backend ``name``: None if it ran, else why not."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    if name not in backends:
        return f"unknown backend {name!r}"
    try:
        with sdpa_kernel(backends[name]):
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        if q.is_cuda:  # a kernel's error surfaces at the next sync: make it this backend's
            torch.cuda.synchronize(q.device)
        if not bool(torch.isfinite(out).all()):
            return NOT_FINITE
    except Exception as error:  # noqa: BLE001 - any error means: not this backend
        return _describe(error)
    return None


def _context_works(torch: Any, device: str) -> bool:
    if not device.startswith("cuda"):
        return True
    try:
        (torch.ones(1, device=device) + 1).cpu()
        torch.cuda.synchronize(torch.device(device))
    except Exception:  # noqa: BLE001 - a sticky CUDA error: every later call fails
        return False
    return True


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
