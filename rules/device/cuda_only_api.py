from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from rules import Flag, Mode, PortRule, Safety, Severity, Unchanged, findall
from rules.device._cuda_api import CUDA_ONLY


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
    The diff of torch's `torch.cuda.__all__` (torch/cuda/__init__.py) and torch_npu's `torch_npu.npu.__all__`
    (torch_npu/npu/__init__.py), written out in rules/device/_cuda_api.py.
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
            from torch.cuda import memory_usage as usage
            import torch.cuda.jiterator as jit
            print(usage(), jit)
            """,
            lines=[3, 3],
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

    def visit_Module(self, node: cst.Module) -> None:
        # A bare name means a torch.cuda name only through `from torch.cuda import x [as y]` or `import torch.cuda.x
        # as y`: only those names are resolved (resolving every name of a file was this rule's main cost).
        self._cuda_bound: set[str] = set()
        for statement in findall(node, m.ImportFrom() | m.Import()):
            if isinstance(statement, cst.ImportFrom):
                module = get_full_name_for_node(statement.module) if statement.module and not statement.relative else ""
                if module == "torch.cuda" and not isinstance(statement.names, cst.ImportStar):
                    self._cuda_bound.update(_bound_name(alias) for alias in statement.names)
            else:
                self._cuda_bound.update(
                    _bound_name(alias)
                    for alias in statement.names
                    if alias.asname and (get_full_name_for_node(alias.name) or "").startswith("torch.cuda.")
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
        if original_node.value in self._cuda_bound:
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


def _bound_name(alias: cst.ImportAlias) -> str:
    """The name an import binds: `y` in `import x as y`, `x` in `from m import x`."""
    name = alias.asname.name if alias.asname else alias.name
    return get_full_name_for_node(name) or ""
