from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged, frameworks

_QUANTIZATION = ("bitsandbytes", *frameworks.transformers.QUANTIZATION_CONFIGS)
_SWITCHES = frameworks.transformers.QUANTIZED_LOADING


class BitsandbytesQuantization(PortRule):
    """Report bitsandbytes 8/4-bit quantization and 8-bit optimizers, which have no released NPU backend.

    ## What it does
    Reports each call into `bitsandbytes` (`bnb.optim.Adam8bit`, `bnb.nn.Linear8bitLt`...), each
    `BitsAndBytesConfig(...)`, and each call passing `load_in_8bit=True` / `load_in_4bit=True`.

    ## Why
    bitsandbytes ships CUDA kernels only; its NPU backend is not released. The model must load in bf16/fp16 (or use
    an Ascend quantization tool), and an 8-bit optimizer becomes a regular `torch.optim` one: memory use rises.

    ## Safety
    Report-only.

    ## References
    <https://github.com/Ascend/pytorch/issues/10>; <https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1695>.
    """

    CODE = "UNS006"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("bitsandbytes", "BitsAndBytes", *_SWITCHES)
    EXAMPLES = (
        Flag(
            """
            import bitsandbytes as bnb
            from transformers import AutoModel, BitsAndBytesConfig
            optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4).step()
            config = BitsAndBytesConfig(load_in_4bit=True)
            model = AutoModel.from_pretrained(name, load_in_8bit=True)
            """,
            lines=[3, 4, 5],
        ),
        Unchanged(
            """
            from transformers import AutoModel
            model = AutoModel.from_pretrained(name, load_in_8bit=False, torch_dtype="auto")
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.name_under(node.func, *_QUANTIZATION)
        switched = any(
            arg.keyword is not None and arg.keyword.value in _SWITCHES and _is_true(arg.value) for arg in node.args
        )
        if name is None and not switched:
            return
        self.report(
            node,
            f"{name or 'bitsandbytes quantization'} has no NPU backend",
            "load the model in bf16/fp16 (or quantize with an Ascend tool) and use a torch.optim optimizer",
            severity=Severity.ERROR,
        )


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"
