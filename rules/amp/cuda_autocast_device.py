from __future__ import annotations

import libcst as cst

from migrate.types import Mode
from rules.base import Case, PortRule, Unchanged
from rules.calls import argument, replace_argument_value, same_quotes, string_value

# AMP functions whose device type is the first positional argument or `device_type=`.
_POSITIONAL = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.amp.is_autocast_available",
    "torch.is_autocast_enabled",
    "torch.set_autocast_enabled",
    "torch.get_autocast_dtype",
    "torch.set_autocast_dtype",
}
# ... and those where it is keyword-only.
_KEYWORD_ONLY = {
    f"torch.amp{module}.{name}" for module in ("", ".autocast_mode") for name in ("custom_fwd", "custom_bwd")
}


class CudaAutocastDevice(PortRule):
    """Run autocast on "npu" where the script names the "cuda" device type.

    ## What it does
    Explicit mode: in `torch.autocast(...)`, `torch.amp.autocast(...)`, `torch.is_autocast_enabled(...)`,
    `torch.get_autocast_dtype` / `set_autocast_dtype` / `set_autocast_enabled`, `torch.amp.is_autocast_available` and
    `torch.amp.custom_fwd` / `custom_bwd(device_type=...)`, the device type `"cuda"` becomes `"npu"`.

    ## Why
    Autocast state is kept per device type: autocast on "cuda" leaves NPU operators in fp32, so the port would
    silently train without mixed precision (checklist C2). `transfer_to_npu` patches these functions at run time,
    so transfer mode needs nothing here.

    ## Safety
    Safe. A device type held in a variable is left to the device rules.

    ## References
    rules-catalogue AMP-02, AMP-05; torch_npu/contrib/transfer_to_npu.py (autocast and autocast-state wrappers).
    """

    CODE = "AMP002"
    CHECKLIST = ("C2",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("autocast", "custom_fwd", "custom_bwd")
    EXAMPLES = (
        Case(
            """
            import torch
            from torch.amp import custom_fwd
            with torch.autocast("cuda", dtype=torch.float16):  # mixed precision
                out = model(x)
            with torch.amp.autocast(device_type='cuda', enabled=use_amp):
                out = model(x)
            if torch.is_autocast_enabled("cuda"):
                dtype = torch.get_autocast_dtype("cuda")

            @custom_fwd(device_type="cuda", cast_inputs=torch.float32)
            def forward(ctx, x):
                return x
            """,
            """
            import torch
            from torch.amp import custom_fwd
            with torch.autocast("npu", dtype=torch.float16):  # mixed precision
                out = model(x)
            with torch.amp.autocast(device_type='npu', enabled=use_amp):
                out = model(x)
            if torch.is_autocast_enabled("npu"):
                dtype = torch.get_autocast_dtype("npu")

            @custom_fwd(device_type="npu", cast_inputs=torch.float32)
            def forward(ctx, x):
                return x
            """,
            lines=[3, 5, 7, 8, 10],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            with torch.autocast("cuda"):
                out = model(x)
            """
        ),
        Unchanged(
            """
            import torch
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            with torch.autocast(device.type):
                out = model(x)
            with autocast("cuda"):
                pass
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        names = self.qualified_names(original_node.func)
        if not names.isdisjoint(_POSITIONAL):
            device = argument(updated_node, 0, "device_type")
        elif not names.isdisjoint(_KEYWORD_ONLY):
            device = argument(updated_node, None, "device_type")
        else:
            return updated_node
        if device is None or string_value(device.value) != "cuda":
            return updated_node  # not "cuda", or already rewritten by a device rule
        new = replace_argument_value(updated_node, device, same_quotes(device.value, "npu"))  # type: ignore[arg-type]
        return self.replace(original_node, updated_node, new, 'autocast device "cuda" -> "npu"')
