from __future__ import annotations

import libcst as cst

from rules.base import Flag, PortRule, Unchanged
from rules.calls import string_value
from rules.types import Safety, Severity

_SWITCH = "use `torch.use_deterministic_algorithms(True)` in each training process (migrate --deterministic adds it)"


class CudaDeterminismSetting(PortRule):
    """Report CUDA-only determinism settings, which have no effect on an NPU.

    ## What it does
    Reports assignments to `torch.backends.cudnn.deterministic` and the `CUBLAS_WORKSPACE_CONFIG` environment
    variable (any string literal naming it), suggesting the NPU's switch. (`cudnn.benchmark` is DEV011's.)

    ## Why
    There is no cuDNN or cuBLAS on an NPU: a script that relied on these for reproducible runs is not deterministic
    after the port, and checklist C1's run-twice check fails for reasons the code does not show.

    ## Safety
    Report-only: the settings are harmless where they are; the fix is a switch that may raise on operators without
    a deterministic kernel, which the author should choose (`--deterministic`).

    ## References
    rules-catalogue DET-02, DET-08; torch_npu determinism notes (ASC-DET).
    """

    CODE = "DET002"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C1",)
    TRIGGERS = ("cudnn.deterministic", "CUBLAS_WORKSPACE_CONFIG")
    EXAMPLES = (
        Flag(
            """
            import os
            import torch
            torch.backends.cudnn.deterministic = True
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            """,
            lines=[3, 4],
        ),
        Unchanged("import torch\ntorch.use_deterministic_algorithms(True)\n"),
    )

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if self.refers_to(node.target, "torch.backends.cudnn.deterministic"):
            self.report(node.target, "torch.backends.cudnn.deterministic has no effect on an NPU", _SWITCH, Severity.WARNING)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if string_value(node) == "CUBLAS_WORKSPACE_CONFIG":
            self.report(node, "CUBLAS_WORKSPACE_CONFIG has no effect on an NPU (no cuBLAS)", _SWITCH, Severity.INFO)
