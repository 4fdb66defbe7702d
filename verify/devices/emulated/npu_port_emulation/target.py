"""Where an emulated device really computes, and how its device arguments are translated to go there.

The emulation target is "cpu" or "cuda", named by the environment variable that `verify.devices` sets for a child.
Tensors placed on the emulated device ("npu"; "cuda" for the CUDA stand-in) really live on the target, so
`tensor.device` reports the target, never "npu".
"""

from __future__ import annotations

import os
import re

from .device_errors import as_the_device

# The same names as verify.devices.EMULATE_ON_VAR and DEVICE_COUNT_VAR (the stand-ins never import npu-port; a test
# checks they agree).
EMULATE_ON_VAR = "NPU_PORT_EMULATE_ON"
DEVICE_COUNT_VAR = "NPU_PORT_EMULATED_DEVICES"
TARGETS = ("cpu", "cuda")
EMULATION = "npu-port's emulated NPU (a test double, not an Ascend NPU)"

# Device types whose arguments are sent to the target: "npu" for the emulated NPU (`transfer_to_npu` adds "cuda", as the
# real one sends cuda to npu), "cuda" for the CUDA stand-in. Each face adds its own when it is installed.
redirected_types: set[str] = set()

_DEVICE_STRING = re.compile(r"(?P<type>[a-z]+)(?::(?P<index>\d+))?")

TARGET = os.environ.get(EMULATE_ON_VAR, "")
if TARGET not in TARGETS:  # checked before importing torch, so that refusing is quick
    raise ImportError(
        f"this is {EMULATION}; it loads only in a process started by `verify` with "
        f"{EMULATE_ON_VAR}=cpu|cuda (got {TARGET!r})"
    )

import torch  # noqa: E402

if TARGET == "cuda" and not torch.cuda.is_available():
    raise ImportError(f"{EMULATE_ON_VAR}=cuda, but torch.cuda.is_available() is False in this process")
# Captured before transfer_to_npu replaces torch.cuda's functions with the emulated torch.npu ones.
_cuda_device_count = torch.cuda.device_count


# On the cpu target, as many devices as verify presents (--devices N, else one a rank it launches: `set_device(i)`
# works); all of them are the CPU.
_CPU_DEVICES = max(1, int(os.environ.get(DEVICE_COUNT_VAR) or 1))


def device_count() -> int:
    """The CPU emulation has the devices verify presents (one by default); the CUDA emulation has one NPU per visible
    GPU."""
    return _CPU_DEVICES if TARGET == "cpu" else _cuda_device_count()


def check_index(index: int) -> int:
    if not 0 <= index < device_count():
        raise as_the_device(RuntimeError(
            f"npu:{index} does not exist: {EMULATION} on {TARGET} has {device_count()} device(s)"))
    return index


def target_device(index: int | None = None) -> str:
    """The target device that stands for npu:`index` (None: the current one)."""
    if index is not None:
        check_index(index)
    if TARGET == "cpu":
        return "cpu"
    return "cuda" if index is None else f"cuda:{index}"


def _redirected_index(value: object, ints_are_devices: bool) -> tuple[bool, int | None]:
    """(whether `value` names a redirected device, its index)."""
    if isinstance(value, torch.device):
        return value.type in redirected_types, value.index
    if isinstance(value, str):
        match = _DEVICE_STRING.fullmatch(value)
        if match and match["type"] in redirected_types:
            return True, None if match["index"] is None else int(match["index"])
        return False, None
    if ints_are_devices and type(value) is int:
        return True, value
    return False, None


def translate(value: object, ints_are_devices: bool = False) -> object:
    """`value` with a redirected device replaced by the target, in the same form (str or torch.device).

    Only whole device strings ("npu", "npu:0") are translated, never a string that merely contains "npu" (a file
    name given to torch.load, say). Bare ints are devices only where torch reads them so (Tensor.to, .npu(0)).
    """
    redirected, index = _redirected_index(value, ints_are_devices)
    if not redirected:
        return value
    target = target_device(index)
    return torch.device(target) if isinstance(value, torch.device) else target


def device_index(device: object = None) -> int | None:
    """The npu index named by a torch.npu API argument: None, an int, "npu:1", torch.device("npu", 1)."""
    if device is None or type(device) is int:
        return device
    redirected, index = _redirected_index(device, ints_are_devices=False)
    if not redirected and not (isinstance(device, torch.device) and device.type == TARGET):
        raise ValueError(f"{device!r} is not an npu device ({EMULATION})")
    return index


class NotEmulated(AttributeError):
    """A name of the real device API (torch_npu.npu's) that this emulation does not model: verify's limit, which the
    run records as verify's error naming the emulation (exit 2), never as the script's crash. An AttributeError, so
    that hasattr() (torch's own probes of a device module) reads it as absent."""


class NoMarkers:
    """Profiler range markers (NVTX's, torch_npu's mstx) with no profiler to mark for: no-ops, as the real markers
    are when no profiler records them. Depths and handles are 0."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: 0
