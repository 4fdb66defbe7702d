from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from rules import (
    Case, Flag, PortRule, Safety, Severity, Unchanged, backward_receivers, dotted_name, findall, matches, own_calls,
    training_step,
)


class LossKeptAcrossSteps(PortRule):
    """Accumulate `loss.item()`, not the loss tensor, in a training loop (`total += loss` keeps every graph alive).

    ## What it does
    In a loop that calls `<loss>.backward()`, rewrites `total += loss` (and `total = total + loss`) to use
    `loss.item()`, and reports `history.append(loss)`, where `loss` is the tensor backward() was called on. In other
    loops (validation), the same for a name assigned from a loss function (`loss = criterion(out, y)`).

    ## Why
    A loss tensor carries its autograd graph. Summing it across iterations keeps every step's graph and activations
    alive: memory grows each step until the device runs out, on the NPU sooner than on a larger GPU, and the
    "total" is a tensor on the device that forces syncs (checklist C8).

    ## Safety
    Unsafe: `total` becomes a Python float; code that later calls `total.item()` or tensor methods on it must change
    too. Without --unsafe-fixes the line is reported.

    ## References
    checklist C8; PyTorch FAQ "My model reports cuda runtime error(2): out of memory" (accumulating history).
    """

    CODE = "TRN002"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C8",)
    TRIGGERS = ("backward", "loss", "criterion")
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Case(
            """
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss  # running sum
                seen = seen + loss * x.size(0)
            """,
            """
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss.item()  # running sum
                seen = seen + loss.item() * x.size(0)
            """,
            lines=[6, 7],
        ),
        Case(
            """
            def validate(model, loader):
                total_loss = 0
                for x, y in loader:
                    loss = criterion(model(x), y)
                    total_loss += loss
                return total_loss / len(loader)
            """,
            """
            def validate(model, loader):
                total_loss = 0
                for x, y in loader:
                    loss = criterion(model(x), y)
                    total_loss += loss.item()
                return total_loss / len(loader)
            """,
            lines=[5],
        ),
        Flag(
            """
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss)
            """,
            lines=[6],
        ),
        Unchanged(
            """
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss.item()
                losses.append(loss.detach())
                count += 1
                loss = loss + penalty
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._losses: list[set[str]] = []  # loss names of the enclosing training loops

    def visit_For(self, node: cst.For) -> None:
        self._enter(node)

    def visit_While(self, node: cst.While) -> None:
        self._enter(node)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        self._losses.pop()
        return updated_node

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        self._losses.pop()
        return updated_node

    def _enter(self, loop: cst.For | cst.While) -> None:
        step = training_step(loop)
        losses = backward_receivers(step) if step else _computed_losses(loop)
        self._losses.append(losses)
        if losses:
            for call in own_calls(loop):
                if matches(call, m.Call(func=m.Attribute(attr=m.Name("append")), args=[m.Arg(m.Name())])):
                    self._report_append(call)

    def _loss_names(self) -> set[str]:
        return set().union(*self._losses) if self._losses else set()

    def _report_append(self, call: cst.Call) -> None:
        name = call.args[0].value.value  # type: ignore[attr-defined]
        if name in self._loss_names():
            self.report(
                call,
                f"appending the tensor `{name}` keeps its autograd graph alive across steps",
                f"Append `{name}.item()` (or `{name}.detach()`).",
                Severity.WARNING,
            )

    def leave_AugAssign(self, original_node: cst.AugAssign, updated_node: cst.AugAssign) -> cst.AugAssign:
        if not isinstance(original_node.operator, cst.AddAssign):
            return updated_node
        return self._use_item(original_node, updated_node, "value")

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        target = original_node.targets[0].target if len(original_node.targets) == 1 else None
        value = original_node.value
        if not (isinstance(target, cst.Name) and isinstance(value, cst.BinaryOperation)):
            return updated_node
        if not (isinstance(value.operator, cst.Add) and matches(value.left, m.Name(target.value))):
            return updated_node
        return self._use_item(original_node, updated_node, "value")

    def _use_item(self, original, updated, field: str):
        names = self._loss_names() - _assigned_names(original)
        replacer = _ItemInsteadOfTensor(names)
        new_value = getattr(updated, field).visit(replacer)
        if not replacer.replaced:
            return updated
        return self.replace(
            original,
            updated,
            updated.with_changes(**{field: new_value}),
            f"accumulated {', '.join(sorted(replacer.replaced))}.item() instead of the tensor (keeps no graph)",
            "If the sum is used as a tensor later, keep it a tensor with .detach() instead.",
            severity=Severity.WARNING,
        )


def _computed_losses(loop: cst.For | cst.While) -> set[str]:
    """Outside training: names a loop assigns from a loss function (`loss = criterion(out, y)`), e.g. in validation,
    where a running `total += loss` keeps each batch's graph unless autograd is off."""
    names = set()
    for assign in findall(loop.body, m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Call())):
        callee = dotted_name(assign.value.func).rsplit(".", 1)[-1].lower()  # type: ignore[attr-defined]
        if _LOSS_FUNCTION.search(callee):
            names.add(assign.targets[0].target.value)  # type: ignore[attr-defined]
    return names


_LOSS_FUNCTION = re.compile(r"criterion|loss")


def _assigned_names(statement: cst.AugAssign | cst.Assign) -> set[str]:
    """`loss = loss + penalty` builds the loss itself: the names a statement assigns are never rewritten."""
    targets = [statement.target] if isinstance(statement, cst.AugAssign) else [t.target for t in statement.targets]
    return {target.value for target in targets if isinstance(target, cst.Name)}


class _ItemInsteadOfTensor(cst.CSTTransformer):
    """`loss` -> `loss.item()` for bare loss names that are not already an attribute's receiver or call argument."""

    def __init__(self, names: set[str]):
        super().__init__()
        self.names = names
        self.replaced: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # loss.item(), loss.detach(): already a number or graph-free

    def visit_Call(self, node: cst.Call) -> bool:
        return False  # float(loss), helper(loss): the callee decides

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node.value not in self.names:
            return updated_node
        self.replaced.add(original_node.value)
        return cst.parse_expression(f"{original_node.value}.item()")
