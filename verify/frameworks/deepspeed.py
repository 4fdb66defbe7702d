"""DeepSpeed: its engine, its config's precision and loss scaling, its loss scaler as a run follows it, its process
group set-up. What an emulated device answers for DeepSpeed's runtime is npu_port_emulation/deepspeed_runtime.py's.

Source: a script that names DeepSpeed hands backward() to its engine (`engine.backward(loss)`), whose config chooses
its mixed precision and loss scaling; `deepspeed.ops` holds CUDA kernels.
"""

from __future__ import annotations

from typing import Any, Mapping

from verify.frameworks._framework import BF16, FP16, AmpSwitch, Framework, LossScaler

_ZERO = "deepspeed.runtime.zero"

def config_precision(config: Mapping[str, Any]) -> str | None:
    """The mixed precision a DeepSpeed config switches on: its "bf16" (or "bfloat16") or "fp16" section enabled; ""
    where neither is; None where one is left to the launcher (Hugging Face's "auto")."""
    for key, dtype in (("bf16", BF16), ("bfloat16", BF16), ("fp16", FP16)):
        section = config.get(key)
        enabled = section.get("enabled") if isinstance(section, dict) else None
        if enabled == "auto":
            return None
        if enabled is True:
            return dtype
    return ""


FRAMEWORK = Framework(
    name="DeepSpeed",
    amp=(
        # the engine's precision and loss scaling are its config's (a JSON file or dict given to initialize, or
        # --deepspeed_config): chosen where the script runs
        AmpSwitch(builds=("initialize",), keywords=("config", "config_params"), mixed={}, launcher_chooses=True,
                  qualified_by="deepspeed", options=("--deepspeed_config",),
                  switch_on='"fp16": {"enabled": true} (or "bf16") in its DeepSpeed config',
                  config_precision=config_precision),
    ),
    own_amp_signs=("deepspeed", "engine.backward"),
    cuda_only_imports={"deepspeed.ops": (
        "DeepSpeed's CUDA kernels (its transformer, sparse-attention and inference ops)",
        "torch operators, or DeepSpeed's NPU accelerator where it builds the op (ds_report lists what it builds)")},
    # the optimizers its NPU accelerator provides (deepspeed/ops/op_builder/npu/): the same classes, nothing to port
    npu_provided_imports={
        "deepspeed.ops.adam": "DeepSpeed's NPU accelerator runs FusedAdam as torch._fused_adam_ and builds "
                              "DeepSpeedCPUAdam (cpu_adam) with CANN's toolkit",
        "deepspeed.ops.lamb": "DeepSpeed's NPU accelerator runs FusedLamb as torch operators",
        "deepspeed.ops.lion": "DeepSpeed's NPU accelerator runs FusedLion as torch operators and builds its CPU Lion",
    },
    # its launcher (`deepspeed --num_gpus N train.py ARGS`) runs each rank as `python train.py --local_rank=K ARGS`,
    # with the variables torchrun sets
    launcher="deepspeed",
    rank_arguments=("--local_rank={local_rank}",),
    # fp16's dynamic loss scaler: the engine's backward() scales the loss with it (ZeRO's scale_if_loss), and its
    # optimizers (ZeRO stages 1 and 2, stage 3, stage 0's fp16 one) skip the update of a step that overflowed
    loss_scalers=(
        LossScaler(scaler=("deepspeed.runtime.fp16.loss_scaler", "LossScalerBase"), scales="scale_loss",
                   scale="cur_scale", settings={"growth_factor": "scale_factor",
                             "growth_interval": "scale_window", "dynamic": "dynamic"},
                   steppers=((f"{_ZERO}.stage_1_and_2", "DeepSpeedZeroOptimizer"),
                             (f"{_ZERO}.stage3", "DeepSpeedZeroOptimizer_Stage3"),
                             ("deepspeed.runtime.fp16.fused_optimizer", "FP16_Optimizer")),
                   inner="optimizer"),
    ),
)
# Its process group set-up, which takes a backend ("nccl" on a GPU): the call and its backend parameter (keyword,
# position)
BACKEND_CALLS = {f"{package}.init_distributed": ("dist_backend", 0) for package in ("deepspeed", "deepspeed.comm")}
