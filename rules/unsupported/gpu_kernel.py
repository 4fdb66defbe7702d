from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged

# Decorators that compile the function for an NVIDIA GPU.
_KERNEL_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics", "numba.cuda.jit")
# Calls that compile CUDA source at run time.
_KERNEL_BUILDERS = (
    "cupy.RawKernel",
    "cupy.RawModule",
    "cupy.ElementwiseKernel",
    "cupy.ReductionKernel",
    "pycuda.compiler.SourceModule",
    "torch.cuda.jiterator._create_jit_fn",
    "torch.cuda.jiterator._create_multi_output_jit_fn",
)


class GpuKernel(PortRule):
    """Report GPU kernels written in Python: Triton, numba.cuda, CuPy/PyCUDA sources, jiterator.

    ## What it does
    Reports each function decorated with `@triton.jit` / `@triton.autotune` / `@numba.cuda.jit` (once per
    function), and each call that compiles CUDA source at run time (`cupy.RawKernel`, `cupy.ElementwiseKernel`,
    `pycuda.compiler.SourceModule`, `torch.cuda.jiterator._create_jit_fn`).

    ## Why
    These kernels target NVIDIA GPUs. Triton kernels need porting to triton-ascend (and `transfer_to_npu` forces
    `has_triton()` to False); CuPy, PyCUDA, numba.cuda and jiterator have no NPU backend at all. The kernel must be
    re-expressed with torch operators or an Ascend C custom operator.

    ## Safety
    Report-only.

    ## References
    torch_npu/contrib/transfer_to_npu.py (has_triton forced False);
    <https://github.com/triton-lang/triton-ascend/issues/424>.
    """

    CODE = "UNS002"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("triton", "numba", "cupy", "pycuda", "jiterator")
    EXAMPLES = (
        Flag(
            """
            import triton
            import triton.language as tl
            import cupy as cp

            @triton.autotune(configs=[], key=["n"])
            @triton.jit
            def add_kernel(x_ptr, n, BLOCK: tl.constexpr):
                pid = tl.program_id(0)

            square = cp.ElementwiseKernel("T x", "T y", "y = x * x", "square")
            """,
            lines=[5, 10],
        ),
        Flag(
            """
            from numba import cuda

            @cuda.jit
            def scale(a):
                a[cuda.grid(1)] *= 2
            """,
            lines=[3],
        ),
        Unchanged(
            """
            import numba
            import torch

            @numba.jit(nopython=True)
            def count(a):
                return len(a)
            y = torch.jit.script(f)
            """
        ),
    )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            target = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
            name = self.name_under(target, *_KERNEL_DECORATORS)
            if name is not None:
                self.report(
                    decorator,
                    f"@{name} kernel {node.name.value} runs only on NVIDIA GPUs",
                    "port it to triton-ascend, or re-express it with torch operators or an Ascend C operator",
                    severity=Severity.ERROR,
                )
                return

    def visit_Call(self, node: cst.Call) -> None:
        name = self.name_under(node.func, *_KERNEL_BUILDERS)
        if name is not None:
            self.report(
                node,
                f"{name} compiles a CUDA kernel at run time",
                "re-express the kernel with torch operators or an Ascend C custom operator",
                severity=Severity.ERROR,
            )
