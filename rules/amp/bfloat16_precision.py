from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged, frameworks

_BF16 = ("torch.bfloat16",)
_AUTOCAST = (
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast_mode.autocast",
)
_SET_DEFAULT_DTYPE = ("torch.set_default_dtype",)


class Bfloat16Precision(PortRule):
    """Report bf16 mixed precision, which only some Ascend chips support.

    ## What it does
    Reports autocast with `dtype=torch.bfloat16`, `torch.set_default_dtype(torch.bfloat16)` and a
    `torch_dtype=torch.bfloat16` argument (Hugging Face `from_pretrained`), once per call. A file that already
    calls `is_bf16_supported()` is taken as guarded and left alone.

    ## Why
    bf16 runs on Atlas A2/A3 (910B and newer) but not on the Atlas training series (910A), where the port fails or
    falls back. Guard it with `torch.npu.is_bf16_supported()` and keep an fp16 path, which needs a GradScaler.

    ## Safety
    Report-only.

    ## References
    torch_npu/npu/utils.py (is_bf16_supported).
    """

    CODE = "AMP004"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C2",)
    TRIGGERS = ("bfloat16",)
    EXAMPLES = (
        Flag(
            """
            import torch
            from transformers import AutoModel
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            torch.set_default_dtype(torch.bfloat16)
            model = AutoModel.from_pretrained(name, torch_dtype=torch.bfloat16)
            """,
            lines=[3, 5, 6],
        ),
        Unchanged(
            """
            import torch
            dtype = torch.bfloat16 if torch.npu.is_bf16_supported() else torch.float16
            with torch.autocast("npu", dtype=torch.bfloat16):
                out = model(x)
            """
        ),
        Unchanged(
            """
            import torch
            with torch.autocast("cuda", dtype=torch.float16):
                out = model(x)
            x = y.to(torch.bfloat16)
            """
        ),
    )

    def visit_Module(self, node: cst.Module) -> bool:
        return "is_bf16_supported" not in self.file.source  # a file that asks is guarded already: nothing to visit

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_AUTOCAST):
            wanted = {"dtype"}
        elif self.refers_to(node.func, *_SET_DEFAULT_DTYPE):
            wanted = {"dtype", None}
        else:
            wanted = set(frameworks.transformers.DTYPE_KEYWORDS)
        for arg in node.args:
            name = arg.keyword.value if arg.keyword is not None else None
            if name in wanted and self.refers_to(arg.value, *_BF16):
                self.report(
                    node,
                    "bf16 is supported on Atlas A2/A3 NPUs but not on the Atlas training series (910A)",
                    "guard it with torch.npu.is_bf16_supported() and fall back to fp16 with a GradScaler",
                    severity=Severity.WARNING,
                )
                return
