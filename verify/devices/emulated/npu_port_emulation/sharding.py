"""What FSDP2 (fully_shard) and DTensor ask of an emulated device, answered as the real device answers them.

An emulated device's tensors live on the target (the CPU), while its device meshes are of the face's type ("npu",
"cuda"), so that DTensor asks the face's device module for what it needs:
- fully_shard reads its mesh's device (npu:0) and checks that each parameter is there: it is told the target.
- DTensor's RNG tracker (OffsetBasedRNGTracker) reads the device generator's state as Philox's seed and offset and
  moves the offset for each shard; the emulated generator gives its state so (device_numerics.OwnGenerator
  philox_state) and draws from a stream of each (seed, offset) it is set to.
- torch.distributed asks the capability of a tensor transfer_to_npu calls a CUDA one (torch_npu.npu
  get_device_capability answers it), and Module.to_empty's memory reads zeros (patches.py).
- scaled_dot_product_attention of DTensors (a tensor-parallel model's attention, sharded by heads): the CPU's fused
  kernel (_scaled_dot_product_flash_attention_for_cpu) has no sharding rule, where a GPU's has, and every rank
  crashed; on the cpu target each rank computes its own heads' (or batch's) attention, as the GPU's rule does.
Each is a row of asked.EMULATED, named in the manifest of a run that used it.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

import torch

from . import device_api
from .asked import note, when_imported
from .target import TARGET, redirected_types, translate

# Where FSDP2 reads the device of its mesh (torch.distributed.fsdp since torch 2.6, torch.distributed._composable.fsdp
# before; the module that imports it by name imports this one first, and binds it patched) and DTensor's tracker.
_FSDP_MESH_DEVICE = ("torch.distributed.fsdp._fully_shard._fsdp_init", "torch.distributed._composable.fsdp._fsdp_init")
_RNG_TRACKER = "torch.distributed.tensor._random"
# DTensor's class (torch.distributed.tensor since torch 2.5, torch.distributed._tensor before)
_DTENSOR = ("torch.distributed.tensor._api", "torch.distributed._tensor.api")


def install() -> None:
    """Patches FSDP's and DTensor's modules when the script imports them."""
    when_imported({name: _fsdp_devices_on_target for name in _FSDP_MESH_DEVICE}
                  | {_RNG_TRACKER: _rng_tracker_on_emulated_generator}
                  | {name: _attention_of_dtensors_by_shard for name in _DTENSOR})


def _attention_of_dtensors_by_shard(module: ModuleType) -> None:
    if TARGET != "cpu":
        return  # a GPU standing in computes DTensors' attention with its own fused kernels, as the device does
    functional = torch.nn.functional
    if getattr(functional.scaled_dot_product_attention, "dtensors_by_shard", False):
        return
    original, dtensor = functional.scaled_dot_product_attention, module.DTensor

    @functools.wraps(original)
    def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                     *args: Any, **kwargs: Any) -> Any:
        tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
        if not isinstance(query, dtensor) or not _shard_local(tensors, dtensor):
            return original(query, key, value, attn_mask, *args, **kwargs)
        note("attention_by_shard")
        local = [tensor.to_local() for tensor in tensors]
        output = original(*local[:3], local[3] if attn_mask is not None else None, *args, **kwargs)
        return dtensor.from_local(output, query.device_mesh, query.placements, run_check=False)

    scaled_dot_product_attention.dtensors_by_shard = True
    functional.scaled_dot_product_attention = scaled_dot_product_attention


def _shard_local(tensors: tuple[Any, ...], dtensor: type) -> bool:
    """Whether attention over these DTensors (batch, heads, sequence, features) is each shard's own: all on one mesh
    with one placement, each replicated or sharded by batch or heads (as a tensor-parallel model's attention is)."""
    first = tensors[0]
    return all(isinstance(tensor, dtensor) and tensor.device_mesh == first.device_mesh
               and tensor.placements == first.placements for tensor in tensors) and all(
        placement.is_replicate() or (placement.is_shard() and placement.dim in (0, 1))
        for placement in first.placements)


def _fsdp_devices_on_target(module: ModuleType) -> None:
    module._get_device_from_mesh = _on_target(module._get_device_from_mesh)


def _rng_tracker_on_emulated_generator(module: ModuleType) -> None:
    tracker = module.OffsetBasedRNGTracker
    if hasattr(tracker, "_get_device_state"):  # torch 2.4's tracker reads the device's state in its own __init__
        tracker._get_device_state = _philox_state_of_emulated(tracker._get_device_state)


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
