"""`from torch_npu.contrib import transfer_to_npu` on the emulated NPU: cuda goes where npu goes.

As the real module does at import: cuda device arguments are sent to the npu (here, on to the emulation target),
torch.cuda and torch.cuda.amp answer with torch.npu's functions (so torch.cuda.is_available() is True), .cuda()
is .npu(), is_cuda is is_npu, nccl becomes hccl in init_process_group, and torch.jit.script returns its argument
unscripted. Names outside torch.npu's API (torch.cuda.nvtx, ...) keep their CUDA meaning and fail as on an NPU.

Not reproduced, by name (tests/verify/test_transfer_to_npu.py reads the real module and holds every name it patches
to being patched here or listed here):
- a cuda device given to `torch.Generator` and `torch.Event`, and to the quantized, sparse and storage constructors
  `torch._empty_affine_quantized`, `torch._empty_per_channel_affine_quantized`, `torch.empty_quantized`,
  `torch._sparse_coo_tensor_unsafe`, `torch._sparse_csr_tensor_unsafe`, `torch._cudnn_init_dropout_state`,
  `torch._pin_memory`, `torch.UntypedStorage`, `torch.storage.TypedStorage.is_cuda`, `torch.get_device_module`;
- profiling and memory tooling: `torch.profiler`, `torch_npu.profiler`, `torch.cuda.memory`, `torch.npu.memory`,
  `torch._C._host_emptyCache`, `torch.cuda.caching_allocator_alloc`, `torch.cuda.list_gpu_processes`,
  `torch.cuda.utilization`, `torch.cuda.set_per_process_memory_fraction`, `torch.cuda.reset_max_memory_cached`,
  `torch.cuda.can_device_access_peer`;
- compilation, extensions and graphs: `torch._dynamo`, `torch._inductor`, `torch.utils._triton`,
  `torch.utils.cpp_extension`, `torch.cuda.CUDAGraph`, `torch._utils._get_available_device_type`;
- the float64 alias `torch.cuda.DoubleTensor` (to float32 on a real NPU: the emulation keeps float64);
- process groups beyond init_process_group: `torch.distributed.ProcessGroup._get_backend`,
  `torch.distributed.ProcessGroupNCCL`, `torch.distributed.distributed_c10d`, `torch.distributed.device_mesh`,
  `torch.distributed.fsdp`, `torch.distributed.pipelining`;
- cuda generator objects `torch.cuda.default_generators` (one CPU generator here), and the deprecated autocast
  aliases `torch.cuda.amp.autocast_mode`, `torch.get_autocast_gpu_dtype`, `torch.set_autocast_gpu_dtype`;
- the exemptions for transformers/accelerate/peft/trl.
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


def _dynamo_interface_follows(replaced: dict[int, object]) -> None:
    """torch._dynamo's CUDA device interface, imported before this module (by the emulation, before any process group:
    npu_port_emulation/device_numerics.py), bound torch.cuda's own functions and classes as its class attributes:
    each that `replaced` maps (by id) is bound to what torch.cuda now names, as a later import would bind it."""
    interfaces = sys.modules.get("torch._dynamo.device_interface")
    if interfaces is None:
        return
    cuda = interfaces.CudaInterface
    for name, value in list(vars(cuda).items()):
        bound = value.__func__ if isinstance(value, staticmethod) else value
        if id(bound) in replaced:
            now = replaced[id(bound)]
            setattr(cuda, name, staticmethod(now) if isinstance(value, staticmethod) else now)


def _unscripted(obj: object, *args: object, **kwargs: object) -> object:
    warnings.warn("transfer_to_npu disables torch.jit.script: the object runs unscripted", RuntimeWarning, 2)
    return obj


def _unscripted_method(fn: object) -> object:
    return fn


redirected_types.add("cuda")
_cuda_before = {name: getattr(torch.cuda, name) for name in torch_npu.npu.__all__ if hasattr(torch.cuda, name)}
_overlay(torch.cuda, torch_npu.npu)
_dynamo_interface_follows({id(before): getattr(torch.cuda, name) for name, before in _cuda_before.items()})
_overlay(torch.cuda.amp, torch_npu.npu.amp)
torch.cuda.random.get_rng_state = torch_npu.npu.get_rng_state  # checkpointing scripts save the cuda RNG state
torch.cuda.random.set_rng_state = torch_npu.npu.set_rng_state
torch.Tensor.cuda = torch.Tensor.npu
torch.Tensor.is_cuda = torch.Tensor.is_npu
torch.nn.Module.cuda = torch.nn.Module.npu
if dist.is_available():
    dist.is_nccl_available = dist.is_hccl_available
torch.jit.script = _unscripted
torch.jit.script_method = _unscripted_method
print(f"npu-port: transfer_to_npu on {EMULATION}: cuda calls go to the emulated NPU on {TARGET}", file=sys.stderr)
