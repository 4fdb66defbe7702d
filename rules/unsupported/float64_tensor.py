from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, argument, matches, string_value

_FLOAT64 = ("torch.float64", "torch.double", "torch.uint64")
_DOUBLE_TENSOR = "torch.cuda.DoubleTensor"
_TO_TENSOR = frozenset({"torch.from_numpy", "torch.tensor", "torch.as_tensor", "torch.asarray", "torch.Tensor"})
# numpy calls that make float64 arrays unless given another dtype.
_NUMPY_FLOAT64_BY_DEFAULT = frozenset(f"numpy.{name}" for name in (
    "zeros", "ones", "empty", "full", "eye", "identity", "linspace", "logspace", "loadtxt", "genfromtxt",
    "random.rand", "random.randn", "random.random", "random.uniform", "random.normal", "random.standard_normal",
))
_NUMPY_FLOAT64 = ("numpy.float64", "numpy.double", "builtins.float")
_ADVICE = ("keep float64 on the CPU (metrics, numpy interop) or compute in float32 on the device; `verify` names an "
           "op that ran in float64 on the reference and in float32 on the port")
# Matchers kept in constants, as the rule tests every call of a file (rules.matches finds them by identity).
_DOUBLE_CALL = m.Call(func=m.Attribute(attr=m.Name("double")), args=[])
_ASTYPE = m.Attribute(attr=m.Name("astype"))


class Float64Tensor(PortRule):
    """Report every float64 (and uint64) tensor a port would compute with on the NPU.

    ## What it does
    Reports, once per call: a `torch.float64` / `torch.double` / `torch.uint64` argument (`dtype=`, `.to(...)`,
    `torch.set_default_dtype(...)`), `.double()`, `torch.cuda.DoubleTensor`, and numpy arrays that are float64 made
    into tensors where that is visible in the file: `torch.from_numpy` / `torch.tensor` / `torch.as_tensor` of a numpy
    call that makes float64 by default (`np.zeros(3)`, `np.random.rand(...)`), of one given a float64 dtype or
    `.astype(np.float64)`, or of a name assigned one of those.

    ## Why
    Many NPU operators have no float64 kernel ("Unsupport data type: at::ScalarType::Double") or run it on the AI
    CPU, far slower; `transfer_to_npu` even maps `torch.cuda.DoubleTensor` to float32 without a word. A float64
    result computed on the GPU will also differ from the port's. numpy computes in float64 by default, so a tensor
    made from a numpy array is float64 unless the script converts it.

    ## Safety
    Report-only: whether float64 is needed is a numerical judgement.

    ## References
    Huawei's migration tool README, FAQ ("Unsupport data type: at::ScalarType::Double"):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>;
    torch_npu/contrib/transfer_to_npu.py (DoubleTensor -> FloatTensor); <https://github.com/Ascend/pytorch/issues/158>;
    <https://github.com/huggingface/diffusers/pull/10123>.
    """

    CODE = "UNS004"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("float64", "double", "Double", "uint64", "numpy")
    EXAMPLES = (
        Flag(
            """
            import torch
            torch.set_default_dtype(torch.float64)
            x = torch.zeros(3, dtype=torch.double, device="cuda")
            y = x.double()
            z = torch.tensor([1, 2]).to(torch.float64)
            w = torch.cuda.DoubleTensor(3)
            """,
            lines=[2, 3, 4, 5, 6],
        ),
        Flag(
            """
            import numpy as np
            import torch
            noise = np.random.randn(4, 3)
            a = torch.from_numpy(noise).cuda()
            b = torch.tensor(np.zeros(3))
            c = torch.as_tensor(data.astype(np.float64))
            """,
            lines=[4, 5, 6],
        ),
        Unchanged(
            """
            import numpy as np
            import torch
            a = np.zeros(3, dtype=np.float64)
            if x.dtype == torch.float64:
                x = x.float()
            b = torch.from_numpy(np.zeros(3, dtype=np.float32))
            c = torch.from_numpy(np.random.rand(3).astype(np.float32))
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._float64_arrays: set[str] = set()  # names assigned a float64 numpy array

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._numpy_float64(node.value):
            self._float64_arrays.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))

    def visit_Call(self, node: cst.Call) -> None:
        wants_float64 = matches(node, _DOUBLE_CALL) or any(
            self.refers_to(arg.value, *_FLOAT64) for arg in node.args
        )
        if wants_float64:
            self.report(node, "float64/uint64 tensors are partly supported and slow on Ascend NPUs", _ADVICE,
                        severity=Severity.WARNING)
        elif self.refers_to(node.func, *_TO_TENSOR) and node.args and self._float64_source(node.args[0].value):
            self.report(node, "a float64 numpy array becomes a float64 tensor here (numpy's default dtype); float64 "
                        "is partly supported and slow on Ascend NPUs", "convert it: `.float()`, or make the array "
                        "float32 (`dtype=np.float32`); " + _ADVICE, severity=Severity.WARNING)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "DoubleTensor" and self.refers_to(node, _DOUBLE_TENSOR):
            self.report(node, "torch.cuda.DoubleTensor: transfer_to_npu silently makes it the NPU's float32 type, "
                        "and float64 is partly supported on Ascend NPUs", _ADVICE, severity=Severity.WARNING)

    def _float64_source(self, node: cst.BaseExpression) -> bool:
        return (isinstance(node, cst.Name) and node.value in self._float64_arrays) or self._numpy_float64(node)

    def _numpy_float64(self, node: cst.BaseExpression) -> bool:
        """`node` makes a float64 numpy array: a float64-by-default call without another dtype, or a float64 dtype."""
        if not isinstance(node, cst.Call):
            return False
        if matches(node.func, _ASTYPE) and node.args:
            return self._float64_dtype(node.args[0].value)
        dtype = argument(node, None, "dtype")
        if dtype is not None:
            return self._float64_dtype(dtype.value)
        return self.refers_to(node.func, *_NUMPY_FLOAT64_BY_DEFAULT)

    def _float64_dtype(self, node: cst.BaseExpression) -> bool:
        return self.refers_to(node, *_NUMPY_FLOAT64) or string_value(node) in ("float64", "double", "f8")
