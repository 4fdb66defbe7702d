from __future__ import annotations

import libcst as cst

from rules.amp._loss_scaling import existing_scaler, scaler_step, update_edits
from rules.amp._step_analysis import analyse, code, scopes
from rules import Case, PortRule, StatementEdits, Unchanged


class IncompleteScalerStep(StatementEdits, PortRule):
    """Step the optimizer through the GradScaler, and update the scale, in a script that scales its loss.

    ## What it does
    In a function that calls `scaler.scale(loss).backward()`:
    - `optimizer.step()` called directly becomes `scaler.step(optimizer)`;
    - when the file never calls `scaler.update()`, it is inserted after the last optimizer step of each block
      (once per iteration when several optimizers step together, only where a step ran).

    ## Why
    A direct `optimizer.step()` applies gradients still multiplied by the loss scale, and steps even when they hold
    inf/NaN. Without `update()` the scale never shrinks after an overflow (every later step is skipped) nor grows
    back (fp16 gradients underflow): checklist C4.

    ## Safety
    Safe: it only completes the protocol that the file's own `scaler.scale(...)` started. Files with several
    GradScalers are left alone.

    ## References
    torch/amp/grad_scaler.py (class docstring example).
    """

    CODE = "AMP103"
    CHECKLIST = ("C4",)
    TRIGGERS = (".scale(",)
    EXAMPLES = (
        Case(
            """
            from torch.amp import GradScaler
            scaler = GradScaler("npu")
            for x, y in loader:
                scaler.scale(criterion(model(x), y)).backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
            """
            from torch.amp import GradScaler
            scaler = GradScaler("npu")
            for x, y in loader:
                scaler.scale(criterion(model(x), y)).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
            """,
            lines=[5],
        ),
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            for x, y in loader:
                scaler.scale(loss_d).backward()
                scaler.step(opt_d)
                scaler.scale(loss_g).backward()
                scaler.step(opt_g)
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            for x, y in loader:
                scaler.scale(loss_d).backward()
                scaler.step(opt_d)
                scaler.scale(loss_g).backward()
                scaler.step(opt_g)
                scaler.update()
            """,
            lines=[7],
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            """
        ),
        Unchanged(
            """
            loss.backward()
            optimizer.step()
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._scaler = ""
        self._bypasses: set[cst.Call] = set()

    def visit_Module(self, node: cst.Module) -> None:
        scaler = existing_scaler(node, self.refers_to)
        if scaler is None:
            return
        self._scaler = scaler
        updates = f"{scaler}.update(" in self.file.source
        for scope in scopes(node):
            step = analyse(scope, self.qualified_names, scaler)
            if not step.backwards:
                continue
            self._bypasses.update(site.call for site in step.steps if code(site.call.func.value) != scaler)  # type: ignore[attr-defined]
            if not updates:
                for block, edit in update_edits(step, scaler):
                    self.edit(block, edit)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self._bypasses:
            return updated_node
        new = scaler_step(updated_node, self._scaler)
        message = f"optimizer step through the scaler: {self._scaler}.step(...)"
        return self.replace(original_node, updated_node, new, message)
