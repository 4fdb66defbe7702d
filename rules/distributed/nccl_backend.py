from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameProvider

from rules import (
    Case, Mode, PortRule, Unchanged, argument, findall, frameworks, matches, replace_argument_value, same_quotes,
    string_value,
)

_C10D = ("torch.distributed", "torch.distributed.distributed_c10d")
# The process-group calls that take a backend, and the positional index of their `backend` parameter.
_BACKEND_PARAMETER = {
    "init_process_group": 0,
    "new_group": 2,
    "new_subgroups": 3,
    "new_subgroups_by_enumeration": 2,
    "is_backend_available": 0,
    "Backend": 0,
}
# call -> its backend parameter (keyword, position): torch's and a framework's own set-up (DeepSpeed's)
_BACKEND_CALLS = {f"{prefix}.{name}": ("backend", index)
                  for prefix in _C10D for name, index in _BACKEND_PARAMETER.items()} | frameworks.deepspeed.BACKEND_CALLS
_BACKEND_CALLERS = tuple(_BACKEND_CALLS)
_NCCL_ATTRIBUTES = {f"{prefix}.Backend.NCCL" for prefix in _C10D}
_RENAMES = {"nccl": "hccl", "NCCL": "HCCL", "cuda": "npu"}
# "nccl", or the device-to-backend form "cuda:nccl,cpu:gloo".
_BACKEND_SPEC = re.compile(r"^\s*\w+\s*$|^\s*\w+:\w+\s*(,\s*\w+:\w+\s*)*$")
_ADD_ARGUMENT = m.Attribute(attr=m.Name("add_argument"))
_SET_DEFAULTS = m.Attribute(attr=m.Name("set_defaults"))


def _port_backend(text: str) -> str | None:
    """`"nccl"` -> `"hccl"`, `"cuda:nccl,cpu:gloo"` -> `"npu:hccl,cpu:gloo"`; None when `text` names no nccl backend."""
    if not _BACKEND_SPEC.match(text) or not re.search(r"\b(nccl|NCCL)\b", text):
        return None
    return re.sub(r"\b(nccl|NCCL|cuda)\b", lambda match: _RENAMES[match.group()], text)


