"""Every device a side of `verify` runs on, in one place: the choice, the probe, the child's environment and the
child's setup. The CLI, runner, pair and bootstrap ask this module; adding a device is an entry here.

The names and titles are the run directory's vocabulary (verify/schema.py: DEVICES, title), so that reports name a
device without loading this module.

| device          | where it runs                                          | how reports name it         |
|-----------------|--------------------------------------------------------|-----------------------------|
| `cpu`           | the CPU, CUDA hidden                                   | cpu                         |
| `cuda`          | a real CUDA GPU                                        | cuda                        |
| `emulated-cuda` | EMULATED CUDA: the CUDA stand-in, cuda on the CPU      | EMULATED CUDA (on cpu)      |
| `npu`           | a real Ascend NPU through torch_npu                    | npu                         |
| `emulated-npu`  | EMULATED NPU: the stand-in torch_npu on the CPU or GPU | EMULATED NPU (... on cpu)   |

`auto` is the real device where there is one and its emulation where there is none: the NPU for a script that
imports torch_npu (decided here, by `probe_torch_npu()`, in a child process), cuda or EMULATED CUDA for any other
(decided in the child, which imports torch; the parent never does). The emulations are test doubles in
verify/emulated: `emulation_env()` makes a child's `import torch_npu` load the stand-in, and `prepare()` installs the
CUDA stand-in in the child. They are never importable anywhere else.

This module imports torch only in the child (`prepare`) and to check for CUDA when asked to emulate the NPU on it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from verify.schema import DEVICES, EMULATED_DEVICES, title  # noqa: F401  (the device names: the run directory's)

STAND_IN_DIR = Path(__file__).resolve().parent / "emulated"
EMULATION_PACKAGE = "npu_port_emulation"  # in STAND_IN_DIR: what both stand-ins share

EMULATE_ON_VAR = "NPU_PORT_EMULATE_ON"  # read by the stand-ins (verify/emulated/npu_port_emulation/target.py)
EMULATION_TARGETS = ("cpu", "cuda")
AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_IMPORTS_TORCH_NPU = re.compile(r"^\s*(import\s+torch_npu\b|from\s+torch_npu\b)", re.MULTILINE)

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


def imports_torch_npu(script: Path) -> bool:
    return _IMPORTS_TORCH_NPU.search(script.read_text(errors="replace")) is not None


def port_device(choice: str) -> str:
    """The port's side: auto is the real NPU when torch_npu works here, else the emulated one."""
    if choice != "auto":
        return choice
    return "npu" if probe_torch_npu().available else "emulated-npu"


def for_script(script: Path, choice: str) -> str:
    """The device a run records before it starts: auto picks an NPU for a script importing torch_npu; otherwise it
    stays auto, for the child to pick cuda or EMULATED CUDA (prepare)."""
    if choice == "auto" and imports_torch_npu(script):
        return port_device(choice)
    return choice


def child_env(device: str, emulate_on: str) -> dict[str, str]:
    """What a child's environment needs for `device`. Raises EmulationError where it cannot run here."""
    if device == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    if device == "npu":
        probe = probe_torch_npu()
        if not probe.available:
            raise EmulationError(f"--device npu: torch_npu does not work here ({probe.reason}); "
                                 "try --device emulated-npu")
    if device == "emulated-npu":
        return emulation_env(emulate_on)
    if device == "emulated-cuda":
        return {"CUDA_VISIBLE_DEVICES": "", EMULATE_ON_VAR: "cpu"}
    return {}


# --- in the child (these import torch) --------------------------------------------------------------------------


def load_emulation() -> ModuleType:
    """The shared emulation package, loaded from its folder without putting the folder on sys.path: a reference
    script must not find the stand-in torch_npu beside it."""
    if EMULATION_PACKAGE in sys.modules:
        return sys.modules[EMULATION_PACKAGE]
    folder = STAND_IN_DIR / EMULATION_PACKAGE
    spec = importlib.util.spec_from_file_location(EMULATION_PACKAGE, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[EMULATION_PACKAGE] = package
    spec.loader.exec_module(package)
    return package


@dataclass(frozen=True)
class Prepared:
    device: str  # what `auto` resolved to
    name: str  # e.g. "NVIDIA H100", "Emulated CUDA (CPU)"
    torch_npu_version: str  # "" unless the real torch_npu


def prepare(device: str, emulated: bool) -> Prepared:
    """In the child, before the script: import torch_npu where the run is on an NPU (the stand-in when emulated: the
    child's environment makes `import torch_npu` load it), install the CUDA stand-in, and resolve `auto`."""
    import torch

    version = ""
    if device in ("npu", "emulated-npu"):
        import torch_npu

        version = "" if emulated else getattr(torch_npu, "__version__", "")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "emulated-cuda"
    if device == "emulated-cuda":
        os.environ.setdefault(EMULATE_ON_VAR, "cpu")
        importlib.import_module(f"{load_emulation().__name__}.cuda").install()
    elif device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False in this environment")
    return Prepared(device, _device_name(device), version)


def _device_name(device: str) -> str:
    import torch

    if device in ("cuda", "emulated-cuda"):
        return torch.cuda.get_device_name(0)
    if device in ("npu", "emulated-npu"):
        return torch.npu.get_device_name(0)
    return f"CPU ({platform.machine()})"


def autocast_device_type(device: str) -> str:
    """The device type torch.autocast takes for a run: the emulations take their face's name and apply its
    numerics on the device they compute on."""
    return {"emulated-npu": "npu", "emulated-cuda": "cuda"}.get(device, device)


def install_autocast_casts_on_cpu() -> object:
    """CPU autocast leaves softmax, sums, norms and most losses in the low dtype, where CUDA autocast, and the NPU that
    follows its op lists, computes them in float32. A plain CPU run under an imposed autocast (the reference of an AMP
    port) takes CUDA's casts instead, as both stand-ins do. The casts stay registered while the result lives."""
    return importlib.import_module(f"{load_emulation().__name__}.autocast_policy").install_npu_autocast_policy()


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
