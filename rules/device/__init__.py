"""DEV: cuda devices and APIs, and the switches transfer_to_npu leaves alone."""
