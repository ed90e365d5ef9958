"""A stand-in for the device probe's child that misbehaves on demand, without torch (fast).

    python fake_device_probe.py PROBE_MODULE LOG [BEHAVIOUR ...] --device D --backends a,b,...

PROBE_MODULE is the path of ``_device_probe.py`` (its prefix and printer are used, so the
answer is in the real format); each run appends its ``--backends`` to the file LOG, so a test
sees which children ran. BEHAVIOURs: ``segv=NAME``, ``abort=NAME`` (the signal, inside
backend NAME), ``hang=NAME`` (waits forever inside it), ``raise=A+B`` (A and B unsupported),
``broke=NAME`` (NAME breaks the CUDA context: reported, then exit 3), ``exit=N`` (exits with
status N before any backend), ``garbage`` (prints no answer), ``nodevice``, ``major=N``.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import signal
import sys


def main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("device_probe", argv[0])
    probe = sys.modules["device_probe"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    split = argv.index("--device")
    behaviours = dict(item.partition("=")[::2] for item in argv[2:split])
    backends = argv[argv.index("--backends") + 1].split(",")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the crashes below leave no core file
    with open(argv[1], "a") as log:
        log.write(",".join(backends) + "\n")
    if "garbage" in behaviours:
        print("{not json\nautoscout-device-probe-ish: 42", flush=True)
        return 0
    if "nodevice" in behaviours:
        probe._print({"error": "RuntimeError: there is no cuda:7"})
        return 2
    probe._print({"device": {"name": "Fake GPU", "memory_bytes": 2.0**34,
                             "major": int(behaviours.get("major", 9)), "minor": 0,
                             "hip": False}})
    if "exit" in behaviours:
        return int(behaviours["exit"])
    for name in backends:
        probe._print({"trying": name})
        if behaviours.get("segv") == name:
            os.kill(os.getpid(), signal.SIGSEGV)
        if behaviours.get("abort") == name:
            os.abort()
        if behaviours.get("hang") == name:
            signal.pause()  # until the parent's timeout kills it
        if behaviours.get("broke") == name:
            probe._print({"backend": name, "ok": False, "failed": True,
                          "why": "RuntimeError: CUDA error: an illegal memory access"})
            return 3
        if name in behaviours.get("raise", "").split("+"):
            probe._print({"backend": name, "ok": False, "why": "NotImplementedError: no"})
        else:
            probe._print({"backend": name, "ok": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
