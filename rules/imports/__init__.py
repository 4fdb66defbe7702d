"""IMP: the NPU imports and CUDA-only imports."""
