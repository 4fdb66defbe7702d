from __future__ import annotations

import re

import libcst as cst

from rules import Case, PortRule, Unchanged, same_quotes, string_value

_CUDA_TYPE = re.compile(r"^torch\.cuda\.(\w+Tensor)$")


def _npu_type(node: cst.BaseExpression) -> cst.SimpleString | None:
    """`'torch.npu.HalfTensor'` for a literal `'torch.cuda.HalfTensor'`, else None."""
    value = string_value(node)
    if not isinstance(node, cst.SimpleString) or value is None or not _CUDA_TYPE.match(value):
        return None
    return same_quotes(node, value.replace("torch.cuda.", "torch.npu.", 1))


class CudaTensorTypeString(PortRule):
    """Name `torch.npu.*Tensor` where a type string names `torch.cuda.*Tensor`.

    ## What it does
    Rewrites `"torch.cuda.<T>Tensor"` to `"torch.npu.<T>Tensor"` where the string is a tensor type: the argument of
    `.type(...)` and of `torch.set_default_tensor_type(...)`, and either side of a comparison (`x.type() == ...`).

    ## Why
    `transfer_to_npu` patches the typed-tensor classes but not type names written as strings, so
    `.type("torch.cuda.HalfTensor")` still asks for CUDA, and `x.type()` of an NPU tensor says "torch.npu...".

    ## Safety
    Safe. `torch.set_default_tensor_type` is deprecated: prefer `torch.set_default_device("npu")` with
    `torch.set_default_dtype(...)`. The class form `torch.cuda.FloatTensor` is DEV001's.

    ## References
    torch_npu/contrib/transfer_to_npu.py (it patches the typed-tensor classes, not type names in strings); MindStudio
    "Replace Unsupported APIs" (set_default_tensor_type):
    <https://www.hiascend.com/doc_center/source/zh/mindstudio/500/msug/msug_000049.html>.
    """

    CODE = "DEV007"
    CHECKLIST = ("C3",)
    TRIGGERS = ("torch.cuda.",)
    EXAMPLES = (
        Case(
            """
            import torch
            torch.set_default_tensor_type('torch.cuda.FloatTensor')  # everything on the card
            h = x.type("torch.cuda.HalfTensor")
            if h.type() == "torch.cuda.HalfTensor":
                pass
            """,
            """
            import torch
            torch.set_default_tensor_type('torch.npu.FloatTensor')  # everything on the card
            h = x.type("torch.npu.HalfTensor")
            if h.type() == "torch.npu.HalfTensor":
                pass
            """,
            lines=[2, 3, 4],
        ),
        Unchanged(
            """
            import torch
            print("torch.cuda.FloatTensor is deprecated")
            names = ["torch.cuda.FloatTensor"]
            y = x.type(torch.float16)
            """
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        is_type_call = isinstance(original_node.func, cst.Attribute) and original_node.func.attr.value == "type"
        if not (is_type_call or self.refers_to(original_node.func, "torch.set_default_tensor_type")):
            return updated_node
        if not updated_node.args or (new := _npu_type(updated_node.args[0].value)) is None:
            return updated_node
        args = [updated_node.args[0].with_changes(value=new), *updated_node.args[1:]]
        message = f"tensor type -> {new.value}"
        return self.replace(original_node, updated_node, updated_node.with_changes(args=args), message)

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.Comparison:
        left = _npu_type(updated_node.left)
        right = [_npu_type(target.comparator) for target in updated_node.comparisons]
        if left is None and not any(right):
            return updated_node
        targets = [
            target.with_changes(comparator=new) if new else target
            for target, new in zip(updated_node.comparisons, right)
        ]
        new = updated_node.with_changes(left=left or updated_node.left, comparisons=targets)
        return self.replace(original_node, updated_node, new, "tensor type `torch.cuda.*` -> `torch.npu.*`")
