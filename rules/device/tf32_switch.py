from __future__ import annotations

import libcst as cst

from rules import Case, Flag, PortRule, Unchanged, string_value
from rules.device._rewrite import renamed_reference

# The CUDA TF32 switches (bool) and the NPU's HF32 switch with the same job.
_SWITCHES = {
    "torch.backends.cuda.matmul.allow_tf32": "torch.npu.matmul.allow_hf32",
    "torch.backends.cudnn.allow_tf32": "torch.npu.conv.allow_hf32",
}
# torch >= 2.9 spells them as a precision: "tf32" is TF32 on, "ieee" off.
_PRECISIONS = {
    "torch.backends.cuda.matmul.fp32_precision": "torch.npu.matmul.allow_hf32",
    "torch.backends.cudnn.conv.fp32_precision": "torch.npu.conv.allow_hf32",
}
_PRECISION_SWITCH = {"tf32": "True", "ieee": "False"}
# torch.set_float32_matmul_precision: "high" and "medium" let CUDA matmuls use TF32; "highest" is the default.
_MATMUL_PRECISION = "torch.set_float32_matmul_precision"
_REDUCED_MATMUL = ("high", "medium")
_WHY = "HF32 is the NPU's TF32 (10-bit mantissa fp32 inputs); the CUDA switch does nothing on an NPU"


