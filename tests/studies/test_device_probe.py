"""The GPT study's device probe: a child process per probe, crashes and hangs contained.

The subprocess plumbing runs against ``fake_device_probe.py`` (no torch, no GPU: each child
starts in a fraction of a second); the real child's code runs in-process on the CPU.
"""

from __future__ import annotations

import functools
import re
import sys
import time
import warnings
from pathlib import Path

import pytest
from autoscout_optuna.studies import _device_probe, gpt_training
from autoscout_optuna.studies._device_probe import (
    BACKENDS,
    CudaProbe,
    DeviceProbeError,
    DeviceProbeWarning,
    probe_cuda,
)

from autoscout_optuna import cli, studies

FAKE = Path(__file__).with_name("fake_device_probe.py")


@pytest.fixture
def fake(tmp_path):
    """``fake(*behaviours)``: the fake child's command; ``fake.runs()``: each child's backends."""
    log = tmp_path / "runs.log"

    def command(*behaviours: str) -> list[str]:
        return [sys.executable, str(FAKE), _device_probe.__file__, str(log), *behaviours]

    command.runs = lambda: log.read_text().splitlines() if log.exists() else []
    return command


def test_one_child_probes_every_backend_when_nothing_goes_wrong(fake):
    found = probe_cuda("cuda:1", command=fake("raise=cudnn"))
    assert (found.name, found.major, found.memory_bytes) == ("Fake GPU", 9, 2.0**34)
    assert found.attention == ["flash", "efficient", "math"]
    assert found.unsupported == {"cudnn": "NotImplementedError: no"}
    assert found.failed == {}
    assert fake.runs() == [",".join(BACKENDS)]


