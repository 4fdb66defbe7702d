from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from rules import (
    Case, Flag, Mode, PortRule, Severity, Unchanged, argument, dotted_name, findall, matches, replace_argument_value,
    string_value,
)
from rules.device._rewrite import retarget

_NPU = re.compile(r"^npu(?::\d+)?$")
_ADD_ARGUMENT = m.Call(func=m.Attribute(attr=m.Name("add_argument")))
_NAMES = m.SimpleString() | m.Attribute()  # where a script names a device


class DeviceOptionDefault(PortRule):
    """Name the option that runs the script on the NPU; default it to "npu" where the script handles the NPU.

    ## What it does
    In transfer mode, for each argparse option whose default is a cuda device (`add_argument("--device",
    default="cuda")`), reports which option and value run the port on the NPU. Where the script handles the NPU
    itself (it names an "npu" device, uses `torch.npu`, or lists "npu" among the option's choices), the default
    becomes "npu", so the script's own NPU code runs with no option given. Elsewhere the default stays "cuda", which
    transfer_to_npu maps to the NPU, and the finding says so.

    ## Why
    A multi-device script (`--device cuda` by default, `elif device.type == "npu": torch.npu.synchronize()`) ran
    on the GPU by default; its port should run on the NPU by default, and its report should say how to choose.

    ## Safety
    Safe: the default changes only where the script handles "npu" itself. It stays, and is reported, where the
    option's `choices` lack "npu", and where the script compares the option's value with "cuda" but never with
    "npu": those branches would silently flip. Explicit mode rewrites the default through DEV004.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`_wrapper_cuda` translates device strings in call arguments, never in
    comparisons).
    """

    CODE = "DEV020"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.TRANSFER})
    TRIGGERS = ("add_argument",)
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Case(
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda", help="cuda, npu or cpu")
            args = parser.parse_args()
            if args.device == "npu":
                torch.npu.set_compile_mode(jit_compile=False)
            """,
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="npu", help="cuda, npu or cpu")
            args = parser.parse_args()
            if args.device == "npu":
                torch.npu.set_compile_mode(jit_compile=False)
            """,
            lines=[4],
        ),
        Case(
            """
            parser.add_argument("--accelerator", default='cuda:0', choices=['cuda:0', 'npu:0', 'cpu'])
            """,
            """
            parser.add_argument("--accelerator", default='npu:0', choices=['cuda:0', 'npu:0', 'cpu'])
            """,
            lines=[1],
        ),
        Flag(
            """
            parser.add_argument("--device", default="cuda")
            args = parser.parse_args()
            model.to(args.device)
            """,
            lines=[1],
        ),
        Flag(
            """
            parser.add_argument("-d", "--train-device", default="cuda", choices=("cuda", "cpu"))
            synchronize = {"npu": torch.npu.synchronize, "cuda": torch.cuda.synchronize}
            """,
            lines=[1],
        ),
        Flag(
            """
            parser.add_argument("--device", default="cuda")
            args = parser.parse_args()
            use_amp = args.device == "cuda"  # no npu branch: the default must stay
            backend = "hccl" if torch.device(args.device).type == "npu" else "nccl"
            """,
            lines=[1],
        ),
        Unchanged(
            """
            parser.add_argument("--device", default="cuda")
            """,
            mode=Mode.EXPLICIT,
        ),
        Unchanged('parser.add_argument("--device", default="cpu")\nparser.add_argument("--name", default="cuda run")\n'),
    )

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        self._npu_named: bool | None = None

    def _names_npu(self) -> bool:
        """Whether the script names an npu device of its own: found when first asked, about a device option (few
        files have one)."""
        if self._npu_named is None:
            self._npu_named = any(_is_npu_reference(found) for found in findall(self._module, _NAMES))
        return self._npu_named

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not matches(original_node, _ADD_ARGUMENT):
            return updated_node
        default = argument(original_node, None, "default")
        if default is None or retarget(default.value) is None:
            return updated_node
        option = _option_name(original_node)
        npu_value = cst.Module([]).code_for_node(retarget(default.value))  # type: ignore[arg-type]
        keep = self._why_keep(original_node)
        if keep:
            self.report(
                default,
                f"{option} picks the device; its default {self.file.code_for(default.value)} runs on the NPU through "
                f"transfer_to_npu, and `{option} npu` names it; the default stays: {keep}",
                f"run the port with `{option} npu` once the script handles that value",
                severity=Severity.INFO,
            )
            return updated_node
        new = replace_argument_value(updated_node, default, retarget(default.value))  # type: ignore[arg-type]
        return self.replace(
            original_node,
            updated_node,
            new,
            f"{option} default -> {npu_value}: the script's own NPU code runs by default (`{option} cuda` still maps "
            "to the NPU through transfer_to_npu)",
            at=default,
        )

    def _why_keep(self, call: cst.Call) -> str:
        choices = argument(call, None, "choices")
        if choices is not None and not any(_NPU.match(value) for value in _strings([choices.value])):
            return 'its choices lack "npu"'
        if not self._names_npu():
            return "the script names no npu device of its own"
        compared = _compared_values(self._module, _dest(call))
        if any(value.startswith("cuda") for value in compared) and not any(_NPU.match(v) for v in compared):
            return 'the script compares its value with "cuda" and never with "npu"'
        return ""


def _is_npu_reference(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.SimpleString):
        return bool(_NPU.match(string_value(node) or ""))
    return dotted_name(node) == "torch.npu"  # type: ignore[arg-type]


def _option_strings(call: cst.Call) -> list[str]:
    return [s for arg in call.args if arg.keyword is None and (s := string_value(arg.value)) is not None]


def _option_name(call: cst.Call) -> str:
    """The option as a user types it: the first long form (`--device`), else the first one given."""
    names = _option_strings(call)
    return next((name for name in names if name.startswith("--")), names[0] if names else "the option")


def _dest(call: cst.Call) -> str:
    """The attribute argparse stores the option's value in (`--train-device` -> `train_device`)."""
    dest = argument(call, None, "dest")
    if dest is not None and string_value(dest.value):
        return string_value(dest.value)  # type: ignore[return-value]
    return _option_name(call).lstrip("-").replace("-", "_")


def _compared_values(module: cst.Module, dest: str) -> set[str]:
    """The strings the option's value (`args.<dest>`) is compared with directly: `==`, `in`, `.startswith(...)`."""
    values: set[str] = set()
    for node in findall(module, m.Comparison()):
        operands = [node.left, *(target.comparator for target in node.comparisons)]  # type: ignore[attr-defined]
        if any(_is_option_value(operand, dest) for operand in operands):
            values.update(_strings(operands))
    for node in findall(module, m.Call(func=m.Attribute(attr=m.Name("startswith")))):
        if _is_option_value(node.func.value, dest):  # type: ignore[attr-defined]
            values.update(_strings(arg.value for arg in node.args))  # type: ignore[attr-defined]
    return values


def _is_option_value(node: cst.BaseExpression, dest: str) -> bool:
    return isinstance(node, cst.Attribute) and node.attr.value == dest


def _strings(operands) -> set[str]:
    """The string literals among `operands`, and inside their tuples, lists and sets."""
    return {v for operand in operands for s in findall(operand, m.SimpleString()) if (v := string_value(s)) is not None}
