"""What DeepSpeed asks of an emulated device, answered as the host of the real device answers it.

DeepSpeed's accelerator abstraction picks its NPU accelerator where torch_npu imports, and its CUDA accelerator where
torch.cuda is available; both are what an emulated device shows. Then:
- on the NPU, every op builder reads ASCEND_HOME_PATH, which CANN's set_env.sh exports on an Ascend host: the
  emulated NPU sets it, where it is unset, to a folder that holds no CANN (DeepSpeed then says that its NPU ops
  cannot be compiled, which is so; its NPU optimizers are torch code and need no compiling);
- on CUDA, DeepSpeed's FusedAdam (its "Adam" and "AdamW"), FusedLamb and FusedLion are kernels it compiles with the
  CUDA toolkit at their first use: the emulated CUDA loads, in their place, the torch implementations DeepSpeed's NPU
  accelerator runs for them (torch._fused_adam_ and the like), with the same arguments.
Each is a row of asked.EMULATED, named in the manifest of a run that used it. DeepSpeed's other CUDA ops (cpu_adam,
its inference and sparse-attention kernels) are not emulated: a reference that builds one fails as on a GPU host
without the CUDA toolkit, saying so.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from .asked import note, when_imported

_NPU_BUILDER = "deepspeed.ops.op_builder.npu.builder"
# DeepSpeed's CUDA op builder module: (its builder class, the module and class of the torch implementation that
# DeepSpeed's NPU accelerator loads for the same op)
_CUDA_OPS_IN_TORCH = {
    "deepspeed.ops.op_builder.fused_adam": ("FusedAdamBuilder", "deepspeed.ops.op_builder.npu.fused_adam",
                                            "NPUFusedAdam"),
    "deepspeed.ops.op_builder.fused_lamb": ("FusedLambBuilder", "deepspeed.ops.op_builder.npu.fused_lamb",
                                            "NPUFusedLamb"),
    "deepspeed.ops.op_builder.fused_lion": ("FusedLionBuilder", "deepspeed.ops.op_builder.npu.fused_lion",
                                            "NPUFusedLion"),
}
# Where ASCEND_HOME_PATH points on an emulated NPU: the emulation's own folder, which holds no CANN
NO_CANN_HOME = str(Path(__file__).resolve().parent)


def install(face: str) -> None:
    """Answers DeepSpeed's questions for the emulated `face` ("npu" or "cuda") once the script imports DeepSpeed."""
    if face == "npu" and "ASCEND_HOME_PATH" not in os.environ:
        os.environ["ASCEND_HOME_PATH"] = NO_CANN_HOME
        when_imported({_NPU_BUILDER: lambda module: note("cann_home")})
    if face == "cuda":
        when_imported({name: _torch_op_for_cuda_build for name in _CUDA_OPS_IN_TORCH})


def _torch_op_for_cuda_build(module: ModuleType) -> None:
    builder_name, torch_module, torch_op = _CUDA_OPS_IN_TORCH[module.__name__]

    def load(self: Any, verbose: bool = True) -> Any:
        note("cuda_ops")
        return getattr(importlib.import_module(torch_module), torch_op)

    getattr(module, builder_name).load = load
