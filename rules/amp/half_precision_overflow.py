from __future__ import annotations

import builtins

import libcst as cst
import libcst.matchers as m

from rules import Case, PortRule, Settings, Unchanged, findall, keyword
from rules.amp._loss_scaling import AUTOCASTS, free_name, port_device, switched_off

_CALL = m.Call()  # kept in a constant: rules.findall compiles it once
_BUILTINS = frozenset(dir(builtins))
_DOCSTRING = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)


def _float(name: cst.BaseExpression) -> cst.BaseExpression:
    """`name.float()` for a plain name; anything else as it is (a literal, a call, an already cast value)."""
    if not isinstance(name, cst.Name):
        return name
    return cst.Call(func=cst.Attribute(value=name, attr=cst.Name("float")))


class HalfPrecisionOverflow(PortRule):
    """Keep in fp32 the statement whose op overflows or diverges in half precision, as a verify run measured it.

    ## What it does
    Only under `migrate PORT --fix-from PAIR` (the lines come from `verify`'s findings: `Settings.fp32_lines`), each
    simple statement that holds one of those lines becomes the body of
    `with torch.autocast(device_type=DEVICE, enabled=False):`, DEVICE being the port's own autocast device (the first
    `torch.autocast(...)` of the file; "npu" without one), and its tensor inputs are cast with `.float()`: the
    left-most name of an arithmetic expression (`h * 4000` -> `h.float() * 4000`; fp32 wins the type promotion),
    both names of a `@`, the first positional name given to a torch function, a module or function called by name
    (`torch.exp(h)`, `self.fc(x)`, `model(x)`), and the name a method is called on (`x.pow(2)`). A statement already
    inside an autocast that is disabled is left alone, so a second fix of the same line changes nothing. Where the op
    is computed in a function of another file of the project (`Settings.fp32_calls`: `utils.gram_matrix`, the
    function holding the op's recorded line), each statement of the port under an autocast that is on and calling it
    is kept in fp32 so, with the call's first argument cast: the port's file is the one the fix writes. Where verify
    names the module whose forward op it was (`Settings.fp32_callees`: `big` for `self.big`) and the statement calls
    it once, before any other call of the statement, that call alone is kept in fp32, on a line of its own before
    the statement (`big_fp32 = self.big(x.float())`), and the rest of the statement stays in the port's precision.
    The fix's second rung (`Settings.fp32_forwards`: where the line alone did not PASS) keeps the whole `forward`
    method holding such a line in fp32: its body (after its docstring) under one disabled autocast, every statement's
    inputs cast as above; a forward whose body is such a region already is left alone.

    ## Why
    Half precision tops out at 65504 and keeps 11 bits: `exp`, a large product or a `pow` that fp32 computes exactly
    overflows to inf (the GradScaler then skips every step) or loses the digits the loss needs. Ascend's
    mixed-precision tuning keeps such ops in fp32 (its block list); here the same is done at the user's line, which
    the capture recorded as the op's source (checklist C2: mixed precision, with the ops it cannot compute kept out).

    ## Safety
    Safe where it runs: nothing is rewritten without a line that verify named. A name cast in an operand or first
    argument position that holds a Python number or integer labels fails at `.float()`: the verify round after the
    fix shows it, and the fix report says so.

    ## References
    torch.autocast (`enabled=False` in a region: "cast the inputs to float32"); Ascend's mixed-precision block list.
    """

    CODE = "AMP201"
    CHECKLIST = ("C2",)
    TRIGGERS = ("autocast",)
    EXAMPLES = (
        Case(
            """
            import torch
            for x in loader:
                with torch.autocast(device_type="npu", dtype=torch.float16):
                    h = model(x)
                    z = torch.exp(h * 30) / 1e6
                    loss = head(z).mean()
            """,
            """
            import torch
            for x in loader:
                with torch.autocast(device_type="npu", dtype=torch.float16):
                    h = model(x)
                    with torch.autocast(device_type="npu", enabled=False):
                        z = torch.exp(h.float() * 30) / 1e6
                    loss = head(z).mean()
            """,
            lines=[5],
            fp32_lines=(5,),
        ),
        Case(
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x, w):
                    y = self.fc(x) @ w
                    return x @ w + y.pow(2)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = Net()(inputs, weights).sum()
            """,
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x, w):
                    y = self.fc(x) @ w
                    with torch.autocast(device_type="cuda", enabled=False):
                        return x.float() @ w.float() + y.float().pow(2)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = Net()(inputs, weights).sum()
            """,
            lines=[5],
            fp32_lines=(5,),
        ),
        Case(  # the op overflowed in self.big: that call alone is kept in fp32, the rest stays under autocast
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    return self.head(torch.relu(self.norm(self.big(x))))
            with torch.autocast("npu", dtype=torch.float16):
                loss = Net()(inputs).sum()
            """,
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    with torch.autocast(device_type="npu", enabled=False):
                        big_fp32 = self.big(x.float())
                    return self.head(torch.relu(self.norm(big_fp32)))
            with torch.autocast("npu", dtype=torch.float16):
                loss = Net()(inputs).sum()
            """,
            lines=[4],
            fp32_lines=(4,),
            fp32_callees=((4, "big"),),
        ),
        Case(  # ... but not where another call runs before it: the statement is kept whole
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    return self.small(x) + self.big(x)
            with torch.autocast("npu", dtype=torch.float16):
                loss = Net()(inputs).sum()
            """,
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    with torch.autocast(device_type="npu", enabled=False):
                        return self.small(x.float()) + self.big(x.float())
            with torch.autocast("npu", dtype=torch.float16):
                loss = Net()(inputs).sum()
            """,
            lines=[4],
            fp32_lines=(4,),
            fp32_callees=((4, "big"),),
        ),
        Case(  # the op overflows in a function of another file of the project: the port's calls under autocast
            """
            import torch
            from utils import gram_matrix
            gram_style = [gram_matrix(y) for y in features_style]
            for x in loader:
                with torch.autocast(device_type="npu", dtype=torch.float16):
                    features = vgg(x)
                    gram = gram_matrix(features) + 0
                    loss = mse(gram, gram_style[0])
            """,
            """
            import torch
            from utils import gram_matrix
            gram_style = [gram_matrix(y) for y in features_style]
            for x in loader:
                with torch.autocast(device_type="npu", dtype=torch.float16):
                    features = vgg(x)
                    with torch.autocast(device_type="npu", enabled=False):
                        gram = gram_matrix(features.float()) + 0
                    loss = mse(gram, gram_style[0])
            """,
            lines=[7],
            fp32_calls=("utils.gram_matrix",),
        ),
        Case(
            """
            import torch
            import utils
            with torch.autocast(device_type="npu", dtype=torch.float16):
                gram = utils.gram_matrix(features)
            """,
            """
            import torch
            import utils
            with torch.autocast(device_type="npu", dtype=torch.float16):
                with torch.autocast(device_type="npu", enabled=False):
                    gram = utils.gram_matrix(features.float())
            """,
            lines=[4],
            fp32_calls=("utils.gram_matrix",),
        ),
        Case(  # the second rung: the forward holding the line, whole
            """
            import torch
            class Block(torch.nn.Module):
                def forward(self, x):
                    \"""The block.\"""
                    h = self.fc(x)
                    return self.out(h * 4000)
            with torch.autocast("npu", dtype=torch.float16):
                loss = Block()(inputs).sum()
            """,
            """
            import torch
            class Block(torch.nn.Module):
                def forward(self, x):
                    \"""The block.\"""
                    with torch.autocast(device_type="npu", enabled=False):
                        h = self.fc(x.float())
                        return self.out(h.float() * 4000)
            with torch.autocast("npu", dtype=torch.float16):
                loss = Block()(inputs).sum()
            """,
            lines=[3],
            fp32_forwards=(6,),
        ),
        Unchanged(
            """
            import torch
            with torch.autocast(device_type="npu", dtype=torch.float16):
                with torch.autocast(device_type="npu", enabled=False):
                    z = torch.exp(h.float() * 30)
            class Block(torch.nn.Module):
                def forward(self, x):
                    with torch.autocast(device_type="npu", enabled=False):
                        return self.out(x.float() * 4000)
            def step(x):
                return x * 4000
            """,
            fp32_lines=(4,),
            fp32_forwards=(8, 10),
        ),
        Unchanged(
            """
            import torch
            with torch.autocast(device_type="npu", dtype=torch.float16):
                z = torch.exp(h * 30)
            """
        ),
    )

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return bool(settings.fp32_lines or settings.fp32_calls or settings.fp32_forwards) and super().wants(source,
                                                                                                             settings)

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        self._disabled = 0  # how many autocasts that are switched off enclose the walk
        self._enabled = 0  # ... and how many that compute in half precision
        self._device = port_device(node, self.refers_to, self.qualified_names)

    def visit_With(self, node: cst.With) -> None:
        autocast = self._autocast(node)
        self._disabled += autocast is False
        self._enabled += autocast is True

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        autocast = self._autocast(original_node)
        self._disabled -= autocast is False
        self._enabled -= autocast is True
        return updated_node

    def _autocast(self, node: cst.With) -> bool | None:
        """Whether the `with` enters an autocast that is on, one switched off (`enabled=False`), or none (None)."""
        for item in node.items:
            call = item.item
            if isinstance(call, cst.Call) and self.refers_to(call.func, *AUTOCASTS):
                return not switched_off(call)
        return None

    def _calls_kept_function(self, node: cst.CSTNode) -> bool:
        """A call of a function verify measured overflow in half precision, under an autocast that is on."""
        return bool(self._enabled and self.settings.fp32_calls) and any(
            self.refers_to(call.func, *self.settings.fp32_calls) for call in findall(node, _CALL))

    def _disabled_autocast(self) -> cst.Call:
        """`torch.autocast(device_type=DEVICE, enabled=False)` on the port's own autocast device."""
        return cst.Call(
            func=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("autocast")),
            args=[keyword("device_type", cst.SimpleString(f'"{self._device}"')),
                  keyword("enabled", cst.Name("False"))],
        )

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        span = self.file.position(original_node)
        if original_node.name.value != "forward" or not isinstance(updated_node.body, cst.IndentedBlock) or not any(
                span.start.line <= line <= span.end.line for line in self.settings.fp32_forwards):
            return updated_node
        statements = list(updated_node.body.body)
        docstring = statements[:1] if statements and m.matches(statements[0], _DOCSTRING) else []
        body = statements[len(docstring):]
        if len(body) == 1 and isinstance(body[0], cst.With) and self._autocast(body[0]) is False:
            return updated_node  # kept in fp32 whole by an earlier fix
        kept = cst.With(items=[cst.WithItem(self._disabled_autocast())],
                        body=cst.IndentedBlock(body=[statement.visit(_CastInputs(self)) for statement in body]))
        new = updated_node.with_changes(body=updated_node.body.with_changes(body=[*docstring, kept]))
        return self.replace(original_node, updated_node, new,
                            f"kept in fp32: the forward at line {span.start.line} whole, autocast disabled in it, its "
                            "inputs cast .float() (verify measured its op overflow or diverge in half precision where "
                            "its line alone was kept in fp32)", imports=[("torch", None)])

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        span = self.file.position(original_node)
        named = any(span.start.line <= line <= span.end.line for line in self.settings.fp32_lines)
        if self._disabled or not (named or self._calls_kept_function(original_node)):
            return updated_node
        autocast = self._disabled_autocast()
        callee = next((name for line, name in self.settings.fp32_callees if span.start.line <= line <= span.end.line),
                      None)
        if named and callee and (call := _first_called(original_node, callee)) is not None:
            result = free_name(self._module, f"{callee}_fp32", f"{callee}_in_fp32")
            kept = cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(result))],
                                                            value=call.visit(_CastInputs(self)))])
            new = cst.FlattenSentinel([
                cst.With(items=[cst.WithItem(autocast)], body=cst.IndentedBlock(body=[kept]),
                         leading_lines=original_node.leading_lines),
                original_node.deep_replace(call, cst.Name(result)).with_changes(leading_lines=()),
            ])
            return self.replace(original_node, updated_node, new,
                                f"kept in fp32: the call of {callee} at line {span.start.line} alone, autocast "
                                "disabled around it, its inputs cast .float() (verify measured its op overflow or "
                                "diverge in half precision)", imports=[("torch", None)], at=original_node)
        body = updated_node.with_changes(leading_lines=()).visit(_CastInputs(self))
        new = cst.With(items=[cst.WithItem(autocast)], body=cst.IndentedBlock(body=[body]),
                       leading_lines=updated_node.leading_lines)
        return self.replace(original_node, updated_node, new,
                            f"kept in fp32: autocast disabled around line {span.start.line}, its inputs cast .float() "
                            "(verify measured its op overflow or diverge in half precision)",
                            imports=[("torch", None)])


