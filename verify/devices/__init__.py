"""Every device a side of `verify` runs on, in one place: the names, what each stands in for, how `auto` resolves,
the probe, the child's environment, and how reports name them. The CLI, runner, pair, bootstrap and reports ask this
module (it imports no torch, so reports name a device on any laptop); verify/devices/setup.py sets a device up inside
the child. Adding a device is an entry here and one there.

| device          | where it runs                                          | how reports name it         |
|-----------------|--------------------------------------------------------|-----------------------------|
| `cpu`           | the CPU, CUDA hidden                                   | cpu                         |
| `cuda`          | a real CUDA GPU                                        | cuda                        |
| `emulated-cuda` | EMULATED CUDA: the CUDA stand-in, cuda on the CPU      | EMULATED CUDA (on cpu)      |
| `npu`           | a real Ascend NPU through torch_npu                    | npu                         |
| `emulated-npu`  | EMULATED NPU: the stand-in torch_npu on the CPU or GPU | EMULATED NPU (... on cpu)   |

`auto` is the real device where there is one and its emulation where there is none: the NPU for a script that
imports torch_npu (decided here, by `probe_torch_npu()`, in a child process), cuda or EMULATED CUDA for any other
(decided in the child by device_setup.prepare, which imports torch; the parent never does). The emulations are test
doubles in verify/devices/emulated: `emulation_env()` makes a child's `import torch_npu` load the stand-in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from verify.errors import EmulationError


class Device(str, Enum):
    """Every device a side runs on; the manifest records the value."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    EMULATED_CUDA = "emulated-cuda"
    NPU = "npu"
    EMULATED_NPU = "emulated-npu"


class EmulateOn(str, Enum):
    """Where an emulation computes (manifest.emulated_on)."""

    CPU = "cpu"
    CUDA = "cuda"


DEVICES = tuple(device.value for device in Device)
EMULATED_DEVICES = {Device.EMULATED_NPU.value: "NPU", Device.EMULATED_CUDA.value: "CUDA"}  # -> what it stands in for
EMULATION_TARGETS = tuple(target.value for target in EmulateOn)
_FAMILIES = {Device.EMULATED_CUDA.value: Device.CUDA.value, Device.EMULATED_NPU.value: Device.NPU.value}


def title(device: str, emulated_on: str) -> str:
    """How every manifest, terminal line and report names a device: an emulation is never hidden."""
    if device == Device.EMULATED_NPU:
        return f"EMULATED NPU (a test double on {emulated_on or EmulateOn.CPU.value})"
    if device == Device.EMULATED_CUDA:
        return f"EMULATED CUDA (on {emulated_on or EmulateOn.CPU.value})"
    return device


def emulated_on(device: str, emulate_on: str) -> str:
    """Where `device` computes when it is an emulation ("" for a real one): EMULATED CUDA always on the CPU."""
    return {Device.EMULATED_NPU.value: emulate_on, Device.EMULATED_CUDA.value: EmulateOn.CPU.value}.get(device, "")


def family(device: str) -> str:
    """The real device a device is or stands in for: "cuda", "npu" or "cpu" (its switches and autocast are those)."""
    return _FAMILIES.get(device, device)


STAND_IN_DIR = Path(__file__).resolve().parent / "emulated"
EMULATION_PACKAGE = "npu_port_emulation"  # in STAND_IN_DIR: what both stand-ins share

EMULATE_ON_VAR = "NPU_PORT_EMULATE_ON"  # read by the stand-ins (verify/devices/emulated/npu_port_emulation/target.py)
# Set: the emulations compute as the CPU does, without the devices' modelled numerics (device_numerics.py there).
EXACT_EMULATION_VAR = "NPU_PORT_EXACT_EMULATION"
DEVICE_COUNT_VAR = "NPU_PORT_EMULATED_DEVICES"  # how many devices an emulation on the CPU presents (target.py too)
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




def imports_torch_npu(script: Path) -> bool:
    return _IMPORTS_TORCH_NPU.search(script.read_text(errors="replace")) is not None


def port_device(choice: str) -> str:
    """The port's side: auto is the real NPU when torch_npu works here, else the emulated one."""
    if choice != Device.AUTO:
        return choice
    return Device.NPU.value if probe_torch_npu().available else Device.EMULATED_NPU.value


def for_script(script: Path, choice: str) -> str:
    """The device a run records before it starts: auto picks an NPU for a script importing torch_npu; otherwise it
    stays auto, for the child to pick cuda or EMULATED CUDA (prepare)."""
    if choice == Device.AUTO and imports_torch_npu(script):
        return port_device(choice)
    return choice


def child_env(device: str, emulate_on: str, ranks: int = 1, exact_emulation: bool = False) -> dict[str, str]:
    """What a child's environment needs for `device`, run as `ranks` processes, its emulation computing exactly as the
    CPU does or with its device's modelled numerics. Raises EmulationError where it cannot run here. An emulation on
    the CPU presents one device a rank, so that a script's `set_device(local_rank)` and `device_count()` answer as on
    a node with that many devices (`auto` may become EMULATED CUDA in the child)."""
    exact = {EXACT_EMULATION_VAR: "1"} if exact_emulation else {}
    return {**_device_env(device, emulate_on, ranks), **exact}


def _device_env(device: str, emulate_on: str, ranks: int) -> dict[str, str]:
    if device == Device.CPU:
        return {"CUDA_VISIBLE_DEVICES": ""}
    if device == Device.NPU:
        probe = probe_torch_npu()
        if not probe.available:
            raise EmulationError(f"--device npu: torch_npu does not work here ({probe.reason}); "
                                 "try --device emulated-npu")
        return {}
    count = {DEVICE_COUNT_VAR: str(ranks)}
    if device == Device.EMULATED_NPU:
        return emulation_env(emulate_on) | count
    if device == Device.EMULATED_CUDA:
        return {"CUDA_VISIBLE_DEVICES": "", EMULATE_ON_VAR: EmulateOn.CPU.value} | count
    return count


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


def emulation_env(on: str = EmulateOn.CPU.value) -> dict[str, str]:
    """Variables to add to a child's environment so that its `import torch_npu` loads the emulated NPU on `on`.

    Autoload is turned off so that a real but broken torch_npu installed alongside cannot break `import torch`.
    """
    if on not in EMULATION_TARGETS:
        raise EmulationError(f"cannot emulate the NPU on {on!r}: choose one of {', '.join(EMULATION_TARGETS)}")
    inherited = _without_stand_in(os.environ)["PYTHONPATH"]
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(STAND_IN_DIR), inherited])),
        EMULATE_ON_VAR: on,
        AUTOLOAD_VAR: "0",
    }


def autocast_device_type(device: str) -> str:
    """The device type torch.autocast takes for a run: the emulations take their face's name and apply its
    numerics on the device they compute on."""
    return family(device)
