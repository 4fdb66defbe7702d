"""torch_npu.contrib of the emulated NPU: only transfer_to_npu."""
