from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules.base import Flag, PortRule, Unchanged
from rules.types import Safety, Severity

_FLOAT64 = ("torch.float64", "torch.double", "torch.uint64")


class Float64Tensor(PortRule):
    """Report float64 (and uint64) tensors: NPUs support them partly and slowly.

    ## What it does
    Reports each call that asks for float64 or uint64: a `torch.float64` / `torch.double` / `torch.uint64` argument
    (`dtype=`, `.to(...)`, `torch.set_default_dtype(...)`) and `.double()`, once per call.

    ## Why
    Many NPU operators have no float64 kernel ("Unsupport data type: at::ScalarType::Double") or run it on the AI
    CPU, far slower; `transfer_to_npu` even maps `torch.cuda.DoubleTensor` to float32. A float64 result computed on the
    GPU will also differ from the port's. Keep float64 on the CPU (metrics, numpy interop) or use float32.

    ## Safety
    Report-only: whether float64 is needed is a numerical judgement.

    ## References
    rules-catalogue UNS-06; Huawei migration FAQ; transfer_to_npu.py (DoubleTensor -> FloatTensor).
    """

    CODE = "UNS004"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("float64", "double", "uint64")
    EXAMPLES = (
        Flag(
            """
            import torch
            torch.set_default_dtype(torch.float64)
            x = torch.zeros(3, dtype=torch.double, device="cuda")
            y = x.double()
            z = torch.tensor([1, 2]).to(torch.float64)
            """,
            lines=[2, 3, 4, 5],
        ),
        Unchanged(
            """
            import numpy as np
            import torch
            a = np.zeros(3, dtype=np.float64)
            if x.dtype == torch.float64:
                x = x.float()
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        wants_float64 = m.matches(node, m.Call(func=m.Attribute(attr=m.Name("double")), args=[])) or any(
            self.refers_to(arg.value, *_FLOAT64) for arg in node.args
        )
        if wants_float64:
            self.report(
                node,
                "float64/uint64 tensors are partly supported and slow on Ascend NPUs",
                "use float32 on the device, or keep this computation on the CPU",
                severity=Severity.WARNING,
            )