class Tf32Switch(PortRule):
    """Give each TF32 switch its NPU meaning: the HF32 switch of the same operators, with the script's value.

    ## What it does
    - `torch.backends.cuda.matmul.allow_tf32 = <bool literal>` becomes `torch.npu.matmul.allow_hf32 = <it>`, and
      `torch.backends.cudnn.allow_tf32 = <bool literal>` becomes `torch.npu.conv.allow_hf32 = <it>`; so do torch
      2.9's `torch.backends.cuda.matmul.fp32_precision` / `torch.backends.cudnn.conv.fp32_precision` = `"tf32"`
      (True) or `"ieee"` (False). Reads of the switches are rewritten the same way.
    - `torch.set_float32_matmul_precision("high")` (or `"medium"`), which turns TF32 matmuls on under CUDA, is kept and
      followed by `torch.npu.matmul.allow_hf32 = True`, the explicit setting that keeps the original's precision.
    - A value that is not a literal (`= args.tf32`) is reported with the line to write: its meaning is the author's.

    ## Why
    The CUDA switches do nothing on an NPU, in both modes (`transfer_to_npu` does not map them), so the port silently
    computes with the NPU's defaults. These agree with CUDA's only where the script relies on the defaults: CUDA has
    matmul TF32 off and cuDNN convolution TF32 on; the NPU has matmul HF32 off (`torch.npu.matmul.allow_hf32`,
    default False) and convolution HF32 **on** (`torch.npu.conv.allow_hf32`, default True). A script that switched
    TF32 off for accuracy would still convolve in reduced precision on the NPU, and one that switched matmul TF32 on
    for speed would run its matmuls in full fp32. Which of the two sides computes in 10-bit precision decides whether
    `verify` can compare them op by op (its environment diff names the switch).

    ## Safety
    Safe for literal values: the port computes at the precision the original asked for. HF32 and TF32 round alike
    but are not bit for bit the same hardware, so results still differ at rounding level.

    ## References
    torch_npu/npu/npu_config.py (allow_hf32); Ascend's allow_hf32:
    <https://www.hiascend.com/document/detail/zh/Pytorch/700/apiref/apilist/ptaoplist_000238.html>; PyTorch's CUDA
    notes, "TensorFloat-32 (TF32) on Ampere (and later) devices":
    <https://docs.pytorch.org/docs/stable/notes/cuda.html>.
    """

    CODE = "DEV010"
    CHECKLIST = ("C3",)
    TRIGGERS = ("allow_tf32", "fp32_precision", "set_float32_matmul_precision")
    EXAMPLES = (
        Case(
            """
            import torch
            torch.backends.cuda.matmul.allow_tf32 = True  # faster matmuls
            torch.backends.cudnn.allow_tf32 = False
            """,
            """
            import torch
            torch.npu.matmul.allow_hf32 = True  # faster matmuls
            torch.npu.conv.allow_hf32 = False
            """,
            lines=[2, 3],
        ),
        Case(
            """
            import torch as th
            from torch.backends import cudnn
            cudnn.allow_tf32 = False
            print(th.backends.cuda.matmul.allow_tf32)
            th.backends.cudnn.conv.fp32_precision = "ieee"
            """,
            """
            import torch as th
            from torch.backends import cudnn
            import torch

            torch.npu.conv.allow_hf32 = False
            print(th.npu.matmul.allow_hf32)
            th.npu.conv.allow_hf32 = False
            """,
            lines=[3, 4, 5],
        ),
        Case(
            """
            import torch
            torch.set_float32_matmul_precision("high")
            torch.set_float32_matmul_precision("highest")
            """,
            """
            import torch
            torch.set_float32_matmul_precision("high")
            torch.npu.matmul.allow_hf32 = True
            torch.set_float32_matmul_precision("highest")
            """,
            lines=[2],
        ),
        Flag(
            """
            import torch
            torch.backends.cudnn.allow_tf32 = args.tf32
            torch.set_float32_matmul_precision(args.precision)
            """,
            lines=[2, 3],
        ),
        Unchanged(
            """
            import torch
            config.allow_tf32 = True
            torch.npu.conv.allow_hf32 = False
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._assigned: set[cst.CSTNode] = set()  # switches being set: leave_Assign decides, not leave_Attribute

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assigned.update(target.target for target in node.targets)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if original_node in self._assigned or original_node.attr.value != "allow_tf32":
            return updated_node
        qualified, target = self._switch(original_node, _SWITCHES)
        if target is None:
            return updated_node
        new, imports = renamed_reference(original_node, qualified, target)
        return self.replace(original_node, updated_node, new, f"`{qualified}` -> `{target}` ({_WHY})", imports=imports)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if len(original_node.targets) != 1:
            return updated_node
        switch = original_node.targets[0].target
        qualified, target = self._switch(switch, _SWITCHES)
        value = _bool_literal(original_node.value)
        if target is None:
            qualified, target = self._switch(switch, _PRECISIONS)
            value = _PRECISION_SWITCH.get(string_value(original_node.value) or "")
        if target is None:
            return updated_node
        if value is None:
            self.report(original_node, f"`{qualified}` does nothing on an NPU ({_WHY})",
                        f"set `{target} = <bool>` with the value this expression means")
            return updated_node
        new_target, imports = renamed_reference(switch, qualified, target)
        new = updated_node.with_changes(targets=[cst.AssignTarget(new_target)], value=cst.Name(value))
        message = f"`{qualified}` -> `{target} = {value}` ({_WHY})"
        return self.replace(original_node, updated_node, new, message, imports=imports)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        call = _only_call(original_node)
        if call is None or not self.refers_to(call.func, _MATMUL_PRECISION) or not call.args:
            return updated_node
        precision = string_value(call.args[0].value)
        if precision is None:
            self.report(call, f"`{_MATMUL_PRECISION}` does not set the NPU's HF32 matmuls ({_WHY})",
                        'also set `torch.npu.matmul.allow_hf32 = True` where the precision is "high" or "medium"')
            return updated_node
        if precision not in _REDUCED_MATMUL or "matmul.allow_hf32" in self.file.source:  # set already: the author's
            return updated_node
        switch = cst.parse_statement("torch.npu.matmul.allow_hf32 = True\n")
        message = f'`{_MATMUL_PRECISION}("{precision}")` allows TF32 matmuls: HF32 matmuls set to match ({_WHY})'
        return self.replace(original_node, updated_node, cst.FlattenSentinel([updated_node, switch]), message,
                            imports=[("torch", None)], at=call)

    def _switch(self, node: cst.CSTNode, table: dict[str, str]) -> tuple[str, str | None]:
        if not self.refers_to(node, *table):  # most assignments and attributes: known without resolving them
            return "", None
        for qualified in sorted(self.qualified_names(node)):
            if qualified in table:
                return qualified, table[qualified]
        return "", None


def _bool_literal(node: cst.BaseExpression) -> str | None:
    return node.value if isinstance(node, cst.Name) and node.value in ("True", "False") else None


def _only_call(line: cst.SimpleStatementLine) -> cst.Call | None:
    if len(line.body) == 1 and isinstance(line.body[0], cst.Expr) and isinstance(line.body[0].value, cst.Call):
        return line.body[0].value
    return None
