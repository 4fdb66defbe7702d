"""torch.npu of the emulated NPU: the device API that ported scripts call (npu_port_emulation.device_api, shared with
the CUDA stand-in), with what only the NPU has: its properties, capability, precision switches and compile modes.

matmul/conv allow_hf32 are emulated (see npu_port_emulation.reduced_precision: inputs rounded to HF32's mantissa on
cpu, TF32 on cuda), with the NPU's defaults: matmul off, convolutions on. set_compile_mode, set_option and config are
kept but not emulated; mstx's markers are no-ops. The rest of the real torch_npu.npu's public API (NOT_EMULATED)
raises npu_port_emulation.target.NotEmulated, verify's limit (exit 2 naming the emulation), never an AttributeError
that would read as the script's crash.
"""

from __future__ import annotations

import os
import re
import sys
import types
import warnings
from typing import Any, NamedTuple

import torch
from npu_port_emulation import asked, device_api
from npu_port_emulation.device_errors import as_the_device
from npu_port_emulation.device_api import *  # noqa: F401,F403  (the device API, listed in its __all__)
from npu_port_emulation.device_api import ON_CUDA, _cuda, _host_memory, _is_in_bad_fork  # noqa: F401
from npu_port_emulation.target import EMULATION, NotEmulated, device_index

from npu_port_emulation.reduced_precision import install_hf32_rounding, set_cuda_tf32
from . import amp, mstx

__all__ = [
    *device_api.__all__,
    "get_device_properties", "get_device_capability", "is_bf16_supported", "get_amp_supported_dtype",
    "set_compile_mode", "is_jit_compile_false", "set_option", "config", "matmul", "conv", "mstx",
]

# The public names of the real torch_npu.npu that this emulation does not model. No torch_npu wheel is at hand where
# this was written: the names are torch.cuda's public API (torch 2.13's and 2.14's __all__) with CUDA read as NPU,
# less those /work/shared/design/rules-catalogue.md lists as absent from torch_npu.npu.__all__, less those emulated
# above (tests/verify/test_emulated_interfaces.py walks both lists).
NOT_EMULATED = frozenset({
    "BFloat16Storage", "BFloat16Tensor", "BoolStorage", "BoolTensor", "ByteStorage", "ByteTensor", "CharStorage",
    "CharTensor", "DeferredCudaCallError", "DoubleStorage", "DoubleTensor", "ExternalStream", "FloatStorage",
    "FloatTensor", "HalfStorage", "HalfTensor", "IntStorage", "IntTensor", "LongStorage", "LongTensor", "MemPool",
    "NPUGraph", "ShortStorage", "ShortTensor", "StreamContext", "caching_allocator_alloc", "caching_allocator_delete",
    "can_device_access_peer", "change_current_allocator", "current_blas_handle", "default_generators", "device_of",
    "get_allocator_backend", "get_per_process_memory_fraction", "get_sync_debug_mode", "graph", "graph_pool_handle",
    "graphs", "host_memory_stats", "host_memory_stats_as_nested_dict", "ipc_collect", "make_graphed_callables",
    "max_memory_cached", "memory", "memory_cached", "memory_snapshot", "memory_stats_as_nested_dict", "npuStatus",
    "random", "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_cached",
    "reset_peak_host_memory_stats", "set_per_process_memory_fraction", "set_stream", "set_sync_debug_mode", "streams",
    "use_mem_pool", "utilization", "set_deterministic_level", "NPUPluggableAllocator",
    # torch 2.14's CUDA graph debugging names (torch.cuda.__all__ there)
    "export_dot", "export_graph_data", "graph_annotations",
})


def __getattr__(name: str) -> object:
    if name in NOT_EMULATED:
        raise NotEmulated(f"torch_npu.npu.{name} is not emulated by {EMULATION}: verify cannot run a script that "
                          "uses it on the emulated NPU (run it on an NPU)")
    raise as_the_device(AttributeError(f"module 'torch_npu.npu' has no attribute {name!r} ({EMULATION})"))


class NpuProperties(NamedTuple):
    """The fields of the real NPU's device properties that scripts read (it has no major/minor)."""

    name: str
    total_memory: int
    cube_core_num: int
    vector_core_num: int
    L2_cache_size: int


