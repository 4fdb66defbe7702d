from __future__ import annotations

import libcst as cst

from rules.amp._loss_scaling import existing_scaler, unscale_edits
from rules.amp._step_analysis import analyse, scopes
from rules import Case, PortRule, StatementEdits, Unchanged


class GradientClippingWithoutUnscale(StatementEdits, PortRule):
    """Unscale the gradients before clipping them in a script that already scales its loss.

    ## What it does
    In a function that calls `scaler.scale(loss).backward()` and clips gradients (`clip_grad_norm_`,
    `clip_grad_value_`) without any `scaler.unscale_(...)`, inserts `scaler.unscale_(optimizer)` just before the
    first clipping of each optimizer, where `optimizer` is the one stepped after it.

    ## Why
    After `scaler.scale(loss).backward()` the gradients are multiplied by the loss scale (65536 at first): clipping
    them clips at a threshold that many times too small, so the update is almost nothing, and differently on each
    side of a GPU/NPU comparison as the scales drift apart (checklist C4).

    ## Safety
    Safe: `scaler.step()` skips its own unscaling once `unscale_` ran, so the step is unchanged except that the
    clipping now sees true gradients. Files with several GradScalers are left alone.

    ## References
    torch/amp/grad_scaler.py `unscale_`; PyTorch AMP examples, "Gradient clipping":
    <https://docs.pytorch.org/docs/stable/notes/amp_examples.html>.
    """

    CODE = "AMP102"
    CHECKLIST = ("C4",)
    TRIGGERS = ("clip_grad_",)
    EXAMPLES = (
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            for x, y in loader:
                with torch.autocast("npu"):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # keep updates small
                scaler.step(optimizer)
                scaler.update()
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            for x, y in loader:
                with torch.autocast("npu"):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # keep updates small
                scaler.step(optimizer)
                scaler.update()
            """,
            lines=[7],
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            """
        ),
        Unchanged(
            """
            import torch
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            """
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        scaler = existing_scaler(node, self.refers_to)
        if scaler is None or f"{scaler}.unscale_(" in self.file.source:
            return
        for scope in scopes(node):
            step = analyse(scope, self.qualified_names, scaler)
            if step.backwards and step.clips:
                for block, edit in unscale_edits(step, scaler):
                    self.edit(block, edit)
