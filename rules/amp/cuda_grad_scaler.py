from __future__ import annotations

import libcst as cst

from rules import (
    Case, Mode, PortRule, Unchanged, argument, replace_argument_value, same_quotes, string_value, with_args,
)

_NAMES = ("torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler")


class CudaGradScaler(PortRule):
    """Give `torch.amp.GradScaler` the "npu" device: its default is "cuda", which no runtime patch changes.

    ## What it does
    In both modes, `torch.amp.GradScaler()` (also `torch.GradScaler`) called without a device gets `"npu"` as its
    first argument, and a `"cuda"` device (first argument or `device=`) becomes `"npu"`.

    ## Why
    `torch.amp.GradScaler`'s `device` defaults to "cuda" and `transfer_to_npu` does not wrap it (it redirects only
    `torch.cuda.amp.GradScaler`), so the scaler would keep its scale and overflow checks on a device the NPU run does
    not have: loss scaling (checklist C4) silently breaks or the script fails at the first `scaler.scale(loss)`.

    ## Safety
    Safe. A device held in a variable is left alone.

    ## References
    torch/amp/grad_scaler.py (`device: str = "cuda"`); torch_npu/contrib/transfer_to_npu.py wraps no GradScaler.
    """

    CODE = "AMP003"
    CHECKLIST = ("C4",)
    TRIGGERS = ("GradScaler",)
    EXAMPLES = (
        Case(
            """
            import torch
            from torch.amp import GradScaler
            scaler = torch.amp.GradScaler()  # dynamic loss scale
            scaler = GradScaler(init_scale=1024, growth_interval=100)
            scaler = torch.GradScaler("cuda", enabled=args.amp)
            scaler = GradScaler(device='cuda')
            """,
            """
            import torch
            from torch.amp import GradScaler
            scaler = torch.amp.GradScaler("npu")  # dynamic loss scale
            scaler = GradScaler("npu", init_scale=1024, growth_interval=100)
            scaler = torch.GradScaler("npu", enabled=args.amp)
            scaler = GradScaler(device='npu')
            """,
            lines=[3, 4, 5, 6],
        ),
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler(
                init_scale=2.0**16,
            )
            """,
            """
            import torch
            scaler = torch.amp.GradScaler(
                "npu",
                init_scale=2.0**16,
            )
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            other = torch.amp.GradScaler(device.type)
            legacy = torch.cuda.amp.GradScaler()
            scaler = GradScaler()
            kwargs_only = torch.amp.GradScaler(**options)
            """
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.refers_to(original_node.func, *_NAMES) or any(arg.star for arg in updated_node.args):
            return updated_node
        device = argument(updated_node, 0, "device")
        if device is None:
            new = with_args(updated_node, [cst.Arg(cst.SimpleString('"npu"')), *updated_node.args])
            return self.replace(original_node, updated_node, new, 'GradScaler without a device -> GradScaler("npu")')
        if string_value(device.value) != "cuda":
            return updated_node
        new = replace_argument_value(updated_node, device, same_quotes(device.value, "npu"))  # type: ignore[arg-type]
        return self.replace(original_node, updated_node, new, 'GradScaler("cuda") -> GradScaler("npu")')