class NcclBackend(PortRule):
    """Name the `hccl` process-group backend wherever the script names `nccl`.

    ## What it does
    Rewrites the backend string `"nccl"` to `"hccl"` (and `"cuda:nccl,cpu:gloo"` to `"npu:hccl,cpu:gloo"`) where it
    names a process-group backend: the `backend` argument of `init_process_group`, `new_group`, `new_subgroups*`,
    `is_backend_available` and `Backend(...)`, and `dist_backend` of DeepSpeed's `init_distributed`; the default
    and choices of an argparse flag whose name contains "backend" (`--backend`, `--dist-backend`) and
    `set_defaults(backend=...)`; a variable assigned `"nccl"` whose every
    use is one of those arguments or a comparison with `"nccl"`. `Backend.NCCL` becomes `Backend.HCCL`. A value
    that chooses its backend, `"nccl" if cuda else "gloo"` or `args.backend or "nccl"`, gets its literals ported
    (not its condition).

    ## Why
    Ascend has no NCCL; HCCL is its collective library. `transfer_to_npu` swaps the string only inside
    `init_process_group` and `new_group` at run time, so the script itself still says "nccl" everywhere else: its
    logs, its saved config, and its comparisons, which DIST002 rewrites to "hccl". The rule therefore runs in both
    modes, so that the value the script holds and the value it compares against agree.

    ## Safety
    Safe: "nccl" cannot initialise on an NPU host, and "hccl" is what `transfer_to_npu` would pass anyway. A backend
    read from the environment or a config file is not rewritten (DIST002 still fixes the comparisons).

    ## References
    torch_npu/contrib/transfer_to_npu.py (init_process_group and new_group wrappers).
    """

    CODE = "DIST001"
    CHECKLIST = ("C3",)
    TRIGGERS = ("nccl", "NCCL")
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)
    EXAMPLES = (
        Case(  # DeepSpeed sets its process group up itself
            """
            import deepspeed
            deepspeed.init_distributed(dist_backend="nccl")
            """,
            """
            import deepspeed
            deepspeed.init_distributed(dist_backend="hccl")
            """,
            lines=[2],
        ),
        Case(
            """
            import torch.distributed as dist
            dist.init_process_group("nccl")  # keep me
            dist.init_process_group(backend='nccl', init_method="env://")
            group = dist.new_group([0, 1], backend="cuda:nccl,cpu:gloo")
            """,
            """
            import torch.distributed as dist
            dist.init_process_group("hccl")  # keep me
            dist.init_process_group(backend='hccl', init_method="env://")
            group = dist.new_group([0, 1], backend="npu:hccl,cpu:gloo")
            """,
            lines=[2, 3, 4],
        ),
        Case(
            """
            from torch.distributed import init_process_group as init_pg, Backend
            init_pg(Backend.NCCL, world_size=2, rank=0)
            """,
            """
            from torch.distributed import init_process_group as init_pg, Backend
            init_pg(Backend.HCCL, world_size=2, rank=0)
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--dist-backend", default="nccl", choices=["nccl", "gloo"], type=str)
            parser.add_argument("--name", default="nccl")
            parser.set_defaults(dist_backend="nccl")
            """,
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--dist-backend", default="hccl", choices=["hccl", "gloo"], type=str)
            parser.add_argument("--name", default="nccl")
            parser.set_defaults(dist_backend="hccl")
            """,
            lines=[3, 5],
        ),
        Case(
            """
            import torch.distributed as dist
            BACKEND = "nccl"

            def setup(rank):
                backend = "nccl"
                dist.init_process_group(backend, rank=rank)
                if BACKEND == "nccl":
                    dist.init_process_group(backend=BACKEND)
            """,
            """
            import torch.distributed as dist
            BACKEND = "hccl"

            def setup(rank):
                backend = "hccl"
                dist.init_process_group(backend, rank=rank)
                if BACKEND == "nccl":
                    dist.init_process_group(backend=BACKEND)
            """,
            lines=[2, 5],
        ),
        Case(
            """
            import torch.distributed as dist
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
            dist.init_process_group(args.backend or "nccl", rank=rank)
            fallback = "gloo" if args.cpu else ("nccl" if args.fast else "mpi")
            dist.new_group(ranks, backend=fallback)
            dist.new_group(backend="nccl" if args.fast else dist.Backend.NCCL)
            """,
            """
            import torch.distributed as dist
            dist.init_process_group(backend="hccl" if device.type == "cuda" else "gloo")
            dist.init_process_group(args.backend or "hccl", rank=rank)
            fallback = "gloo" if args.cpu else ("hccl" if args.fast else "mpi")
            dist.new_group(ranks, backend=fallback)
            dist.new_group(backend="hccl" if args.fast else dist.Backend.HCCL)
            """,
            lines=[2, 3, 4, 6],
        ),
        Unchanged(
            """
            import torch.distributed as dist
            dist.init_process_group(backend="gloo" if args.cpu else os.environ["BACKEND"])
            dist.init_process_group(args.backend or "gloo")
            """
        ),
        Unchanged(
            """
            import torch.distributed as dist
            backend = "nccl"
            print(f"using {backend}")
            dist.init_process_group(backend)
            log("nccl")
            dist.init_process_group("gloo")
            dist.init_process_group(os.environ.get("BACKEND", "nccl"))
            """
        ),
        Unchanged(
            """
            def init_process_group(backend):
                pass
            init_process_group("nccl")
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._backend_uses: set[cst.CSTNode] = set()  # names passed as a backend or compared with "nccl"

    def visit_Module(self, node: cst.Module) -> None:
        # Variables are judged by their uses, which come after their assignment: find the uses first.
        for call in findall(node, m.Call()):
            value = self._backend_argument(call)  # type: ignore[arg-type]
            if value is not None and isinstance(value.value, cst.Name):
                self._backend_uses.add(value.value)
        for comparison in findall(node, m.Comparison()):
            operands = [comparison.left, *(target.comparator for target in comparison.comparisons)]  # type: ignore
            if any(string_value(operand) == "nccl" for operand in operands):
                self._backend_uses.update(operand for operand in operands if isinstance(operand, cst.Name))

    def _backend_argument(self, call: cst.Call) -> cst.Arg | None:
        if not self.refers_to(call.func, *_BACKEND_CALLERS):
            return None  # most calls of a file: not resolved
        parameter = next((_BACKEND_CALLS[name] for name in self.qualified_names(call.func) if name in _BACKEND_CALLS),
                         None)
        return None if parameter is None else argument(call, parameter[1], parameter[0])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        args = [self._backend_argument(original_node)]
        if matches(original_node.func, _ADD_ARGUMENT) and _is_backend_flag(original_node):
            args = [argument(original_node, None, "default"), argument(original_node, None, "choices")]
        elif matches(original_node.func, _SET_DEFAULTS):
            args = [arg for arg in original_node.args if arg.keyword and "backend" in arg.keyword.value.lower()]
        new = updated_node
        for arg in filter(None, args):
            current = updated_node.args[original_node.args.index(arg)]  # holds other rules' rewrites inside it
            value = _ported_literals(current.value)
            if value is not None:
                new = replace_argument_value(new, current, value)
        if new is updated_node:
            return updated_node
        return self.replace(original_node, updated_node, new, 'backend "nccl" -> "hccl"')

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if len(original_node.targets) != 1 or not isinstance(original_node.targets[0].target, cst.Name):
            return updated_node
        value = _ported_literals(updated_node.value)
        if value is None or not self._only_used_as_backend(original_node.targets[0].target):
            return updated_node
        return self.replace(
            original_node,
            updated_node,
            updated_node.with_changes(value=value),
            'backend variable "nccl" -> "hccl"',
        )

    def _only_used_as_backend(self, target: cst.Name) -> bool:
        if all(use.value != target.value for use in self._backend_uses):  # its uses, if any, are not all backends
            return False  # decided without recording the scopes' reads
        references = self.file.qualified_names.references(target)
        return bool(references) and all(node in self._backend_uses for node in references)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if original_node.attr.value != "NCCL" or not self.refers_to(original_node, *_NCCL_ATTRIBUTES):
            return updated_node
        new = updated_node.with_changes(attr=cst.Name("HCCL"))
        return self.replace(original_node, updated_node, new, "Backend.NCCL -> Backend.HCCL")


def _is_backend_flag(call: cst.Call) -> bool:
    flags = (string_value(arg.value) or "" for arg in call.args if arg.keyword is None)
    return any(flag.startswith("-") and "backend" in flag.lower() for flag in flags)


def _ported_literals(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`node` with its backend literal(s) ported: a string, a list/tuple/set of strings (argparse choices), or the
    value branches of `a if test else b` and `a or b` (the test itself is left alone: DIST002 ports comparisons)."""
    if isinstance(node, cst.IfExp):
        return _ported_parts(node, "body", "orelse")
    if isinstance(node, cst.BooleanOperation):
        return _ported_parts(node, "left", "right")
    if isinstance(node, cst.SimpleString):
        text = string_value(node)
        ported = _port_backend(text) if text is not None else None
        return same_quotes(node, ported) if ported is not None else None
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        elements = [(element, _ported_literals(element.value)) for element in node.elements]
        if not any(new for _, new in elements):
            return None
        return node.with_changes(
            elements=[element.with_changes(value=new) if new else element for element, new in elements]
        )
    return None


def _ported_parts(node: cst.BaseExpression, *fields: str) -> cst.BaseExpression | None:
    """`node` with the backend literals of its value `fields` ported; None when none of them names nccl."""
    ported = {field: _ported_literals(getattr(node, field)) for field in fields}
    changes = {field: value for field, value in ported.items() if value is not None}
    return node.with_changes(**changes) if changes else None
