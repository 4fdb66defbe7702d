from __future__ import annotations

import libcst as cst

from rules import Flag, Mode, PortRule, Safety, Severity, Unchanged

_SCRIPT = ("torch.jit.script", "torch.jit.script_method")


class TorchJitScript(PortRule):
    """Report `torch.jit.script`, which `transfer_to_npu` turns into a no-op.

    ## What it does
    Reports each `torch.jit.script` / `torch.jit.script_method` (call or decorator): as a warning in transfer mode,
    where it is disabled, and as information in explicit mode, where it is kept.

    ## Why
    `transfer_to_npu` replaces `torch.jit.script` with a function returning its argument unchanged (with a
    RuntimeWarning), so the scripted code runs eagerly: code relying on TorchScript semantics or on a saved
    scripted module behaves differently. Explicit mode leaves TorchScript in place.

    ## Safety
    Report only.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`_patch_jit_script`).
    """

    CODE = "DEV016"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("script",)
    EXAMPLES = (
        Flag(
            """
            import torch

            @torch.jit.script
            def gelu(x):
                return x * 0.5

            scripted = torch.jit.script(model)  # for export
            """,
            lines=[3, 7],
        ),
        Flag(
            """
            from torch.jit import script
            fast = script(fn)
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            traced = torch.jit.trace(model, example)
            script = "train.sh"
            """
        ),
    )

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        if self.refers_to(original_node.decorator, *_SCRIPT):
            self._flag(original_node)
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.refers_to(original_node.func, *_SCRIPT):
            self._flag(original_node)
        return updated_node

    def _flag(self, node: cst.CSTNode) -> None:
        if self.settings.mode is Mode.TRANSFER:
            self.report(
                node,
                "`transfer_to_npu` disables `torch.jit.script`: this code runs eagerly",
                "use explicit mode to keep TorchScript, or make sure eager execution is what you want",
            )
        else:
            self.report(
                node,
                "TorchScript kept: under transfer mode this would run eagerly",
                severity=Severity.INFO,
            )
