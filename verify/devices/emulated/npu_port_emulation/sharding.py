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
import importlib.abc
import importlib.util
import sys
from types import ModuleType
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
# before; the module that imports it by name imports this one first, and binds it patched) and DTensor's tracker.
_FSDP_MESH_DEVICE = ("torch.distributed.fsdp._fully_shard._fsdp_init", "torch.distributed._composable.fsdp._fsdp_init")
_RNG_TRACKER = "torch.distributed.tensor._random"


def install() -> None:
    """Patches each module when the script imports it: importing FSDP costs seconds a process, which a run that
    never shards must not pay."""
    patches = {name: _fsdp_devices_on_target for name in _FSDP_MESH_DEVICE}
    patches[_RNG_TRACKER] = _rng_tracker_on_emulated_generator
    for name in [name for name in patches if name in sys.modules]:  # imported before the device was set up
        patches.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _PatchedWhenImported(patches))


def _fsdp_devices_on_target(module: ModuleType) -> None:
    module._get_device_from_mesh = _on_target(module._get_device_from_mesh)


def _rng_tracker_on_emulated_generator(module: ModuleType) -> None:
    tracker = module.OffsetBasedRNGTracker
    if hasattr(tracker, "_get_device_state"):  # torch 2.4's tracker reads the device's state in its own __init__
        tracker._get_device_state = _philox_state_of_emulated(tracker._get_device_state)


class _PatchedWhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module it patches, it takes the spec the other finders give and patches the module
    once its code has run, before the importer binds any of its names."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self._patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self._patches.pop(name, None)
        if patch is None:
            return None
        spec = importlib.util.find_spec(name)  # the other finders' (this one has no patch for it any more)
        if spec is not None:
            run_module = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run_module(module)
                patch(module)

            spec.loader.exec_module = exec_module
        return spec


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
