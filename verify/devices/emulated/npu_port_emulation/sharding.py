"""What FSDP2 (fully_shard) and DTensor ask of an emulated device, answered as the real device answers them.

An emulated device's tensors live on the target (the CPU), while its device meshes are of the face's type ("npu",
"cuda"), so that DTensor asks the face's device module for what it needs:
- fully_shard reads its mesh's device (npu:0) and checks that each parameter is there: it is told the target.
- DTensor's RNG tracker (OffsetBasedRNGTracker) reads the device generator's state as Philox's seed and offset and
  moves the offset for each shard; the emulated generator gives its state so (device_numerics.OwnGenerator
  philox_state) and draws from a stream of each (seed, offset) it is set to.
- torch.distributed asks the capability of a tensor transfer_to_npu calls a CUDA one (torch_npu.npu
  get_device_capability answers it), and Module.to_empty's memory reads zeros (patches.py).
`note()` keeps what a run used of these (USED), which its manifest names (extra["emulated_calls"]).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import torch

from . import device_api
from .target import redirected_types, translate

EMULATED = {
    "mesh_device": "fully_shard's mesh device: the emulation target",
    "rng_tracker": "DTensor's RNG tracker: a Philox seed and offset of the emulated generator",
    "capability": "torch.distributed's question of the device capability: (8, 0), where torch_npu tells a script None",
    "fresh_memory": "Module.to_empty: fresh device memory reads zeros",
}
USED: list[str] = []


def note(emulation: str) -> None:
    """The run used `emulation` (a key of EMULATED)."""
    if EMULATED[emulation] not in USED:
        USED.append(EMULATED[emulation])

# Where FSDP2 reads the device of its mesh (torch.distributed.fsdp since torch 2.6, torch.distributed._composable.fsdp
# before), in the module that defines it and in the one that imported it by name.
_FSDP_MESH_DEVICE = tuple(f"torch.distributed.{package}.{module}"
                          for package in ("fsdp._fully_shard", "_composable.fsdp")
                          for module in ("_fsdp_init", "_fully_shard"))
_RNG_TRACKER = "torch.distributed.tensor._random"


def install() -> None:
    for module in _importable(_FSDP_MESH_DEVICE):
        if hasattr(module, "_get_device_from_mesh"):
            module._get_device_from_mesh = _on_target(module._get_device_from_mesh)
    for module in _importable((_RNG_TRACKER,)):
        tracker = getattr(module, "OffsetBasedRNGTracker", None)
        if tracker is not None and hasattr(tracker, "_get_device_state"):
            tracker._get_device_state = _philox_state_of_emulated(tracker._get_device_state)


def _importable(names: tuple[str, ...]) -> list[Any]:
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:  # another torch's layout
            continue
    return modules


def _on_target(original: Callable) -> Callable:
    @functools.wraps(original)
    def device_on_target(*args: Any, **kwargs: Any) -> torch.device:
        device = original(*args, **kwargs)
        if device.type in redirected_types:
            note("mesh_device")
        return translate(device)

    return device_on_target


def _philox_state_of_emulated(original: Callable) -> Callable:
    """The tracker's read of its device's generator state: Philox's seed and offset on the emulated device (on the
    cpu target; a GPU standing in has Philox itself)."""

    @functools.wraps(original)
    def _get_device_state(self: Any) -> torch.Tensor:
        if self._device.type in redirected_types and device_api.GENERATOR is not None:
            note("rng_tracker")
            return device_api.GENERATOR.philox_state()
        return original(self)

    return _get_device_state