@pytest.mark.parametrize("behaviour, signal_name", [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_backend_that_kills_the_probe_is_failed_and_the_rest_are_still_probed(
        fake, behaviour, signal_name):
    # in the study process, a segfault inside cuDNN attention ended `autoscout run` silently
    found = probe_cuda("cuda", command=fake(f"{behaviour}=cudnn"))
    assert found.attention == ["flash", "efficient", "math"]
    assert found.failed == {"cudnn": f"the probe was killed by {signal_name} while running it"}
    assert fake.runs() == ["flash,efficient,cudnn,math", "math"]


def test_a_backend_that_hangs_is_given_up_on_after_the_timeout(fake):
    started = time.monotonic()
    found = probe_cuda("cuda", command=fake("hang=flash"), timeout=2.0)
    assert time.monotonic() - started < 10.0  # one timeout, then a quick second child
    assert found.attention == ["efficient", "cudnn", "math"]
    assert found.failed == {
        "flash": "the probe gave no answer within 2 s (hung) and was killed while running it"}
    assert fake.runs() == ["flash,efficient,cudnn,math", "efficient,cudnn,math"]


def test_a_backend_that_breaks_the_cuda_context_is_failed_and_the_rest_get_a_fresh_one(fake):
    found = probe_cuda("cuda", command=fake("broke=efficient"))
    assert found.attention == ["flash", "cudnn", "math"]
    assert "illegal memory access" in found.failed["efficient"]
    assert fake.runs() == ["flash,efficient,cudnn,math", "cudnn,math"]


def test_a_child_that_dies_before_any_backend_is_not_started_again(fake):
    found = probe_cuda("cuda", command=fake("exit=1"))
    assert found.attention == []
    assert found.failed == dict.fromkeys(
        BACKENDS, "the probe exited with status 1 before trying it")
    assert len(fake.runs()) == 1


@pytest.mark.parametrize("behaviour, message", [
    ("nodevice", "cannot probe device 'cuda': RuntimeError: there is no cuda:7"),
    ("garbage", "cannot probe device 'cuda': the probe printed no answer ({not json "
                "autoscout-device-probe-ish: 42)"),
])
def test_a_device_that_cannot_be_probed_is_a_clear_error(fake, behaviour, message):
    with pytest.raises(DeviceProbeError, match=f"^{re.escape(message)}$"):
        probe_cuda("cuda", command=fake(behaviour))


def test_a_probe_command_that_cannot_start_is_a_clear_error(tmp_path):
    with pytest.raises(DeviceProbeError, match="cannot probe device 'cuda': the probe could "
                                               "not start"):
        probe_cuda("cuda", command=[str(tmp_path / "no-such-python")])


def test_the_real_child_on_a_machine_without_cuda_says_so():
    # the default command: this file under this Python, whatever the package's install
    if _torch_sees_cuda():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(DeviceProbeError, match="cannot probe device 'cuda:3': RuntimeError: "
                                               "torch sees no CUDA device"):
        probe_cuda("cuda:3")


def test_the_real_child_tries_each_backend_and_reports_any_error_as_unsupported(monkeypatch):
    # in-process on the CPU: errors other than RuntimeError (a ValueError) crashed definition()
    import torch

    records: list[dict] = []
    monkeypatch.setattr(_device_probe, "device_facts", lambda torch, device: {
        "name": "cpu", "memory_bytes": 1.0, "major": 9, "minor": 0, "hip": False})
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    errors = {"efficient": NotImplementedError("not on this build"),
              "cudnn": ValueError("bad head dim")}

    def sdpa(*args, **kwargs):
        name = _active_backend()
        if name in errors:
            raise errors[name]
        out = real_sdpa(*args, **kwargs)
        return out * float("nan") if name == "math" else out  # an unstable kernel's garbage

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    assert _device_probe.main(["--device", "cpu"], emit=records.append) == 0
    assert records[0] == {"device": {"name": "cpu", "memory_bytes": 1.0, "major": 9,
                                     "minor": 0, "hip": False}}
    results = {r["backend"]: (r.get("why"), r.get("failed")) for r in records if "backend" in r}
    assert results == {"flash": (None, None),
                       "efficient": ("NotImplementedError: not on this build", False),
                       "cudnn": ("ValueError: bad head dim", False),
                       "math": (_device_probe.NOT_FINITE, True)}  # worth a warning
    assert [r["trying"] for r in records if "trying" in r] == list(BACKENDS)


def test_the_real_child_stops_when_a_backend_leaves_the_context_unusable(monkeypatch):
    records: list[dict] = []
    monkeypatch.setattr(_device_probe, "device_facts", lambda torch, device: {
        "name": "cpu", "memory_bytes": 1.0, "major": 9, "minor": 0, "hip": False})
    monkeypatch.setattr(_device_probe, "try_backend", lambda torch, name, q: (
        "RuntimeError: CUDA error" if name == "efficient" else None))
    monkeypatch.setattr(_device_probe, "_context_works", lambda torch, device: False)
    assert _device_probe.main(["--device", "cpu"], emit=records.append) == 3
    assert records[-1]["backend"] == "efficient" and records[-1]["failed"]
    assert not any(r.get("trying") == "cudnn" for r in records)


def test_the_study_warns_of_a_failed_backend_and_offers_math_when_nothing_ran(
        fake, monkeypatch):
    # an empty list stopped definition() with an IndexError at info["attention"][0]
    monkeypatch.setattr(gpt_training, "probe_cuda", functools.partial(
        probe_cuda, command=fake("segv=flash", "raise=efficient+cudnn+math")))
    with pytest.warns(DeviceProbeWarning) as caught:
        info = gpt_training.probe_device("cuda")
    assert info["attention"] == ["math"]
    assert [str(w.message) for w in caught] == [
        "flash attention is not offered on cuda: the probe was killed by SIGSEGV while "
        "running it",
        "no attention backend ran in the device probe on cuda; offering 'math' alone"]


def test_autoscout_run_prints_the_probe_s_warning_in_one_line(fake, monkeypatch, capsys):
    monkeypatch.setattr(gpt_training, "probe_cuda", functools.partial(
        probe_cuda, command=fake("segv=cudnn")))
    definition = cli._load_definition("gpt_training", {"device": "cuda"}, studies)
    assert definition.default_config["attention"] == "flash"
    assert capsys.readouterr().err == (  # this warning, and no other
        "autoscout run: warning: cudnn attention is not offered on cuda: the probe was killed "
        "by SIGSEGV while running it\n")


def test_autoscout_run_says_in_one_line_why_the_device_cannot_be_used(fake, monkeypatch,
                                                                       capsys):
    monkeypatch.setattr(gpt_training, "probe_cuda", functools.partial(
        probe_cuda, command=fake("nodevice")))
    assert cli.main(["run", "gpt_training", "-o", "device=cuda:7"]) == cli.USAGE_ERROR
    assert capsys.readouterr().err == (
        "autoscout run: error: study 'gpt_training' rejected its options (device='cuda:7'): "
        "cannot probe device 'cuda:7': RuntimeError: there is no cuda:7\n")


# (the word "gpu" as a test id would mark the test gpu-only)
@pytest.mark.parametrize("device", [pytest.param("gpu", id="the-word"), "mps", "cuda:x",
                                    "cuda:", "CPU", ""])
def test_a_device_the_study_does_not_know_is_refused_not_run_on_the_cpu(device):
    # "gpu" or "mps" silently trained on the CPU
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        gpt_training.probe_device(device)


def test_the_cpu_is_not_probed_in_a_subprocess(monkeypatch):
    monkeypatch.setattr(gpt_training, "probe_cuda", _never)
    info = gpt_training.probe_device("cpu")
    assert info["kind"] == "cpu" and info["attention"] == ["auto", "math"]


def test_a_probe_gives_what_the_study_reads(monkeypatch):
    found = CudaProbe(device="cuda:1", name="H100", memory_bytes=8.0e10, major=9, hip=False,
                      attention=["flash", "math"], unsupported={"cudnn": "RuntimeError: no"})
    monkeypatch.setattr(gpt_training, "probe_cuda", lambda device, timeout: found)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unsupported backend is no news: no warning
        info = gpt_training.probe_device("cuda:1")
    assert info == {"kind": "gpu", "device": "cuda:1", "name": "H100", "memory_bytes": 8.0e10,
                    "dtypes": ["bf16", "fp16", "fp32"], "attention": ["flash", "math"],
                    "tf32": True}


def _never(*args, **kwargs):
    raise AssertionError("probed in a subprocess")


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _active_backend() -> str:
    """The backend ``sdpa_kernel`` allows now (the probe allows one at a time)."""
    import torch

    flags = {"flash": torch.backends.cuda.flash_sdp_enabled(),
             "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
             "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
             "math": torch.backends.cuda.math_sdp_enabled()}
    return next(name for name, on in flags.items() if on)