def get_device_properties(device: object = None) -> NpuProperties:
    index = device_index(device)
    total = _cuda.get_device_properties(index).total_memory if ON_CUDA else _host_memory()[1]
    return NpuProperties(get_device_name(index), total, cube_core_num=0, vector_core_num=0, L2_cache_size=0)


# What torch's own distributed code is told of a tensor that transfer_to_npu calls a CUDA one: c10d's broadcast
# subscripts the capability of any `is_cuda` tensor (its NCCL fp8 workaround, below 9.0), which HCCL never needs;
# torch_npu's process groups answer for their own device, so the question must not crash there.
TORCHS_OWN_CAPABILITY = (8, 0)


def get_device_capability(device: object = None) -> tuple[int, int] | None:
    """As the real torch_npu answers a script: no CUDA-style capability (None, with a warning) unless the environment
    sets TORCH_NPU_DEVICE_CAPABILITY to "major.minor", read at each call (migrate's DEV021 sets it for Lightning,
    which unpacks the answer). torch.distributed's own question is answered (TORCHS_OWN_CAPABILITY)."""
    device_index(device)
    value = os.environ.get("TORCH_NPU_DEVICE_CAPABILITY", "")
    parsed = re.fullmatch(r"(\d+)\.(\d+)", value)
    if parsed is None and _asked_by_torch_distributed():
        asked.note("capability")
        return TORCHS_OWN_CAPABILITY
    if parsed is None:
        warnings.warn(
            f"TORCH_NPU_DEVICE_CAPABILITY={value!r} is not major.minor ('8.0')" if value else
            "You can set the device capability via the environment variable TORCH_NPU_DEVICE_CAPABILITY."
        )
        return None
    return int(parsed[1]), int(parsed[2])


def _asked_by_torch_distributed() -> bool:
    """Whether the caller of get_device_capability is a module of torch.distributed (not the script)."""
    return sys._getframe(2).f_globals.get("__name__", "").startswith("torch.distributed")


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16, torch.float32]


_settings: dict[str, Any] = {"jit_compile": True, "options": {}}


def set_compile_mode(jit_compile: bool = False) -> None:
    """Kept for is_jit_compile_false(); compilation modes do not exist on the target."""
    _settings["jit_compile"] = jit_compile


def is_jit_compile_false() -> bool:
    return not _settings["jit_compile"]


def set_option(option: dict[str, str]) -> None:
    """Kept, not emulated. ACL_PRECISION_MODE=allow_fp32_to_fp16 would compute fp32 ops in fp16 on a real NPU."""
    if not isinstance(option, dict):
        raise TypeError("npu option must be a dict")
    _settings["options"].update(option)
    if option.get("ACL_PRECISION_MODE", "must_keep_origin_dtype") != "must_keep_origin_dtype":
        _warn_not_emulated(f"ACL_PRECISION_MODE={option['ACL_PRECISION_MODE']}")


def _warn_not_emulated(setting: str) -> None:
    print(f"npu-port: {setting} is not emulated: {EMULATION} computes fp32 as fp32", file=sys.stderr)


class _Hf32Flag:
    """torch.npu.matmul / torch.npu.conv: `allow_hf32`, emulated (npu_port_emulation.reduced_precision)."""

    def __init__(self, kind: str, allow_hf32: bool):
        self._kind = kind
        self.allow_hf32 = allow_hf32

    @property
    def allow_hf32(self) -> bool:
        return self._allow_hf32

    @allow_hf32.setter
    def allow_hf32(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"allow_hf32 must be a bool, but got {type(value).__name__}")
        self._allow_hf32 = value
        if ON_CUDA:
            set_cuda_tf32(self._kind, value)


# The real defaults: HF32 off for matmul, on for convolutions.
matmul = _Hf32Flag("matmul", allow_hf32=False)
conv = _Hf32Flag("conv", allow_hf32=True)
if not ON_CUDA:
    install_hf32_rounding(lambda: matmul.allow_hf32, lambda: conv.allow_hf32)
config = types.SimpleNamespace(allow_internal_format=False)
