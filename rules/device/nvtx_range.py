from __future__ import annotations

from typing import Mapping

import libcst as cst

from rules import Case, Flag, Unchanged
from rules.device._api_rename import ApiRename

_RENAMES = {
    f"torch.cuda.nvtx.{name}": f"torch_npu.npu.mstx.{name}"
    for name in ("range_push", "range_pop", "range_start", "range_end", "mark")
}
_UNPORTED = ("torch.cuda.nvtx.range", "torch.autograd.profiler.emit_nvtx")


class NvtxRange(ApiRename):
    """Mark ranges with torch_npu's mstx where the script marks them with NVTX.

    ## What it does
    Rewrites `torch.cuda.nvtx.range_push/range_pop/range_start/range_end/mark` to the same functions of
    `torch_npu.npu.mstx` (adding `import torch_npu`). Reports `torch.cuda.nvtx.range(...)` and
    `torch.autograd.profiler.emit_nvtx(...)`, which have no one-to-one counterpart.

    ## Why
    NVTX markers need the CUDA runtime and `transfer_to_npu` does not translate them, so in both modes they fail on
    an NPU host. mstx is the NPU profiler's marker API.

    ## Safety
    Safe: markers only annotate profiles; the computation does not change.

    ## References
    torch_npu/npu/mstx.py.
    """

    CODE = "DEV012"
    CHECKLIST = ("C3",)
    TRIGGERS = ("nvtx",)
    EXAMPLES = (
        Case(
            """
            import torch
            torch.cuda.nvtx.range_push("forward")  # profile the step
            out = model(x)
            torch.cuda.nvtx.range_pop()
            """,
            """
            import torch
            import torch_npu

            torch_npu.npu.mstx.range_push("forward")  # profile the step
            out = model(x)
            torch_npu.npu.mstx.range_pop()
            """,
            lines=[2, 4],
        ),
        Case(
            """
            from torch.cuda import nvtx
            nvtx.mark("epoch")
            """,
            """
            from torch.cuda import nvtx
            import torch_npu

            torch_npu.npu.mstx.mark("epoch")
            """,
            lines=[2],
        ),
        Flag(
            """
            import torch
            with torch.cuda.nvtx.range("step {}", i):
                pass
            with torch.autograd.profiler.emit_nvtx():
                pass
            """,
            lines=[2, 4],
        ),
        Unchanged(
            """
            import nvtx
            nvtx.push_range("step")
            print("nvtx markers")
            """
        ),
    )

    @classmethod
    def renames(cls) -> Mapping[str, str]:
        return _RENAMES

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.refers_to(original_node.func, *_UNPORTED):
            self.report(
                original_node,
                "NVTX ranges have no mstx counterpart of this form",
                "wrap the block in `torch_npu.npu.mstx.range_push(msg)` / `range_pop()`",
            )
        return updated_node
