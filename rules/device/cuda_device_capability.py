from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, Flag, PortRule, Safety, Severity, Unchanged, matches
from rules.device._rewrite import renamed_reference

_CAPABILITY = ("torch.cuda.get_device_capability",)
_PROPERTIES = ("torch.cuda.get_device_properties",)
# Compute capability 8.0 (Ampere) is where CUDA gained bfloat16: `>= (8, 0)` or `[0] >= 8` gates bf16.
_AMPERE = m.Tuple(elements=[m.Element(m.Integer("8")), m.Element(m.Integer("0"))])
_AMPERE_MAJOR = m.Integer("8")


class CudaDeviceCapability(PortRule):
    """Ask `torch.npu.is_bf16_supported()` where a CUDA compute capability gates bfloat16.

    ## What it does
    Rewrites the bf16 gate `torch.cuda.get_device_capability() >= (8, 0)` (also `[0] >= 8`, and `<` for the
    opposite) to `torch.npu.is_bf16_supported()`. Reports every other use of `get_device_capability()` and the
    `.major`/`.minor` of `get_device_properties(...)`.

    ## Why
    On an NPU `get_device_capability()` returns None unless `TORCH_NPU_DEVICE_CAPABILITY` is set, and NPU device
    properties have no major/minor, in both modes. Comparing None with a tuple raises TypeError.

    ## Safety
    Unsafe: the script may gate more than bf16 on Ampere (TF32, flash attention); check that bf16 is what it means.

    ## References
    torch_npu/npu/__init__.py (get_device_capability); Huawei's migration tool README, training configuration:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "DEV008"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C2", "C3")
    TRIGGERS = ("get_device_capability", "get_device_properties")
    EXAMPLES = (
        Case(
            """
            import torch
            use_bf16 = torch.cuda.get_device_capability() >= (8, 0)  # Ampere or newer
            if torch.cuda.get_device_capability(device)[0] < 8:
                dtype = torch.float16
            """,
            """
            import torch
            use_bf16 = torch.npu.is_bf16_supported()  # Ampere or newer
            if not torch.npu.is_bf16_supported():
                dtype = torch.float16
            """,
            lines=[2, 3],
        ),
        Flag(
            """
            import torch
            major, minor = torch.cuda.get_device_capability()
            if torch.cuda.get_device_properties(0).major >= 9:
                pass
            fp8 = torch.cuda.get_device_capability() >= (9, 0)
            """,
            lines=[2, 3, 5],
        ),
        Unchanged(
            """
            import torch
            name = torch.cuda.get_device_properties(0).name
            mem = torch.cuda.get_device_properties(0).total_memory
            """
        ),
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._gates: set[cst.Call] = set()

    def visit_Comparison(self, node: cst.Comparison) -> None:
        call = self._bf16_gate_call(node)
        if call is not None:
            self._gates.add(call)

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        call = self._bf16_gate_call(original_node)
        if call is None:
            return updated_node
        func, imports = renamed_reference(call.func, _CAPABILITY[0], "torch.npu.is_bf16_supported")
        new: cst.BaseExpression = cst.Call(func=func)
        if isinstance(original_node.comparisons[0].operator, cst.LessThan):
            new = cst.UnaryOperation(operator=cst.Not(), expression=new)
        new = new.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        return self.replace(
            original_node, updated_node, new, "bf16 gate on CUDA capability -> `torch.npu.is_bf16_supported()`",
            imports=imports,
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self._gates and self.refers_to(original_node.func, *_CAPABILITY):
            self.report(
                original_node,
                "`get_device_capability()` returns None on an NPU",
                "gate on `torch.npu.is_bf16_supported()` or on the feature itself",
                severity=Severity.ERROR,
            )
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        value = original_node.value
        if original_node.attr.value in ("major", "minor") and isinstance(value, cst.Call):
            if self.refers_to(value.func, *_PROPERTIES):
                self.report(
                    original_node,
                    f"NPU device properties have no `.{original_node.attr.value}`",
                    "gate on `torch.npu.is_bf16_supported()` or on the feature itself",
                    severity=Severity.ERROR,
                )
        return updated_node

    def _bf16_gate_call(self, node: cst.Comparison) -> cst.Call | None:
        """The `get_device_capability(...)` call of a `>= (8, 0)` / `[0] < 8` comparison, else None."""
        if len(node.comparisons) != 1:
            return None
        target = node.comparisons[0]
        if not isinstance(target.operator, (cst.GreaterThanEqual, cst.LessThan)):
            return None
        left = node.left
        indexed = matches(left, m.Subscript(slice=[m.SubscriptElement(m.Index(m.Integer("0")))]))
        call = left.value if indexed else left  # type: ignore[attr-defined]
        if not isinstance(call, cst.Call) or not self.refers_to(call.func, *_CAPABILITY):
            return None
        return call if matches(target.comparator, _AMPERE_MAJOR if indexed else _AMPERE) else None
