from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged, argument, string_value

_INITIALIZE = "apex.amp.initialize"


class ApexAmp(PortRule):
    """Report apex.amp mixed precision: it needs Ascend's apex build, or a port to torch.autocast + GradScaler.

    ## What it does
    Reports `amp.initialize(...)` (with its `opt_level`) as a warning, and every other `apex.amp` call
    (`amp.scale_loss`, `amp.master_params`, `amp.state_dict`...) as information, once per call.

    ## Why
    NVIDIA's apex is built on CUDA kernels. Ascend maintains its own apex (O1/O2, static or dynamic loss scale,
    `combine_grad=True`), which must be installed instead; or the script moves to native AMP:
    `torch.autocast("npu")` around forward and loss, `torch.amp.GradScaler("npu")` around backward and the step.
    O1 maps onto native AMP directly; O2/O3 (fp16 master weights) have no exact native equivalent. DDP must wrap the
    model after `amp.initialize`.

    ## Safety
    Report-only: the port changes how the loss is scaled and where weights are kept.

    ## References
    Ascend's apex README: <https://gitcode.com/Ascend/apex/blob/master/README.en.md>; Huawei's migration tool README,
    FAQ (DDP after amp.initialize):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "AMP005"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C2", "C4")
    TRIGGERS = ("apex",)
    EXAMPLES = (
        Flag(
            """
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
            with amp.scale_loss(loss, optimizer) as scaled_loss:  # loss scaling
                scaled_loss.backward()
            """,
            lines=[2, 3],
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            amp = AmpHelper()
            amp.initialize(model)
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.name_under(node.func, "apex.amp")
        if name is None:
            return
        if name != _INITIALIZE:
            self.report(node, f"{name} belongs to apex.amp", "see the amp.initialize finding", severity=Severity.INFO)
            return
        level = argument(node, None, "opt_level")
        level_text = string_value(level.value) if level is not None else "O1"
        advice = (
            'O1 maps onto torch.autocast("npu") + torch.amp.GradScaler("npu")'
            if level_text in ("O0", "O1")
            else f"{level_text or 'this opt_level'} keeps fp16 master weights: no exact native equivalent"
        )
        self.report(
            node,
            f"apex.amp ({level_text or 'opt_level from a variable'}) needs Ascend's apex build on NPU",
            f"install Ascend apex, or port to native AMP: {advice}",
            severity=Severity.WARNING,
        )
