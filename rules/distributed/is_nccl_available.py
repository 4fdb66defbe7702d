from __future__ import annotations

import libcst as cst

from rules import Case, Mode, PortRule, Unchanged, attribute_chain

_NAMES = ("torch.distributed.is_nccl_available", "torch.distributed.distributed_c10d.is_nccl_available")


class IsNcclAvailable(PortRule):
    """Ask whether HCCL is available where the script asks about NCCL.

    ## What it does
    Explicit mode: `dist.is_nccl_available()` becomes `dist.is_hccl_available()`; a bare `is_nccl_available` imported
    from `torch.distributed` becomes `torch_npu.distributed.is_hccl_available`.

    ## Why
    NCCL is never available on an NPU host, so the script would fall back to gloo or refuse to start.
    `torch_npu` adds `is_hccl_available` to `torch.distributed`; `transfer_to_npu` makes the same swap at run time,
    which is why transfer mode needs nothing here.

    ## Safety
    Safe.

    ## References
    torch_npu/distributed/distributed_c10d.py (is_hccl_available); torch_npu/contrib/transfer_to_npu.py
    (is_nccl_available -> is_hccl_available).
    """

    CODE = "DIST003"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("is_nccl_available",)
    EXAMPLES = (
        Case(
            """
            import torch.distributed as dist
            backend = "nccl" if dist.is_nccl_available() else "gloo"  # pick
            """,
            """
            import torch.distributed as dist
            backend = "nccl" if dist.is_hccl_available() else "gloo"  # pick
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            from torch.distributed import is_nccl_available
            assert is_nccl_available()
            """,
            """
            from torch.distributed import is_nccl_available
            import torch_npu

            assert torch_npu.distributed.is_hccl_available()
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch.distributed as dist
            ok = dist.is_nccl_available()
            """
        ),
        Unchanged(
            """
            def is_nccl_available():
                return False
            is_nccl_available()
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = updated_node.func
        if not self.refers_to(original_node.func, *_NAMES):
            return updated_node
        if isinstance(func, cst.Attribute):
            new_func: cst.BaseExpression = func.with_changes(attr=cst.Name("is_hccl_available"))
            imports: list[tuple[str, str | None]] = []
        else:
            new_func, imports = attribute_chain("torch_npu.distributed.is_hccl_available"), [("torch_npu", None)]
        return self.replace(
            original_node,
            updated_node,
            updated_node.with_changes(func=new_func),
            "is_nccl_available() -> is_hccl_available()",
            imports=imports,
        )
