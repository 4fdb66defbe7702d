from __future__ import annotations

import libcst as cst

from rules import Case, Mode, PortRule, Unchanged, same_quotes, string_value

_MEMBERSHIP = (cst.In, cst.NotIn)
_EQUALITY = (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)


class NcclComparison(PortRule):
    """Compare the process-group backend with "hccl" where the script compares it with "nccl".

    ## What it does
    In a comparison, rewrites the literal `"nccl"` to `"hccl"`: `backend == "nccl"`, `dist.get_backend() != "nccl"`,
    `backend in ("gloo", "nccl")` and `"nccl" in backend`. One change is reported per comparison.

    ## Why
    On an NPU the process group runs HCCL: `dist.get_backend()` returns "hccl", and DIST001 rewrites the backend the
    script passes. A branch on "nccl" would silently take the other path (skipping `set_device`, say).
    `transfer_to_npu` rewrites only call arguments, so this is needed in both modes.

    ## Safety
    Safe in the usual case. If the compared value comes from outside the script (a config file that still says
    "nccl"), the branch flips: update that config too.

    ## References
    Huawei's migration tool README asks to replace "nccl" with "hccl" by hand:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "DIST002"
    CHECKLIST = ("C3",)
    TRIGGERS = ("nccl",)
    EXAMPLES = (
        Case(
            """
            import torch.distributed as dist
            if dist.get_backend() == "nccl":  # GPU path
                torch.cuda.set_device(rank)
            assert args.backend in ('gloo', 'nccl'), "unknown backend"
            use_gpu = "nccl" in args.dist_backend
            """,
            """
            import torch.distributed as dist
            if dist.get_backend() == "hccl":  # GPU path
                torch.cuda.set_device(rank)
            assert args.backend in ('gloo', 'hccl'), "unknown backend"
            use_gpu = "hccl" in args.dist_backend
            """,
            lines=[2, 4, 5],
        ),
        Case(
            """
            sync = backend != "nccl" and rank == 0
            """,
            """
            sync = backend != "hccl" and rank == 0
            """,
            lines=[1],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            if backend == "gloo":
                pass
            print("nccl" + backend)
            if name == "nccl_tests":
                pass
            x = "nccl" < backend
            """
        ),
    )

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.Comparison:
        left = updated_node.left
        targets = list(updated_node.comparisons)
        for index, target in enumerate(targets):
            if isinstance(target.operator, _EQUALITY + _MEMBERSHIP):
                if index == 0:
                    left = _ported(left, membership=False)
                comparator = _ported(target.comparator, isinstance(target.operator, _MEMBERSHIP))
                if comparator is not target.comparator:
                    targets[index] = target.with_changes(comparator=comparator)
        unchanged = left is updated_node.left and all(a is b for a, b in zip(targets, updated_node.comparisons))
        if unchanged:  # no "nccl" compared with
            return updated_node
        new = updated_node.with_changes(left=left, comparisons=targets)
        return self.replace(original_node, updated_node, new, 'comparison with "nccl" -> "hccl"')


def _ported(node: cst.BaseExpression, membership: bool) -> cst.BaseExpression:
    """`node` with "nccl" made "hccl": the literal itself, or, right of `in`, an element of a literal collection."""
    if isinstance(node, cst.SimpleString) and string_value(node) == "nccl":
        return same_quotes(node, "hccl")
    if membership and isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        values = [_ported(element.value, False) for element in node.elements]
        if any(value is not element.value for value, element in zip(values, node.elements)):
            return node.with_changes(
                elements=[element.with_changes(value=value) for element, value in zip(node.elements, values)]
            )
    return node
