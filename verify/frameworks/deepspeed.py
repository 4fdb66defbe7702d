"""DeepSpeed, as far as the project knows it so far (the sharded-training work completes it: its config file's
precision, its launcher, its loss scaler, its ranks).

Source: a script that names DeepSpeed hands backward() to its engine (`engine.backward(loss)`), whose config chooses
its mixed precision and loss scaling; `deepspeed.ops` holds CUDA kernels.
"""

from __future__ import annotations

from verify.frameworks._framework import AmpSwitch, Framework

FRAMEWORK = Framework(
    name="DeepSpeed",
    amp=(
        # the engine's precision and loss scaling are its config's (a JSON file or dict given to initialize, or
        # --deepspeed_config): chosen where the script runs
        AmpSwitch(builds=("initialize",), keywords=("config", "config_params"), mixed={}, launcher_chooses=True,
                  qualified_by="deepspeed", options=("--deepspeed_config",),
                  switch_on='"fp16": {"enabled": true} (or "bf16") in its DeepSpeed config'),
    ),
    own_amp_signs=("deepspeed", "engine.backward"),
    cuda_only_imports={"deepspeed.ops": ("DeepSpeed's CUDA ops",
                                         "DeepSpeed's NPU accelerator, checking that it builds each op")},
)
# Its process group set-up, which takes a backend ("nccl" on a GPU): the call and its backend parameter (keyword,
# position)
BACKEND_CALLS = {f"{package}.init_distributed": ("dist_backend", 0) for package in ("deepspeed", "deepspeed.comm")}
