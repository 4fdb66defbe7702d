from __future__ import annotations

import libcst as cst

from rules import Case, PortRule, Safety, Severity, Unchanged, is_innermost_training_loop, training_step


class MissingZeroGrad(PortRule):
    """Clear gradients in a training loop that calls backward() and step() but never zero_grad().

    ## What it does
    Finds the innermost loop that calls `<loss>.backward()` and `<optimizer>.step()` (or `scaler.step(optimizer)`)
    but neither `zero_grad()` nor `p.grad = None` / `p.grad.zero_()`, and inserts `<optimizer>.zero_grad()` as the
    first statement of its body.

    ## Why
    Gradients accumulate across backward() calls. Without clearing them, every step applies the sum of all earlier
    gradients: training silently diverges from what the author meant, and a comparison of the two sides measures
    this bug rather than the port (checklist C8).

    ## Safety
    Unsafe: a loop that accumulates on purpose across iterations, clearing elsewhere (e.g. in a callback), would
    change. Without --unsafe-fixes the loop is reported.

    ## References
    checklist C8.
    """

    CODE = "TRN001"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C8",)
    TRIGGERS = ("backward",)
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Case(
            """
            for images, target in loader:
                output = model(images)
                loss = criterion(output, target)
                loss.backward()  # gradients
                optimizer.step()
            """,
            """
            for images, target in loader:
                optimizer.zero_grad()
                output = model(images)
                loss = criterion(output, target)
                loss.backward()  # gradients
                optimizer.step()
            """,
            lines=[1],
        ),
        Case(
            """
            for epoch in range(epochs):
                for x, y in loader:
                    scaler.scale(loss_fn(net(x), y)).backward()
                    scaler.step(self.opt)
                    scaler.update()
                scheduler.step()
            """,
            """
            for epoch in range(epochs):
                for x, y in loader:
                    self.opt.zero_grad()
                    scaler.scale(loss_fn(net(x), y)).backward()
                    scaler.step(self.opt)
                    scaler.update()
                scheduler.step()
            """,
            lines=[2],
        ),
        Unchanged(
            """
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accumulation
                loss.backward()
                if (i + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            """
        ),
        Unchanged(
            """
            while step < max_steps:
                loss = model(batch)
                loss.backward()
                opt.step()
                for p in model.parameters():
                    p.grad = None
            """
        ),
        Unchanged(
            """
            for x in data:
                loss = model(x)
                loss.backward()  # no optimizer step here: gradients are inspected, not applied
            """
        ),
        Unchanged(  # DeepSpeed's engine clears the gradients in its step()
            """
            for x, y in loader:
                loss = criterion(model_engine(x), y)
                model_engine.backward(loss)
                model_engine.step()
            """
        ),
    )

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return self._clear_gradients(original_node, updated_node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        return self._clear_gradients(original_node, updated_node)

    def _clear_gradients(self, original, updated):
        step = training_step(original)
        if step is None or step.zero_grad or not is_innermost_training_loop(original):
            return updated
        if not isinstance(updated.body, cst.IndentedBlock):
            return updated
        clears = [cst.parse_statement(f"{optimizer}.zero_grad()\n") for optimizer in step.optimizers]
        new = updated.with_changes(body=updated.body.with_changes(body=[*clears, *updated.body.body]))
        names = ", ".join(step.optimizers)
        return self.replace(
            original,
            updated,
            new,
            f"training loop never clears gradients: added {names}.zero_grad() at the start of each iteration",
            "Gradients accumulate across backward() calls; clear them once per optimizer step.",
            severity=Severity.WARNING,
        )
