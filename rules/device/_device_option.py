"""The script's device option (`add_argument("--device", default="cuda")`) and whether its port defaults it to "npu".

DEV020 makes that choice; DEV006 needs it too: once the option says "npu", each comparison of a device with "cuda"
that has no "npu" arm takes its other branch on the NPU.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from rules import argument, dotted_name, findall, matches, string_value
from rules.device._rewrite import retarget

NPU_DEVICE = re.compile(r"^npu(?::\d+)?$")
_ADD_ARGUMENT = m.Call(func=m.Attribute(attr=m.Name("add_argument")))
_NAMES = m.SimpleString() | m.Attribute()  # where a script names a device


def cuda_default(call: cst.Call) -> cst.Arg | None:
    """The `default=` of an argparse option whose default is a cuda device; None for any other call."""
    if not matches(call, _ADD_ARGUMENT):
        return None
    default = argument(call, None, "default")
    return default if default is not None and retarget(default.value) is not None else None


class DeviceOptions:
    """What a module's device options become in its transfer-mode port; asked per option, found once per module."""

    def __init__(self, module: cst.Module) -> None:
        self._module = module
        self._npu_named: bool | None = None

    def why_default_stays(self, call: cst.Call) -> str:
        """Why the cuda default of option `call` stays in the port; "" when it becomes "npu"."""
        choices = argument(call, None, "choices")
        if choices is not None and not any(NPU_DEVICE.match(value) for value in strings([choices.value])):
            return 'its choices lack "npu"'
        if not self._names_npu():
            return "the script names no npu device of its own"
        compared = _compared_values(self._module, _dest(call))
        if any(value.startswith("cuda") for value in compared) and not any(NPU_DEVICE.match(v) for v in compared):
            return 'the script compares its value with "cuda" and never with "npu"'
        return ""

    def any_defaults_to_npu(self) -> bool:
        """Whether the port defaults any device option to "npu" (DEV020)."""
        calls = findall(self._module, _ADD_ARGUMENT)
        return any(cuda_default(call) is not None and not self.why_default_stays(call) for call in calls)

    def _names_npu(self) -> bool:
        """Whether the script names an npu device of its own: found when first asked, about a device option (few
        files have one)."""
        if self._npu_named is None:
            self._npu_named = any(_is_npu_reference(found) for found in findall(self._module, _NAMES))
        return self._npu_named


def option_name(call: cst.Call) -> str:
    """The option as a user types it: the first long form (`--device`), else the first one given."""
    names = [s for arg in call.args if arg.keyword is None and (s := string_value(arg.value)) is not None]
    return next((name for name in names if name.startswith("--")), names[0] if names else "the option")


def strings(operands) -> set[str]:
    """The string literals among `operands`, and inside their tuples, lists and sets."""
    return {v for operand in operands for s in findall(operand, m.SimpleString()) if (v := string_value(s)) is not None}


def _is_npu_reference(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.SimpleString):
        return bool(NPU_DEVICE.match(string_value(node) or ""))
    return dotted_name(node) == "torch.npu"  # type: ignore[arg-type]


def _dest(call: cst.Call) -> str:
    """The attribute argparse stores the option's value in (`--train-device` -> `train_device`)."""
    dest = argument(call, None, "dest")
    if dest is not None and string_value(dest.value):
        return string_value(dest.value)  # type: ignore[return-value]
    return option_name(call).lstrip("-").replace("-", "_")


def _compared_values(module: cst.Module, dest: str) -> set[str]:
    """The strings the option's value (`args.<dest>`) is compared with directly: `==`, `in`, `.startswith(...)`."""
    values: set[str] = set()
    for node in findall(module, m.Comparison()):
        operands = [node.left, *(target.comparator for target in node.comparisons)]  # type: ignore[attr-defined]
        if any(_is_option_value(operand, dest) for operand in operands):
            values.update(strings(operands))
    for node in findall(module, m.Call(func=m.Attribute(attr=m.Name("startswith")))):
        if _is_option_value(node.func.value, dest):  # type: ignore[attr-defined]
            values.update(strings(arg.value for arg in node.args))  # type: ignore[attr-defined]
    return values


def _is_option_value(node: cst.BaseExpression, dest: str) -> bool:
    return isinstance(node, cst.Attribute) and node.attr.value == dest
