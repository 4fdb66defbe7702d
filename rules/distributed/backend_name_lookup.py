from __future__ import annotations

import libcst as cst

from rules import Case, Flag, PortRule, Safety, Severity, Unchanged, same_quotes, string_value


class BackendNameLookup(PortRule):
    """Follow the process-group backend's name where the script matches it or looks it up, not only compares it.

    ## What it does
    Rewrites `case "nccl":` in a `match` statement to `case "hccl":`, and reports a backend name used as a key:
    `dist.get_backend()` (or a variable named like a backend) indexing a table, `.get(...)` on one, and a dict literal
    with an "nccl" key.

    ## Why
    On an NPU, `dist.get_backend()` returns "hccl". DIST002 ports comparisons with "nccl"; a `match` on the backend or a
    table keyed by backend names (`{"nccl": "cuda", "gloo": "cpu"}[dist.get_backend()]`) would otherwise take the
    fallback branch or raise KeyError on the NPU.

    ## Safety
    The `case` rewrite is safe in the usual case (as DIST002's). A table is reported, not rewritten: adding an "hccl"
    entry (or renaming "nccl") is the author's choice, and the lookup may also serve a GPU.

    ## References
    torch_npu/contrib/transfer_to_npu.py (init_process_group's nccl becomes hccl, so `dist.get_backend()` says "hccl");
    Huawei's migration tool README asks to replace "nccl" with "hccl" by hand:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "DIST011"
    SAFETY = Safety.SAFE
    CHECKLIST = ("C3",)
    TRIGGERS = ("nccl", "get_backend")
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Case(
            """
            match dist.get_backend():
                case "nccl":
                    device = "cuda"
                case _:
                    device = "cpu"
            """,
            """
            match dist.get_backend():
                case "hccl":
                    device = "cuda"
                case _:
                    device = "cpu"
            """,
            lines=[2],
        ),
        Flag(
            """
            DEVICE_OF = {"nccl": "cuda", "gloo": "cpu"}
            device = DEVICE_OF[dist.get_backend()]
            timeout = TIMEOUTS.get(dist.get_backend(), 30)
            """,
            lines=[1, 2, 3],
        ),
        Unchanged(
            """
            names = {"gloo": 1}
            value = names[key]
            backend = dist.get_backend()
            print(f"backend {dist.get_backend()}")
            """
        ),
    )

    def leave_MatchValue(self, original_node: cst.MatchValue, updated_node: cst.MatchValue) -> cst.MatchValue:
        if isinstance(updated_node.value, cst.SimpleString) and string_value(updated_node.value) == "nccl":
            new = updated_node.with_changes(value=same_quotes(updated_node.value, "hccl"))
            return self.replace(original_node, updated_node, new, 'match case "nccl" -> "hccl"')
        return updated_node

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if any(_is_backend_name(element.slice.value) for element in node.slice
               if isinstance(element.slice, cst.Index)):
            self._report_lookup(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "get" and node.args:
            if _is_backend_name(node.args[0].value):
                self._report_lookup(node)

    def visit_Dict(self, node: cst.Dict) -> None:
        keys = {string_value(element.key) for element in node.elements
                if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)}
        if "nccl" in keys and "hccl" not in keys:
            self.report(node, 'a table keyed by backend names has "nccl" but no "hccl": on an NPU the backend is '
                        '"hccl"', 'add an "hccl" entry beside "nccl"', Severity.WARNING)

    def _report_lookup(self, node: cst.CSTNode) -> None:
        self.report(node, 'the process-group backend is looked up by name: on an NPU it is "hccl", not "nccl"',
                    'give the table an "hccl" entry (DIST002 ports comparisons; lookups are the author\'s)',
                    Severity.WARNING)


def _is_backend_name(node: cst.BaseExpression) -> bool:
    """`dist.get_backend()` / `get_backend(group)`, or a name such as `backend` or `dist_backend`."""
    if isinstance(node, cst.Call):
        func = node.func
        return (isinstance(func, cst.Attribute) and func.attr.value == "get_backend") or (
            isinstance(func, cst.Name) and func.value == "get_backend")
    if isinstance(node, cst.Attribute):
        node = node.attr
    return isinstance(node, cst.Name) and node.value.endswith("backend")
