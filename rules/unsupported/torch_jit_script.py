from __future__ import annotations

import libcst as cst

from migrate.types import Mode, Safety, Severity
from rules.base import Flag, PortRule, Unchanged

_SCRIPT = ("torch.jit.script", "torch.jit.script_method")


class TorchJitScript(PortRule):
    """Warn that `transfer_to_npu` turns `torch.jit.script` into a no-op that returns the function unscripted.

    ## What it does
    Transfer mode: reports each `torch.jit.script(...)` call and `@torch.jit.script` / `@torch.jit.script_method`
    decorator.

    ## Why
    `transfer_to_npu` replaces `torch.jit.script` with a function that returns its argument (with a RuntimeWarning)
    and `script_method` with a no-op. Code that relies on the result being a `ScriptModule` (`.save()`, `.graph`,
    `.code`, `torch.jit.freeze`) breaks, and scripted control flow runs as plain Python. Explicit mode keeps
    TorchScript working.

    ## Safety
    Report-only.

    ## References
    rules-catalogue UNS-13; torch_npu/contrib/transfer_to_npu.py (jit.script patch).
    """

    CODE = "UNS009"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.TRANSFER})
    TRIGGERS = ("jit",)
    EXAMPLES = (
        Flag(
            """
            import torch
            scripted = torch.jit.script(model)
            scripted.save("model.pt")

            @torch.jit.script
            def gelu(x):
                return x * 0.5
            """,
            lines=[2, 5],
        ),
        Unchanged(
            """
            import torch
            scripted = torch.jit.script(model)
            """,
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            traced = torch.jit.trace(model, example)
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_SCRIPT):
            self._report(node)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if not isinstance(node.decorator, cst.Call) and self.refers_to(node.decorator, *_SCRIPT):
            self._report(node)

    def _report(self, node: cst.CSTNode) -> None:
        self.report(
            node,
            "under transfer_to_npu, torch.jit.script returns its argument unscripted",
            "drop the scripting for the port, or use explicit mode (migrate --mode explicit) to keep TorchScript",
            severity=Severity.WARNING,
        )
