"""Every device a side of `verify` runs on, in one table: `DEVICE_TABLE` holds a row per device with all that differs
between them (its title, the real device it stands for, whether it is emulated, its child's environment, the function
that sets it up inside the child, the switches its fp32 precision is read from). The CLI, runner, pair, bootstrap and
reports ask the table (this module imports no torch, so reports name a device on any laptop); no other module spells a
device's name. Adding a device is its name in `Device`, its row here and the set-up function in verify/devices/setup.py
that the row names; tests/verify/test_device_table.py walks the table.

| device          | where it runs                                          |
|-----------------|--------------------------------------------------------|
| `cpu`           | the CPU, CUDA hidden                                   |
| `cuda`          | a real CUDA GPU                                        |
| `emulated-cuda` | EMULATED CUDA: the CUDA stand-in, cuda on the CPU      |
| `npu`           | a real Ascend NPU through torch_npu                    |
| `emulated-npu`  | EMULATED NPU: the stand-in torch_npu on the CPU or GPU |

`auto` is the real device where there is one and its emulation where there is none: the NPU for a script that
imports torch_npu (decided here, by `probe_torch_npu()`, in a child process), cuda or EMULATED CUDA for any other
(decided in the child by its set-up function, which imports torch; the parent never does). The emulations are test
doubles in verify/devices/emulated: `emulation_env()` makes a child's `import torch_npu` load the stand-in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
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


EMULATION_TARGETS = tuple(target.value for target in EmulateOn)


@dataclass(frozen=True)
class ReducedFp32:
    """A device's mode that rounds fp32 matmul and convolution inputs to a 10-bit mantissa, and the torch switches
    (attribute paths under `torch`) that turn it on for each."""

    name: str
    matmul_switch: str
    conv_switch: str


TF32 = ReducedFp32("tf32", "backends.cuda.matmul.allow_tf32", "backends.cudnn.allow_tf32")
HF32 = ReducedFp32("hf32", "npu.matmul.allow_hf32", "npu.conv.allow_hf32")


STAND_IN_DIR = Path(__file__).resolve().parent / "emulated"
EMULATION_PACKAGE = "npu_port_emulation"  # in STAND_IN_DIR: what both stand-ins share

EMULATE_ON_VAR = "NPU_PORT_EMULATE_ON"  # read by the stand-ins (verify/devices/emulated/npu_port_emulation/target.py)
# Set: the emulations compute as the CPU does, without the devices' modelled numerics (device_numerics.py there).
EXACT_EMULATION_VAR = "NPU_PORT_EXACT_EMULATION"
# How many partial sums an emulated device's modelled matrix products and sums add (device_numerics.BLOCKS_VAR): set
# for a calibration run only, to the port's device's count (DeviceRow.summation_blocks) or, where that cannot be
# taken, to another count than either face's own (2 and 3).
BLOCKS_VAR = "NPU_PORT_BLOCKS"
CALIBRATION_BLOCKS = 4
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


# The oldest torch the capture and the emulations run on (pyproject.toml's lower bound, which CI installs; a test
# holds the three equal). torch 2.3 lacks what they are written in: the device-typed autocast state
# (torch.get_autocast_dtype("cpu"), torch.is_autocast_enabled("cpu")), torch.get_device_module, torch.amp.custom_fwd.
LOWEST_TORCH = (2, 4)


def unsupported_torch(version: str | None = None) -> str:
    """Why verify cannot run the torch of `version` (the installed one by default, read without importing it), in
    one line; "" where it can. The parent asks before it starts a run, the child (setup.prepare) of the torch it
    imported."""
    if version is None:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:  # a torch without metadata: the child checks the one it imports
            return "" if importlib.util.find_spec("torch") else f"torch is not installed for {sys.executable}"
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if release >= LOWEST_TORCH:
        return ""
    lowest = ".".join(map(str, LOWEST_TORCH))
    return (f"torch {version} is older than the torch {lowest} verify runs on: install torch>={lowest} "
            f"(on an Ascend machine, with the torch_npu made for it)")


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


# -- each device's child environment, given --emulate-on and the devices it presents ---------------------------------


def _cuda_hidden(emulate_on: str, count: int) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ""}


def _real_npu_checked(emulate_on: str, count: int) -> dict[str, str]:
    probe = probe_torch_npu()
    if not probe.available:
        raise EmulationError(f"--device {Device.NPU.value}: torch_npu does not work here ({probe.reason}); "
                             f"try --device {Device.EMULATED_NPU.value}")
    return {}


def _emulated_devices(emulate_on: str, count: int) -> dict[str, str]:
    """An emulation on the CPU presents `count` devices (--devices, else one a rank), all of them the CPU, so that a
    script's `device_count()`, `set_device(i)` and tensors on `cuda:i` answer as on a node with that many devices
    (`auto` may become EMULATED CUDA in the child)."""
    return {DEVICE_COUNT_VAR: str(count)}


def _stand_in_npu(emulate_on: str, count: int) -> dict[str, str]:
    return emulation_env(emulate_on) | _emulated_devices(emulate_on, count)


def _stand_in_cuda_on_cpu(emulate_on: str, count: int) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": "", EMULATE_ON_VAR: EmulateOn.CPU.value} | _emulated_devices(emulate_on, count)


# -- the table --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRow:
    """What a device decides everywhere it differs from the others."""

    device: Device
    family: Device  # the real device it is or stands in for: its autocast and precision switches are that one's
    title: str  # how every manifest, terminal line and report names it; {on}: where its emulation computes
    child_env: Callable[[str, int], dict[str, str]]  # its child's variables, from --emulate-on and the device count
    set_up: str  # the function of verify/devices/setup.py that sets it up inside the child (which imports torch)
    reduced_fp32: ReducedFp32 | None = None  # the fp32 mode the environment record reads its switches of
    emulated: bool = False  # a test double: its title says EMULATED, its manifest says where it computed
    emulates_on: EmulateOn | None = None  # an emulation that computes only there, whatever --emulate-on says
    cuda_casts_under_autocast: bool = False  # CPU autocast's own op lists differ: an imposed one takes CUDA's
    # Whether its manifest records --exact-emulation: not on the CPU, which nothing emulates (the child picks what
    # `auto` becomes, so it and the real devices record what was asked).
    exact_emulation_recorded: bool = True
    # How many partial sums its emulation's modelled products and sums add (device_numerics.py's CUDA_BLOCKS and
    # NPU_BLOCKS): the order a calibration run of the reference takes to sum as the port's device does. 0: a real
    # device, whose order verify cannot set.
    summation_blocks: int = 0
    # What stands in for it on the CPU, taking its code path there: where a pair's emulated port computes on the CPU,
    # its reference's calibration runs compute there too (reference_on_the_ports_hardware). None: itself.
    on_the_cpu: Device | None = None

    @property
    def autocast_device_type(self) -> str:
        """The device type torch.autocast takes: an emulation takes its face's name and applies its numerics on
        the device it computes on."""
        return self.family.value


DEVICE_TABLE: dict[str, DeviceRow] = {row.device.value: row for row in (
    DeviceRow(Device.AUTO, Device.AUTO, "auto", _emulated_devices, "set_up_auto", on_the_cpu=Device.EMULATED_CUDA),
    DeviceRow(Device.CPU, Device.CPU, "cpu", _cuda_hidden, "set_up_cpu", cuda_casts_under_autocast=True,
              exact_emulation_recorded=False),
    DeviceRow(Device.CUDA, Device.CUDA, "cuda", _emulated_devices, "set_up_cuda", TF32,
              on_the_cpu=Device.EMULATED_CUDA),
    DeviceRow(Device.EMULATED_CUDA, Device.CUDA, "EMULATED CUDA (on {on})", _stand_in_cuda_on_cpu,
              "set_up_emulated_cuda", TF32, emulated=True, emulates_on=EmulateOn.CPU, summation_blocks=2),
    DeviceRow(Device.NPU, Device.NPU, "npu", _real_npu_checked, "set_up_npu", HF32),
    DeviceRow(Device.EMULATED_NPU, Device.NPU, "EMULATED NPU (a test double on {on})", _stand_in_npu,
              "set_up_emulated_npu", HF32, emulated=True, summation_blocks=3),
)}
DEVICES = tuple(DEVICE_TABLE)


def row(device: str) -> DeviceRow:
    return DEVICE_TABLE[device]


def title(device: str, emulated_on: str) -> str:
    """How every manifest, terminal line and report names a device: an emulation is never hidden. A name outside the
    table (a hand-made manifest's) reads as it is."""
    known = DEVICE_TABLE.get(device)
    return known.title.format(on=emulated_on or EmulateOn.CPU.value) if known else device


def emulated_on(device: str, emulate_on: str) -> str:
    """Where `device` computes when it is an emulation ("" for a real one): where --emulate-on says, unless the
    emulation computes in one place only."""
    known = row(device)
    if not known.emulated:
        return ""
    return known.emulates_on.value if known.emulates_on else emulate_on


def reference_on_the_ports_hardware(reference: str, port: str, emulate_on: str) -> str:
    """The device a reference's calibration runs take: where the port's emulation computes on the CPU, the reference's
    stand-in there (a GPU reference's EMULATED CUDA), so that they measure what moving the script to the CPU's kernels
    does as well as to the port's summation order, as the port shows it: measured on an H200, a faithful nanoGPT port's
    bf16 layer norm backward differed from the GPU reference by 0.0013 where a calibration run on the GPU showed
    8e-5. Else the reference's own device."""
    if emulated_on(port, emulate_on) != EmulateOn.CPU.value:
        return reference
    return getattr(row(reference).on_the_cpu, "value", reference)


def child_env(device: str, emulate_on: str, device_count: int = 1, exact_emulation: bool = False) -> dict[str, str]:
    """What a child's environment needs for `device`, its emulation presenting `device_count` devices and computing
    exactly as the CPU does or with its device's modelled numerics. Raises EmulationError where it cannot run here."""
    exact = {EXACT_EMULATION_VAR: "1"} if exact_emulation else {}
    return {**row(device).child_env(emulate_on, device_count), **exact}
