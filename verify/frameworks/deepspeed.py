"""DeepSpeed, as far as the project knows it so far (the sharded-training work completes it: its config file's
precision, its launcher, its loss scaler, its ranks).

Source: a script that names DeepSpeed hands backward() to its engine (`engine.backward(loss)`), whose config chooses
its mixed precision and loss scaling; `deepspeed.ops` holds CUDA kernels.
"""

from __future__ import annotations

from verify.frameworks._framework import Framework

FRAMEWORK = Framework(
    name="DeepSpeed",
    own_amp_signs=("deepspeed", "engine.backward"),
    cuda_only_imports={"deepspeed.ops": ("DeepSpeed's CUDA ops",
                                         "DeepSpeed's NPU accelerator, checking that it builds each op")},
)