def _first_called(statement: cst.SimpleStatementLine, callee: str) -> cst.Call | None:
    """The one call of `callee` (`self.big(...)`, `big(...)`) in a statement of one small statement, where Python
    calls it before any other call of the statement (every other call holds it, or is in its arguments): it can be
    computed first, on a line of its own, without changing the order of anything it does; None otherwise."""
    if len(statement.body) != 1:
        return None
    calls = findall(statement, _CALL)
    named = [call for call in calls if m.matches(call.func, m.Name(callee) | m.Attribute(attr=m.Name(callee)))]
    if len(named) != 1:
        return None
    inside = {id(call) for call in findall(named[0], _CALL)}
    if all(id(call) in inside or any(found is named[0] for found in findall(call, _CALL)) for call in calls):
        return named[0]
    return None


class _CastInputs(cst.CSTTransformer):
    """The tensor inputs of one statement cast to float32 (positions in the rule's docstring)."""

    def __init__(self, rule: HalfPrecisionOverflow) -> None:
        super().__init__()
        self.rule = rule

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BaseExpression:
        if isinstance(updated_node.operator, cst.MatrixMultiply):
            return updated_node.with_changes(left=_float(updated_node.left), right=_float(updated_node.right))
        if isinstance(updated_node.operator, _ARITHMETIC):
            return updated_node.with_changes(left=_float(updated_node.left))
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        torch_function = self.rule.name_under(original_node.func, "torch")
        kept = bool(self.rule.settings.fp32_calls) and self.rule.refers_to(original_node.func,
                                                                           *self.rule.settings.fp32_calls)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value not in (
                "self", "torch") and func.attr.value != "float" and not (torch_function or kept):
            return updated_node.with_changes(func=func.with_changes(value=_float(func.value)))  # x.pow(2)
        called_by_name = isinstance(func, cst.Name) and func.value not in _BUILTINS
        own_module = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
        first = updated_node.args[0] if updated_node.args else None
        if first is None or first.keyword is not None or first.star or not (
                called_by_name or own_module or torch_function or kept):
            return updated_node
        return updated_node.with_changes(args=[first.with_changes(value=_float(first.value)), *updated_node.args[1:]])
