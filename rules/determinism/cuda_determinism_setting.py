from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, Flag, PortRule, Safety, Severity, Unchanged, matches, string_value

_SWITCH = "use `torch.use_deterministic_algorithms(True)` in each training process (migrate --deterministic adds it)"


class CudaDeterminismSetting(PortRule):
    """Give `cudnn.deterministic = True` its NPU meaning; report the other CUDA-only determinism settings.

    ## What it does
    After `torch.backends.cudnn.deterministic = True` (a literal), in a file that never calls
    `torch.use_deterministic_algorithms`, inserts `torch.use_deterministic_algorithms(True, warn_only=True)`; the
    cuDNN line stays (harmless). With `--deterministic` the switch is DET003's to insert, so the line is reported
    instead. Reports a non-literal value, and the `CUBLAS_WORKSPACE_CONFIG` environment variable (any string literal
    naming it).

    ## Why
    There is no cuDNN or cuBLAS on an NPU: a script that relied on these for reproducible runs is not deterministic
    after the port, and checklist C1's run-twice check fails for reasons the code does not show. On the NPU,
    `torch.use_deterministic_algorithms(True)` is the switch: torch_npu turns it into the CANN operator determinism
    options (ACL_OP_DETERMINISTIC). `warn_only=True` keeps the cuDNN flag's leniency: an operator without a
    deterministic kernel warns instead of raising, as cuDNN's flag only ever covered cuDNN's own kernels.

    ## Safety
    Safe: the script asked for deterministic kernels. Deterministic kernels can be slower.

    ## References
    Ascend's notes on `torch.use_deterministic_algorithms`
    (<https://www.hiascend.com/document/detail/zh/Pytorch/720/apiref/PyTorchNativeapi/ptaoplist_000292.html>); PyTorch's
    reproducibility notes on the CUDA-only switches (<https://docs.pytorch.org/docs/stable/notes/randomness.html>);
    torch_npu OpCommand SetDeterministic.
    """

    CODE = "DET002"
    CHECKLIST = ("C1",)
    TRIGGERS = ("cudnn.deterministic", "CUBLAS_WORKSPACE_CONFIG")
    EXAMPLES = (
        Case(
            """
            import torch.backends.cudnn as cudnn
            if args.seed is not None:
                cudnn.deterministic = True
                cudnn.benchmark = False
            """,
            """
            import torch.backends.cudnn as cudnn
            import torch

            if args.seed is not None:
                cudnn.deterministic = True
                torch.use_deterministic_algorithms(True, warn_only=True)
                cudnn.benchmark = False
            """,
            lines=[3],
        ),
        Flag(
            """
            import os
            import torch
            torch.backends.cudnn.deterministic = args.deterministic
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            """,
            lines=[3, 4],
        ),
        Flag("import torch\ntorch.backends.cudnn.deterministic = True\n", lines=[2], deterministic=True),
        Unchanged("import torch\ntorch.use_deterministic_algorithms(True)\ntorch.backends.cudnn.deterministic = True\n"),
    )

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        assign = original_node.body[0] if len(original_node.body) == 1 else None
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return updated_node
        target = assign.targets[0].target
        if not self.refers_to(target, "torch.backends.cudnn.deterministic"):
            return updated_node
        already = "use_deterministic_algorithms" in self.file.source
        literal_true = matches(assign.value, m.Name("True"))
        if already or not literal_true or self.settings.deterministic:
            if not already:
                self.report(target, "torch.backends.cudnn.deterministic has no effect on an NPU", _SWITCH,
                            Severity.WARNING)
            return updated_node
        switch = cst.parse_statement("torch.use_deterministic_algorithms(True, warn_only=True)\n")
        return self.replace(original_node, updated_node, cst.FlattenSentinel([updated_node, switch]),
                            "cudnn.deterministic = True -> also torch.use_deterministic_algorithms(True, warn_only=True)",
                            imports=[("torch", None)], at=target)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if string_value(node) == "CUBLAS_WORKSPACE_CONFIG":
            self.report(node, "CUBLAS_WORKSPACE_CONFIG has no effect on an NPU (no cuBLAS)", _SWITCH, Severity.INFO)
