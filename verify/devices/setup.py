"""The devices of verify/devices/ set up inside the child process, before the script runs (this module imports
torch; the parent and the report side never load it).

Each row of the device table (verify/devices/__init__.py) names its set-up function here; `prepare()` calls it. The
emulations are test doubles in verify/devices/emulated: the child's environment (devices.emulation_env) makes its
`import torch_npu` load the stand-in NPU, and `set_up_emulated_cuda()` installs the CUDA stand-in. They are never
importable anywhere else.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import platform
import sys
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.utils._device

from verify.devices import EMULATE_ON_VAR, EMULATION_PACKAGE, STAND_IN_DIR, Device, EmulateOn, row, unsupported_torch


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
    torch_npu_version: str = ""  # "" unless the real torch_npu


_PREPARED: dict[str, Prepared] = {}  # the devices set up in this process (a spawned rank sets its up twice)


def prepare(device: str) -> Prepared:
    """Sets `device` up in this process with the set-up function its row of the device table names; once: a second
    call (a spawned rank's, which set its device up before the script's import: session._DeviceFirst) returns the
    first's."""
    if device in _PREPARED:
        return _PREPARED[device]
    if reason := unsupported_torch(torch.__version__):  # a child whose torch is not the one the parent read
        raise RuntimeError(reason)
    _device_context_knows_torchs_factories()
    prepared = _PREPARED[device] = globals()[row(device).set_up]()
    return prepared


def _device_context_knows_torchs_factories() -> None:
    """`with torch.device("meta"):` (transformers builds a model so before loading its weights) gives its device to
    the factories in `torch.utils._device._device_constructors()`, a set torch makes at its first call and matches by
    identity. Made after an emulation's stand-ins (patches.FACTORIES) or the keyed random factories
    (capture/random_streams.py) replace torch's names, it would hold them, never the functions they call, and every
    tensor made in the block would land on the CPU: non-persistent buffers left uninitialised after the load. Made
    here, before either, it holds torch's own."""
    constructors = getattr(torch.utils._device, "_device_constructors", None)
    if constructors is not None:  # torch 2.4 to 2.13 have it; a later torch may match otherwise
        constructors()


# -- the set-up functions the device table names, one a device ------------------------------------------------------


def set_up_auto() -> Prepared:
    """`auto` in a child that the parent did not resolve (a script without torch_npu): the real CUDA where torch sees
    one, else EMULATED CUDA."""
    return set_up_cuda() if torch.cuda.is_available() else set_up_emulated_cuda()


def set_up_cpu() -> Prepared:
    return Prepared(Device.CPU.value, f"CPU ({platform.machine()})")


def set_up_cuda() -> Prepared:
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False in this environment")
    return Prepared(Device.CUDA.value, torch.cuda.get_device_name(0))


def set_up_emulated_cuda() -> Prepared:
    """Installs the CUDA stand-in, which computes on the CPU."""
    os.environ.setdefault(EMULATE_ON_VAR, EmulateOn.CPU.value)
    importlib.import_module(f"{load_emulation().__name__}.cuda").install()
    return Prepared(Device.EMULATED_CUDA.value, torch.cuda.get_device_name(0))


def set_up_npu() -> Prepared:
    import torch_npu

    return Prepared(Device.NPU.value, torch.npu.get_device_name(0), getattr(torch_npu, "__version__", ""))


def set_up_emulated_npu() -> Prepared:
    """Imports the stand-in torch_npu (the child's environment, devices.emulation_env, makes `import torch_npu` load
    it), on the GPU where --emulate-on says so."""
    if os.environ.get(EMULATE_ON_VAR) == EmulateOn.CUDA and not torch.cuda.is_available():
        raise RuntimeError("--emulate-on cuda needs a CUDA GPU, and torch.cuda.is_available() is False here")
    import torch_npu  # noqa: F401

    return Prepared(Device.EMULATED_NPU.value, torch.npu.get_device_name(0))


def install_autocast_casts_on_cpu() -> object:
    """CPU autocast leaves softmax, sums, norms and most losses in the low dtype, where CUDA autocast, and the NPU that
    follows its op lists, computes them in float32. A plain CPU run under an imposed autocast (the reference of an AMP
    port) takes CUDA's casts instead, as both stand-ins do. The casts stay registered while the result lives."""
    return importlib.import_module(f"{load_emulation().__name__}.autocast_policy").install_npu_autocast_policy()


def half_precision_as_devices() -> contextlib.AbstractContextManager:
    """A plain CPU run under an imposed autocast computes half precision as the devices do, as both stand-ins do
    (half_precision.HALF_PRECISION): a dispatch mode to enter below the capture."""
    return importlib.import_module(f"{load_emulation().__name__}.device_numerics").half_precision_as_devices()


def summed_in_blocks(blocks: int) -> contextlib.AbstractContextManager:
    """A calibration run of a reference on a real device sums its products and sums in `blocks` partial results, as
    the port's emulated device does (device_numerics.summed_in_blocks): a dispatch mode to enter below the capture."""
    return importlib.import_module(f"{load_emulation().__name__}.device_numerics").summed_in_blocks(blocks)


def modelled_numerics() -> list[str]:
    """What this process's emulation modelled of its device's numerics (device_numerics.MODELLED), for the manifest;
    none on a real device, the CPU, or in exact mode."""
    numerics = sys.modules.get(f"{EMULATION_PACKAGE}.device_numerics")
    return list(numerics.MODELLED) if numerics is not None else []


def half_precision() -> dict[str, object]:
    """The table by which this process's emulation, or a CPU run under an imposed autocast, computed half precision,
    and the ops it computed by it (half_precision.record()), for the manifest; empty where none was loaded."""
    table = sys.modules.get(f"{EMULATION_PACKAGE}.half_precision")
    return table.record() if table is not None else {}


def ops_computed_in_fp32() -> list[str]:
    """The ops this process's emulation computed in float32 where the CPU lacks the device's dtype (autocast_policy's
    COMPUTED_IN_FLOAT32), for the manifest; none where no emulation or CPU autocast policy was loaded."""
    policy = sys.modules.get(f"{EMULATION_PACKAGE}.autocast_policy")
    return policy.computed_in_float32() if policy is not None else []


def emulated_calls() -> list[str]:
    """What this process's emulation answered for FSDP2, DTensor and DeepSpeed (npu_port_emulation/asked.py USED),
    for the manifest; none where no emulation was loaded."""
    asked = sys.modules.get(f"{EMULATION_PACKAGE}.asked")
    return list(asked.USED) if asked is not None else []
