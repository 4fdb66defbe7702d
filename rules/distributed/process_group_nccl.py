from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged

_PREFIXES = ("torch.distributed.ProcessGroupNCCL", "torch._C._distributed_c10d.ProcessGroupNCCL")


class ProcessGroupNccl(PortRule):
    """Report direct use of `ProcessGroupNCCL` and its NCCL-specific options.

    ## What it does
    Reports each use of `torch.distributed.ProcessGroupNCCL` (building one, `ProcessGroupNCCL.Options()`,
    `isinstance` checks), once per expression; the import line itself is not reported.

    ## Why
    There is no NCCL process group on an NPU. `transfer_to_npu` aliases the class to `ProcessGroupHCCL`, but the
    options differ (`is_high_priority_stream`, `config.cga_cluster_size`... have no HCCL counterpart), so the code
    must be rewritten by hand, usually by passing `backend="hccl"` and dropping `pg_options`.

    ## Safety
    Report-only.

    ## References
    torch_npu/contrib/transfer_to_npu.py (ProcessGroupNCCL -> ProcessGroupHCCL).
    """

    CODE = "DIST005"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("ProcessGroupNCCL",)
    EXAMPLES = (
        Flag(
            """
            import torch.distributed as dist
            from torch.distributed import ProcessGroupNCCL
            options = ProcessGroupNCCL.Options()
            options.is_high_priority_stream = True
            dist.init_process_group("nccl", pg_options=options)
            if isinstance(group, dist.ProcessGroupNCCL):
                pass
            """,
            lines=[3, 6],
        ),
        Unchanged(
            """
            class ProcessGroupNCCL:
                pass
            group = ProcessGroupNCCL()
            """
        ),
    )

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return self._check(node)

    def visit_Name(self, node: cst.Name) -> bool:
        return self._check(node)

    def _check(self, node: cst.Attribute | cst.Name) -> bool:
        if not any(name.startswith(_PREFIXES) for name in self.qualified_names(node)):
            return True
        self.report(
            node,
            "ProcessGroupNCCL has no NPU counterpart with the same options",
            'pass backend="hccl" to init_process_group/new_group and drop the NCCL pg_options',
            severity=Severity.ERROR,
        )
        return False  # one finding for the whole expression, not one per attribute in it
