from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Unchanged


class ChannelsLast(PortRule):
    """Report `torch.channels_last` memory formats, which the NPU port does not support.

    ## What it does
    Reports each reference to `torch.channels_last` (and `channels_last_3d`): `model.to(memory_format=...)`,
    `x.contiguous(memory_format=...)`, `torch.empty(..., memory_format=...)`.

    ## Why
    Huawei's migration notes say channels_last is not supported by the automatic port; the NPU chooses its own
    internal formats (`torch.npu.config.allow_internal_format`). Plain `contiguous()` is the portable form.

    ## Safety
    Report only: dropping the format is usually right but changes strides a script might rely on.

    ## References
    Huawei's migration tool README, notes on the automatic migration (注意事项):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>;
    torch_npu/npu/npu_config.py (allow_internal_format).
    """

    CODE = "DEV015"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("channels_last",)
    EXAMPLES = (
        Flag(
            """
            import torch
            model = model.to(memory_format=torch.channels_last)  # faster convs on GPU
            x = x.contiguous(memory_format=torch.channels_last_3d)
            """,
            lines=[2, 3],
        ),
        Unchanged(
            """
            import torch
            x = x.contiguous()
            channels_last = False
            print("channels_last is off")
            """
        ),
    )

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if self.refers_to(original_node, "torch.channels_last", "torch.channels_last_3d"):
            self.report(
                original_node,
                f"`{original_node.attr.value}` memory format is not supported by the NPU port",
                "drop `memory_format=` (use plain `.contiguous()`); the NPU picks its own internal format",
            )
        return updated_node
