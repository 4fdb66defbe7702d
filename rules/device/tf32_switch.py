from __future__ import annotations

from typing import Mapping

from rules.base import Case, Unchanged
from rules.device._api_rename import ApiRename
from rules.types import Safety

_RENAMES = {
    "torch.backends.cuda.matmul.allow_tf32": "torch.npu.matmul.allow_hf32",
    "torch.backends.cudnn.allow_tf32": "torch.npu.conv.allow_hf32",
}


class Tf32Switch(ApiRename):
    """Set the NPU's HF32 switches where the script sets the CUDA TF32 switches.

    ## What it does
    Rewrites `torch.backends.cuda.matmul.allow_tf32` to `torch.npu.matmul.allow_hf32` and
    `torch.backends.cudnn.allow_tf32` to `torch.npu.conv.allow_hf32`, wherever they are set or read.

    ## Why
    The CUDA switches do nothing on an NPU, in both modes. HF32 is the NPU's reduced-precision float32 mode for
    matmul and convolution, the counterpart of TF32.

    ## Safety
    Unsafe: HF32 is not TF32 bit for bit, and the NPU defaults differ (matmul HF32 off, conv HF32 on; CUDA has
    matmul TF32 off, cuDNN TF32 on), so applying the script's choice changes the NPU's numerics from its defaults.

    ## References
    rules-catalogue DEV-12; torch_npu/npu/npu_config.py (allow_hf32).
    """

    CODE = "DEV010"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C3",)
    TRIGGERS = ("allow_tf32",)
    EXAMPLES = (
        Case(
            """
            import torch
            torch.backends.cuda.matmul.allow_tf32 = True  # faster matmuls
            torch.backends.cudnn.allow_tf32 = args.tf32
            """,
            """
            import torch
            torch.npu.matmul.allow_hf32 = True  # faster matmuls
            torch.npu.conv.allow_hf32 = args.tf32
            """,
            lines=[2, 3],
        ),
        Case(
            """
            import torch as th
            from torch.backends import cudnn
            cudnn.allow_tf32 = False
            print(th.backends.cuda.matmul.allow_tf32)
            """,
            """
            import torch as th
            from torch.backends import cudnn
            import torch

            torch.npu.conv.allow_hf32 = False
            print(th.npu.matmul.allow_hf32)
            """,
            lines=[3, 4],
        ),
        Unchanged(
            """
            import torch
            torch.set_float32_matmul_precision("high")
            config.allow_tf32 = True
            """
        ),
    )

    @classmethod
    def renames(cls) -> Mapping[str, str]:
        return _RENAMES

    def describe(self, qualified: str, target: str) -> str:
        return f"`{qualified}` -> `{target}` (HF32 is the NPU's TF32; its defaults differ)"
