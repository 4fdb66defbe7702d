"""npu-port verify: run a GPU script and its NPU port unmodified in child processes, compare what they computed."""
