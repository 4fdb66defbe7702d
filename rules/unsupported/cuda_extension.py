from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, findall, string_value

_EXTENSION = ("torch.utils.cpp_extension.CUDAExtension",)
_JIT_BUILD = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline")
_CUDA_KEYWORDS = {"cuda_sources", "with_cuda"}


class CudaExtension(PortRule):
    """Report custom CUDA extensions, which must be rewritten as NPU operators.

    ## What it does
    Reports each `CUDAExtension(...)`, and each `cpp_extension.load(...)` / `load_inline(...)` that compiles CUDA
    (a `.cu`/`.cuh` source, `cuda_sources=` or `with_cuda=`). A C++-only `load` is left alone.

    ## Why
    CUDA kernels do not compile for Ascend. `transfer_to_npu` wraps only `include_paths`; the operator itself must be
    rebuilt with `torch_npu.utils.cpp_extension.NpuExtension` on Ascend C / OpPlugin, or replaced by torch ops.

    ## Safety
    Report-only.

    ## References
    torch_npu/utils/cpp_extension.py (NpuExtension); torch_npu/contrib/transfer_to_npu.py (only `include_paths` is
    wrapped); Huawei's migration tool README (cuda_op_list.csv):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "UNS001"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("cpp_extension",)
    EXAMPLES = (
        Flag(
            """
            from torch.utils.cpp_extension import CUDAExtension, BuildExtension, load
            ext = CUDAExtension("fused", ["fused.cpp", "fused_kernel.cu"])
            ops = load(name="ops", sources=["ops.cpp", "ops_cuda.cu"], verbose=True)
            """,
            lines=[2, 3],
        ),
        Unchanged(
            """
            from torch.utils import cpp_extension
            ops = cpp_extension.load(name="ops", sources=["ops.cpp"])
            ext = cpp_extension.CppExtension("ops", ["ops.cpp"])
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_EXTENSION) or (self.refers_to(node.func, *_JIT_BUILD) and _compiles_cuda(node)):
            self.report(
                node,
                "custom CUDA extension: CUDA kernels do not build for Ascend NPUs",
                "rebuild the operator with torch_npu.utils.cpp_extension.NpuExtension (Ascend C / OpPlugin) "
                "or express it with torch operators",
                severity=Severity.ERROR,
            )


def _compiles_cuda(call: cst.Call) -> bool:
    if any(arg.keyword is not None and arg.keyword.value in _CUDA_KEYWORDS for arg in call.args):
        return True
    sources = (string_value(node) or "" for node in findall(call, m.SimpleString()))
    return any(source.endswith((".cu", ".cuh")) for source in sources)
