"""EMULATED CUDA: the CUDA stand-in on the CPU, for a reference that must take its GPU code path without a GPU.

After `install()`, torch.cuda.is_available() and torch.accelerator.is_available() are True, cuda devices and
tensors land on the CPU (`tensor.device` says cpu, `tensor.is_cuda` is True), torch.cuda's device API answers as one
GPU of compute capability 8.0 (bf16 supported, as on the A100 and newer), autocast("cuda") is CPU autocast with
CUDA's float16 default and CUDA's op lists (a recurrent layer, which cuDNN runs in float16, computed in float32
and rounded: autocast_policy.COMPUTED_IN_FLOAT32), GradScaler("cuda") scales on the CPU, nccl runs as gloo, and fp32
convolutions and matmuls round their inputs to TF32 where torch.backends allows it (convolutions by default, as
cuDNN does). So a script that branches on CUDA (shuffling, workers, pin_memory, its AMP dtype) reads the same data
and takes the same branches as on a real GPU. Its products and sums add their partial results in an order of their
own, and its dropout masks come from a generator of its own (device_numerics.py; off with --exact-emulation). Not
reproduced: GPU kernels' other numerics (cuDNN algorithms, the order of other reductions, atomics), memory
statistics (0), torch.Generator(device="cuda"), CUDA graphs and CUDA extensions; NVTX markers are no-ops.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch

from . import device_api, device_numerics
from .autocast_policy import install_npu_autocast_policy
from .patches import (
    install_accelerator,
    install_amp_patches,
    install_device_index,
    install_device_patches,
    install_distributed_patches,
)
from .reduced_precision import install_hf32_rounding
from .target import TARGET, NoMarkers, device_index, redirected_types

EMULATION = "npu-port's EMULATED CUDA (a test double on the CPU, not a GPU)"
CAPABILITY = (8, 0)


class CudaProperties(NamedTuple):
    """The fields of torch.cuda.get_device_properties() that scripts read."""

    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int


def get_device_properties(device: object = None) -> CudaProperties:
    index = device_index(device)
    return CudaProperties(device_api.get_device_name(index), device_api._host_memory()[1], *CAPABILITY,
                          multi_processor_count=1)


def get_device_capability(device: object = None) -> tuple[int, int]:
    device_index(device)
    return CAPABILITY


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_arch_list() -> list[str]:
    return []


CUDA_ONLY = {"get_device_properties": get_device_properties, "get_device_capability": get_device_capability,
             "is_bf16_supported": is_bf16_supported, "get_arch_list": get_arch_list}

_installed: list[object] = []  # what must stay alive: the autocast policy's registrations


def install() -> None:
    """Makes this process's torch see the CUDA GPUs verify presents (target.device_count()), all computing on the CPU.
    Once per process."""
    if _installed:
        return
    if TARGET != "cpu":
        raise RuntimeError(f"{EMULATION} computes on the CPU only (the emulation target is {TARGET})")
    redirected_types.add("cuda")
    device_api.become("CUDA")
    for name in device_api.__all__:
        setattr(torch.cuda, name, getattr(device_api, name))
        if hasattr(torch.cuda.random, name):  # its generator's functions, which Megatron calls by this module's name
            setattr(torch.cuda.random, name, getattr(device_api, name))
    for name, function in CUDA_ONLY.items():
        setattr(torch.cuda, name, function)
    torch.cuda._is_in_bad_fork = device_api._is_in_bad_fork
    torch.cuda.nvtx._nvtx = NoMarkers()  # a CPU build's stub raises "NVTX functions not installed"
    install_device_patches("cuda")
    install_device_index("cuda")
    install_amp_patches()
    install_distributed_patches("cuda")
    install_accelerator("cuda", device_api)
    _installed.append(install_npu_autocast_policy())
    # TF32 as a GPU computes it (10-bit mantissa inputs) wherever torch.backends allows it: convolutions by default
    install_hf32_rounding(lambda: torch.backends.cuda.matmul.allow_tf32, lambda: torch.backends.cudnn.allow_tf32)
    device_numerics.install("CUDA", device_api.GENERATOR)  # its own summation order and generator
    print(f"npu-port: {EMULATION}: cuda calls run on the CPU", file=sys.stderr)
