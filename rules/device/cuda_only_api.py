from __future__ import annotations

import libcst as cst

from rules.base import Flag, PortRule, Unchanged
from rules.device._cuda_api import CUDA_ONLY
from rules.types import Mode, Safety, Severity


class CudaOnlyApi(PortRule):
    """Report `torch.cuda` names that have no NPU counterpart.

    ## What it does
    Reports each use of a `torch.cuda` name that `torch_npu` does not provide: `list_gpu_processes`,
    `memory_usage`, `temperature`, `get_arch_list`, `nccl`, `jiterator`, `comm`, `CUDAPluggableAllocator` ...,
    with what to use instead where there is something.

    ## Why
    `transfer_to_npu` copies only the names torch_npu has onto `torch.cuda`; the rest stay bound to the CUDA runtime
    and fail on an NPU host, in both modes.

    ## Safety
    Report only: there is nothing equivalent to rewrite to.

    ## References
    rules-catalogue DEV-02 and §1 "Not handled"; diff of torch `torch.cuda.__all__` and `torch_npu.npu.__all__`.
    """

    CODE = "DEV002"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("cuda",)
    EXAMPLES = (
        Flag(
            """
            import torch
            print(torch.cuda.list_gpu_processes())
            arch = torch.cuda.get_arch_list()  # for the log
            """,
            lines=[2, 3],
        ),
        Flag(
            """
            from torch.cuda import nccl, memory_usage
            import torch.cuda.comm as comm

            print(nccl.version(), memory_usage())
            """,
            lines=[4, 4],
            mode=Mode.EXPLICIT,
        ),
        Flag(
            """
            import torch as th
            alloc = th.cuda.CUDAPluggableAllocator("alloc.so", "my_malloc", "my_free")
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import torch
            torch.cuda.synchronize()
            print("torch.cuda.temperature() is not available")
            """
        ),
        Unchanged(
            """
            from numba import cuda
            cuda.list_devices()
            """
        ),
    )

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # an import alone does no harm; its uses are reported

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if original_node.attr.value in CUDA_ONLY:  # the last part of every qualified name of `a.b` is `b`
            self._check(original_node)
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        self._check(original_node)
        return updated_node

    def _check(self, node: cst.BaseExpression) -> None:
        for qualified in self.qualified_names(node):
            head, _, name = qualified.rpartition(".")
            if head == "torch.cuda" and name in CUDA_ONLY:
                instead = CUDA_ONLY[name]
                self.report(
                    node,
                    f"`{qualified}` has no NPU counterpart and fails on an NPU host",
                    f"use {instead} instead" if instead else "remove it or guard it for CUDA hosts",
                    severity=Severity.ERROR,
                )
                return
