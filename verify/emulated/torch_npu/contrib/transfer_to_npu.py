"""`from torch_npu.contrib import transfer_to_npu` on the emulated NPU: cuda goes where npu goes.

As the real module does at import: cuda device arguments are sent to the npu (here, on to the emulation target),
torch.cuda and torch.cuda.amp answer with torch.npu's functions (so torch.cuda.is_available() is True), .cuda()
is .npu(), is_cuda is is_npu, nccl becomes hccl in init_process_group, and torch.jit.script returns its argument
unscripted. Names outside torch.npu's API (torch.cuda.nvtx, ...) keep their CUDA meaning and fail as on an NPU.
Not reproduced: torch.Generator/torch.Event with a cuda device, the profiler and dynamo/inductor patches, the
DoubleTensor alias, and the exemptions for transformers/accelerate/peft/trl.
"""

import sys
import warnings

import torch
import torch.distributed as dist

import torch_npu
from npu_port_emulation.target import EMULATION, TARGET, redirected_types


def _overlay(namespace: object, module: object) -> None:
    for name in module.__all__:
        setattr(namespace, name, getattr(module, name))


def _unscripted(obj: object, *args: object, **kwargs: object) -> object:
    warnings.warn("transfer_to_npu disables torch.jit.script: the object runs unscripted", RuntimeWarning, 2)
    return obj


def _unscripted_method(fn: object) -> object:
    return fn


redirected_types.add("cuda")
_overlay(torch.cuda, torch_npu.npu)
_overlay(torch.cuda.amp, torch_npu.npu.amp)
torch.Tensor.cuda = torch.Tensor.npu
torch.Tensor.is_cuda = torch.Tensor.is_npu
torch.nn.Module.cuda = torch.nn.Module.npu
if dist.is_available():
    dist.is_nccl_available = dist.is_hccl_available
torch.jit.script = _unscripted
torch.jit.script_method = _unscripted_method
print(f"npu-port: transfer_to_npu on {EMULATION}: cuda calls go to the emulated NPU on {TARGET}", file=sys.stderr)
