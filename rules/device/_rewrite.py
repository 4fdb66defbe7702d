"""Building blocks the device rules share: cuda device values turned into npu ones, and API references renamed."""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from rules import Body, findall

# Names of variables, attributes, parameters and keywords that hold a device: device, dev, args.device,
# train_device, device_type, pin_memory_device ...
_DEVICE_NAME = re.compile(r"(?:^|_)(?:device|dev)(?:_type|_name)?$", re.IGNORECASE)

# "cuda", "cuda:0", and the templates that become one: "cuda:" + str(i), "cuda:%d" % i, "cuda:{}".format(i).
_CUDA_DEVICE = re.compile(r"^cuda(?::(?:\d+|%[dis]|\{\w*\})?)?$")


def is_device_name(name: str) -> bool:
    return bool(_DEVICE_NAME.search(name))


def retarget(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`expr` with each cuda device string in it made an npu one; None when it holds none.

    Looks through the shapes a device value takes: literals, f-strings, `+`/`%`/`.format` templates, conditional
    expressions, `or` defaults, lists and tuples of devices, and the values (never the keys) of a dict.
    """
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        if isinstance(value, str) and _CUDA_DEVICE.match(value) and "cuda" in expr.value:
            return expr.with_changes(value=expr.value.replace("cuda", "npu", 1))
        return None
    if isinstance(expr, cst.FormattedString):
        first = expr.parts[0] if expr.parts else None
        if isinstance(first, cst.FormattedStringText) and _CUDA_DEVICE.match(first.value):
            return expr.with_changes(parts=[first.with_changes(value="npu" + first.value[4:]), *expr.parts[1:]])
        return None
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Modulo)):
        left = retarget(expr.left)
        return expr.with_changes(left=left) if left else None
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format":
        template = retarget(expr.func.value)
        return expr.with_changes(func=expr.func.with_changes(value=template)) if template else None
    if isinstance(expr, cst.IfExp):
        return _rebuild(expr, body=retarget(expr.body), orelse=retarget(expr.orelse))
    if isinstance(expr, cst.BooleanOperation):
        return _rebuild(expr, left=retarget(expr.left), right=retarget(expr.right))
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        elements = [_retarget_element(element) for element in expr.elements]
        if not any(new is not old for new, old in zip(elements, expr.elements)):
            return None
        return expr.with_changes(elements=elements)
    if isinstance(expr, cst.Dict):
        elements = [
            element.with_changes(value=retarget(element.value))
            if isinstance(element, cst.DictElement) and retarget(element.value)
            else element
            for element in expr.elements
        ]
        if not any(new is not old for new, old in zip(elements, expr.elements)):
            return None
        return expr.with_changes(elements=elements)
    return None


def _retarget_element(element: cst.BaseElement) -> cst.BaseElement:
    new = retarget(element.value)
    return element.with_changes(value=new) if new else element


def _rebuild(expr: cst.CSTNode, **parts: cst.BaseExpression | None) -> cst.BaseExpression | None:
    changed = {field: value for field, value in parts.items() if value is not None}
    return expr.with_changes(**changed) if changed else None  # type: ignore[return-value]


def renamed_reference(
    node: cst.BaseExpression, qualified: str, target: str
) -> tuple[cst.BaseExpression, tuple[tuple[str, None], ...]]:
    """An expression for `target` to put where `node`, a reference to `qualified`, stands; and the imports it needs.

    The way the source spelled the package is kept: with `import torch as th`, `th.cuda.synchronize` becomes
    `th.npu.synchronize`. A reference through an alias of a submodule (`import torch.cuda as tc; tc.synchronize`)
    or through a package the target does not share is written out in full (`torch.npu.synchronize`).
    """
    written = (get_full_name_for_node(node) or "").split(".")
    meant = qualified.split(".")
    shared = 0
    while shared < min(len(written), len(meant)) and written[-1 - shared] == meant[-1 - shared]:
        shared += 1
    alias, package = written[: len(written) - shared], meant[: len(meant) - shared]
    wanted = target.split(".")
    imports: tuple[tuple[str, None], ...] = ()
    if len(alias) == len(package) and wanted[: len(package)] == package:
        new = alias + wanted[len(package) :]
        if not alias and wanted[0] != meant[0]:
            imports = ((wanted[0], None),)
    else:
        new = wanted
        imports = ((wanted[0], None),)
    expression = cst.parse_expression(".".join(new))
    if isinstance(node, (cst.Name, cst.Attribute)):
        expression = expression.with_changes(lpar=node.lpar, rpar=node.rpar)
    return expression, imports


def statement_holding(module: cst.Module, call: cst.Call) -> tuple[Body, int] | None:
    """The statement list and the index of the simple statement that holds `call`, else None (a default value)."""
    blocks: list[Body] = [module, *findall(module, m.IndentedBlock())]  # type: ignore[list-item]
    for block in blocks:
        for index, line in enumerate(block.body):
            if isinstance(line, cst.SimpleStatementLine) and any(c is call for c in findall(line, m.Call())):
                return block, index
    return None


def capability_statement(reader: str) -> str:
    """The line that gives torch_npu's get_device_capability() an answer (None otherwise), a launcher's own value
    winning; `reader` says who unpacks it."""
    return f'os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # {reader}'
