"""Everything that runs inside the training process and imports torch: the bootstrap that runs the user's script
unmodified, the op capture (a TorchDispatchMode), tensor statistics (with the C fast path, `_stats.c`), the step
recorder, the module paths, the imposed autocast, the aligned random streams and the ranks a script spawns.

Only this package and `verify.devices.setup` import torch (tests/test_layering.py)."""
