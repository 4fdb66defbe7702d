"""The NPU side of `verify` when there is no working Ascend NPU: probe the real torch_npu, or emulate one.

`probe_torch_npu()` finds out, in a child process, whether the real torch_npu imports and sees a device.
`emulation_env()` gives the environment that makes `import torch_npu` in a child process load the stand-in in
verify/emulated/torch_npu: a test double that maps the npu device onto the CPU (or CUDA) with NPU fp16 autocast
numerics. The stand-in is never importable as `torch_npu` here, or anywhere that environment is not given.

This module imports torch only to check for CUDA when asked to emulate on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

STAND_IN_DIR = Path(__file__).resolve().parent / "emulated"
EMULATE_ON_VAR = "NPU_PORT_EMULATE_ON"  # read by the stand-in (verify/emulated/torch_npu/_target.py)
EMULATION_TARGETS = ("cpu", "cuda")
AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"

# Runs in the child: one JSON line. find_spec does not import, so "not installed" is told apart from "cannot load".
_PROBE = """
import importlib.metadata, importlib.util, json
report = {"installed": importlib.util.find_spec("torch_npu") is not None}
try:
    report["version"] = importlib.metadata.version("torch_npu")
except importlib.metadata.PackageNotFoundError:
    report["version"] = ""
if report["installed"]:
    try:
        import torch, torch_npu
        report["version"] = getattr(torch_npu, "__version__", report["version"])
        report["device_count"] = torch.npu.device_count()
    except BaseException as error:
        report["error"] = (type(error).__name__ + ": " + str(error)).strip().splitlines()[0]
print(json.dumps(report))
"""


class EmulationError(ValueError):
    """The emulation cannot be set up as asked."""


@dataclass(frozen=True)
class NpuProbe:
    available: bool
    version: str  # the real torch_npu's version, "" when it is not installed
    reason: str  # one line a person understands


def probe_torch_npu(timeout: float = 60) -> NpuProbe:
    """Whether the real torch_npu imports and sees an NPU, asked in child processes (it may crash on import).

    With torch_npu installed but no CANN, `import torch` itself fails through torch's backend autoload, which hides
    the cause; a second try with autoload off shows it (a missing libascendcl.so, say).
    """
    try:
        report = _run_probe(timeout, autoload=True)
        if AUTOLOAD_VAR in report.get("error", ""):  # torch's autoload failed and hid the cause
            report = _run_probe(timeout, autoload=False)
    except subprocess.TimeoutExpired:
        return NpuProbe(False, "", f"probing torch_npu timed out after {timeout:g} s")
    return _judge(report)


def _run_probe(timeout: float, autoload: bool) -> dict:
    env = _without_stand_in(os.environ)
    if not autoload:
        env[AUTOLOAD_VAR] = "0"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"installed": True, "version": "", "error": f"the probe process failed: {last}"}
    return json.loads(lines[-1])


def _judge(report: dict) -> NpuProbe:
    version = report.get("version", "")
    named = f"torch_npu {version}" if version else "torch_npu"
    if not report["installed"]:
        return NpuProbe(False, "", "torch_npu is not installed")
    if "error" in report:
        return NpuProbe(False, version, f"{named} is installed but cannot load: {report['error']}")
    if report["device_count"] < 1:
        return NpuProbe(False, version, f"{named} loads but sees no NPU (device_count() is 0)")
    return NpuProbe(True, version, f"{named} sees {report['device_count']} NPU(s)")


def _without_stand_in(environ: os._Environ | dict[str, str]) -> dict[str, str]:
    """A copy of `environ` in which `import torch_npu` can only find the real one."""
    env = {key: value for key, value in environ.items() if key != EMULATE_ON_VAR}
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and Path(path) != STAND_IN_DIR]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def emulation_env(on: str = "cpu") -> dict[str, str]:
    """Variables to add to a child's environment so that its `import torch_npu` loads the emulated NPU on `on`.

    Autoload is turned off so that a real but broken torch_npu installed alongside cannot break `import torch`.
    """
    if on not in EMULATION_TARGETS:
        raise EmulationError(f"cannot emulate the NPU on {on!r}: choose one of {', '.join(EMULATION_TARGETS)}")
    if on == "cuda":
        _require_cuda()
    inherited = _without_stand_in(os.environ)["PYTHONPATH"]
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(STAND_IN_DIR), inherited])),
        EMULATE_ON_VAR: on,
        AUTOLOAD_VAR: "0",
    }


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise EmulationError("--emulate-on cuda needs a CUDA GPU, and torch.cuda.is_available() is False here")
