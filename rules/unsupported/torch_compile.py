from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged, frameworks

_COMPILE = frameworks.torch_compile.COMPILE_CALLS


class TorchCompile(PortRule):
    """Report `torch.compile`: on NPU its default inductor path is immature; prefer eager or torchair.

    ## What it does
    Reports each `torch.compile(...)` call and each bare `@torch.compile` decorator (also `torch._dynamo.optimize`).

    ## Why
    On Ascend, inductor generates kernels through triton-ascend, which is still fragile, and graph capture adds its
    own numerical differences. For a first port, run eager (remove the call, or `torch.compile(..., disable=True)`)
    so `verify` compares like with like; later, try `backend="npu"` (torchair) or `"npugraph_ex"`.

    ## Safety
    Report-only: npu-port never adds or removes compilation on its own.

    ## References
    torch_npu's entry_points.txt (dynamo backends npu, npugraph_ex, npugraphs);
    <https://github.com/triton-lang/triton-ascend/issues/424>,
    <https://github.com/triton-lang/triton-ascend/issues/808>.
    """

    CODE = "UNS007"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("compile", "_dynamo")
    EXAMPLES = (
        Flag(
            """
            import torch
            model = torch.compile(model, mode="max-autotune")

            @torch.compile
            def step(x):
                return x * 2
            """,
            lines=[2, 4],
        ),
        Unchanged(
            """
            import re
            pattern = re.compile(r"\\d+")
            code = compile(source, "f.py", "exec")
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_COMPILE):
            self._report(node)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if not isinstance(node.decorator, cst.Call) and self.refers_to(node.decorator, *_COMPILE):
            self._report(node)

    def _report(self, node: cst.CSTNode) -> None:
        self.report(
            node,
            "torch.compile on NPU goes through triton-ascend, which is still fragile",
            'run eager for the first port and verification; then try backend="npu" (torchair)',
            severity=Severity.WARNING,
        )
