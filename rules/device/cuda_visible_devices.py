from __future__ import annotations

import libcst as cst

from rules import Case, PortRule, Unchanged, same_quotes, string_value

_CUDA = "CUDA_VISIBLE_DEVICES"
_ASCEND = "ASCEND_RT_VISIBLE_DEVICES"
# Functions whose first argument is the name of an environment variable.
_ENV_FUNCTIONS = (
    "os.getenv",
    "os.putenv",
    "os.unsetenv",
    "os.environ.get",
    "os.environ.setdefault",
    "os.environ.pop",
)


def _ascend_name(node: cst.BaseExpression) -> cst.SimpleString | None:
    if isinstance(node, cst.SimpleString) and string_value(node) == _CUDA:
        return same_quotes(node, _ASCEND)
    return None


class CudaVisibleDevices(PortRule):
    """Use `ASCEND_RT_VISIBLE_DEVICES` where the script reads or sets `CUDA_VISIBLE_DEVICES`.

    ## What it does
    Renames the environment variable in `os.environ[...]`, `os.getenv(...)`, `os.environ.get/setdefault/pop(...)`,
    `... in os.environ`, dict literals (an `env=` for a subprocess) and `CUDA_VISIBLE_DEVICES=` keywords
    (`os.environ.update(...)`, `dict(os.environ, ...)`).

    ## Why
    torch_npu selects devices from `ASCEND_RT_VISIBLE_DEVICES` and ignores `CUDA_VISIBLE_DEVICES`; `transfer_to_npu`
    does not translate it, so in both modes the script would see (and set) every card.

    ## Safety
    Safe. Mentions in log text and shell command strings are left alone.

    ## References
    torch_npu/npu/__init__.py (`_parse_visible_devices`).
    """

    CODE = "DEV009"
    CHECKLIST = ("C3",)
    TRIGGERS = (_CUDA,)
    EXAMPLES = (
        Case(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"  # two cards
            gpus = os.getenv('CUDA_VISIBLE_DEVICES', "")
            if "CUDA_VISIBLE_DEVICES" not in os.environ:
                os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(rank)}
            os.environ.update(CUDA_VISIBLE_DEVICES="3")
            """,
            """
            import os
            os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0,1"  # two cards
            gpus = os.getenv('ASCEND_RT_VISIBLE_DEVICES', "")
            if "ASCEND_RT_VISIBLE_DEVICES" not in os.environ:
                os.environ.setdefault("ASCEND_RT_VISIBLE_DEVICES", "0")
            env = {**os.environ, "ASCEND_RT_VISIBLE_DEVICES": str(rank)}
            os.environ.update(ASCEND_RT_VISIBLE_DEVICES="3")
            """,
            lines=[2, 3, 4, 5, 6, 7],
        ),
        Case(
            """
            from os import environ, getenv
            n = len(environ["CUDA_VISIBLE_DEVICES"].split(","))
            """,
            """
            from os import environ, getenv
            n = len(environ["ASCEND_RT_VISIBLE_DEVICES"].split(","))
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import os, subprocess
            print("set CUDA_VISIBLE_DEVICES first")
            subprocess.run("CUDA_VISIBLE_DEVICES=0 python train.py", shell=True)
            table = {"CUDA_VISIBLE_DEVICES_HELP": 1}
            """
        ),
    )

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.Subscript:
        if len(updated_node.slice) != 1 or not self.refers_to(original_node.value, "os.environ"):
            return updated_node
        element = updated_node.slice[0]
        if not isinstance(element.slice, cst.Index) or (name := _ascend_name(element.slice.value)) is None:
            return updated_node
        new = updated_node.with_changes(slice=[element.with_changes(slice=element.slice.with_changes(value=name))])
        return self._rename(original_node, updated_node, new)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        args = list(updated_node.args)
        if self.refers_to(original_node.func, *_ENV_FUNCTIONS) and args and (name := _ascend_name(args[0].value)):
            args[0] = args[0].with_changes(value=name)
        for index, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == _CUDA:
                args[index] = arg.with_changes(keyword=cst.Name(_ASCEND))
        if args == list(updated_node.args):
            return updated_node
        return self._rename(original_node, updated_node, updated_node.with_changes(args=args))

    def leave_DictElement(self, original_node: cst.DictElement, updated_node: cst.DictElement) -> cst.DictElement:
        name = _ascend_name(updated_node.key)
        return self._rename(original_node, updated_node, updated_node.with_changes(key=name)) if name else updated_node

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.Comparison:
        target = original_node.comparisons[0]
        if not isinstance(target.operator, (cst.In, cst.NotIn)) or not self.refers_to(target.comparator, "os.environ"):
            return updated_node
        name = _ascend_name(updated_node.left)
        return self._rename(original_node, updated_node, updated_node.with_changes(left=name)) if name else updated_node

    def _rename(self, original: cst.CSTNode, updated: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
        return self.replace(original, updated, new, f"`{_CUDA}` -> `{_ASCEND}`")
