"""Which `torch.cuda` names torch_npu provides under `torch.npu`, and which it does not.

The tables are static facts: the diff of torch 2.13 `torch.cuda.__all__` (torch/cuda/__init__.py) against torch_npu
2.13 `torch_npu.npu.__all__` (torch_npu/npu/__init__.py). Rules must not import torch, so the lists are written out.
"""

from __future__ import annotations

# Present in both namespaces with the same meaning: `torch.cuda.X` -> `torch.npu.X`.
SHARED = frozenset(
    """
    BFloat16Storage BFloat16Tensor BoolStorage BoolTensor ByteStorage ByteTensor CharStorage CharTensor
    DoubleStorage DoubleTensor Event FloatStorage FloatTensor HalfStorage HalfTensor IntStorage IntTensor
    LongStorage LongTensor MemPool ShortStorage ShortTensor Stream StreamContext caching_allocator_alloc
    caching_allocator_delete can_device_access_peer change_current_allocator current_blas_handle current_device
    current_stream default_stream device device_count device_of empty_cache get_allocator_backend get_device_name
    get_device_properties get_per_process_memory_fraction get_rng_state get_rng_state_all get_sync_debug_mode
    host_memory_stats host_memory_stats_as_nested_dict init initial_seed ipc_collect is_available
    is_bf16_supported is_initialized manual_seed manual_seed_all max_memory_allocated max_memory_cached
    max_memory_reserved mem_get_info memory_allocated memory_cached memory_reserved memory_snapshot memory_stats
    memory_stats_as_nested_dict memory_summary reset_accumulated_host_memory_stats reset_accumulated_memory_stats
    reset_max_memory_allocated reset_max_memory_cached reset_peak_host_memory_stats reset_peak_memory_stats seed
    seed_all set_device set_per_process_memory_fraction set_rng_state set_rng_state_all set_stream
    set_sync_debug_mode stream synchronize use_mem_pool utilization
    """.split()
) | {"default_generators"}  # not in torch_npu's __all__, but torch_npu/npu/__init__.py defines it

# `torch.cuda.memory.X` with a `torch.npu.memory.X` counterpart (the memory-history tools among them).
MEMORY = frozenset({"_record_memory_history", "_snapshot", "_dump_snapshot"}) | frozenset(
    name for name in SHARED if "memory" in name or name in {"empty_cache", "caching_allocator_alloc"}
)

# CUDA graph capture: torch_npu has the same API with NPUGraph in place of CUDAGraph.
GRAPHS = {
    "CUDAGraph": "NPUGraph",
    "graph": "graph",
    "graph_pool_handle": "graph_pool_handle",
    "make_graphed_callables": "make_graphed_callables",
    "is_current_stream_capturing": "is_current_stream_capturing",
}

# No NPU counterpart: these stay bound to the CUDA implementation and fail on an NPU host, in both modes.
# Each maps to what a person can use instead ("" when there is nothing to suggest).
CUDA_ONLY = {
    "CUDAPluggableAllocator": "torch.npu.NPUPluggableAllocator, with an allocator library built for the NPU",
    "ComplexDoubleStorage": "",
    "ComplexFloatStorage": "",
    "CudaError": "",
    "ExternalStream": "",
    "GreenContext": "",
    "caching_allocator_disabled": "",
    "caching_allocator_enable": "",
    "check_error": "",
    "clock_rate": "`npu-smi info`",
    "comm": "torch.distributed collectives over hccl",
    "cudart": "",
    "current_solver_handle": "",
    "device_memory_used": "torch.npu.mem_get_info()",
    "get_arch_list": "",
    "get_gencode_flags": "",
    "get_stream_from_external": "",
    "has_half": "",
    "has_magma": "",
    "is_tf32_supported": "torch.npu.matmul.allow_hf32 (HF32 is the NPU's reduced-precision float32 mode)",
    "jiterator": "",
    "list_gpu_processes": "`npu-smi info`",
    "memory_usage": "torch.npu.mem_get_info()",
    "nccl": "torch.distributed collectives over hccl",
    "power_draw": "`npu-smi info`",
    "profiler": "torch_npu.profiler",
    "sparse": "",
    "temperature": "`npu-smi info`",
    "tunable": "",
}
