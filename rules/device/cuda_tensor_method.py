from __future__ import annotations

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider, QualifiedNameProvider, QualifiedNameSource

from rules import Case, Mode, PortRule, Unchanged

# Packages with a `cuda` attribute of their own, never a tensor or a module.
_OTHER_GPU_PACKAGES = frozenset({"torch", "numba", "cupy", "pycuda", "cv2", "tensorflow", "jax", "triton", "warp"})


class CudaTensorMethod(PortRule):
    """Call `.npu()` and read `.is_npu` where tensors and modules use `.cuda()` and `.is_cuda`.

    ## What it does
    In explicit mode, rewrites the method call `x.cuda(...)` to `x.npu(...)` (arguments kept: device index,
    `non_blocking`) and the property `x.is_cuda` to `x.is_npu`.

    ## Why
    Without `transfer_to_npu`, `Tensor.cuda`/`Module.cuda` need a CUDA runtime and `is_cuda` is False for NPU
    tensors. torch_npu adds `Tensor.npu`, `Module.npu` and `Tensor.is_npu` with the same signatures.

    ## Safety
    Safe. Receivers that are modules of other GPU packages (`numba`, `cupy`, ...) are left alone, and so are
    assignments to an `is_cuda` attribute and `self.is_cuda`, which are the script's own attributes.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`Tensor.cuda`, `Module.cuda` and `is_cuda` become their npu forms); Huawei's
    migration tool README, FAQ (`map_location=lambda s, l: s.cuda()`):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "DEV003"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = (".cuda", "is_cuda")
    METADATA_DEPENDENCIES = (QualifiedNameProvider, ExpressionContextProvider)
    EXAMPLES = (
        Case(
            """
            model = Net().cuda()  # move the weights
            for x, y in loader:
                x, y = x.cuda(non_blocking=True), y.cuda(local_rank)
                assert x.is_cuda
            """,
            """
            model = Net().npu()  # move the weights
            for x, y in loader:
                x, y = x.npu(non_blocking=True), y.npu(local_rank)
                assert x.is_npu
            """,
            lines=[1, 3, 4],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import torch
            state = torch.load(
                "ckpt.pt",
                map_location=lambda storage, loc: storage.cuda(),
            )
            """,
            """
            import torch
            state = torch.load(
                "ckpt.pt",
                map_location=lambda storage, loc: storage.npu(),
            )
            """,
            lines=[4],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            loss = criterion(model(batch["x"].cuda()),
                             batch["y"].cuda())
            """,
            """
            loss = criterion(model(batch["x"].npu()),
                             batch["y"].npu())
            """,
            lines=[1, 2],
            mode=Mode.EXPLICIT,
        ),
        Unchanged("model = Net().cuda()\n"),
        Unchanged(
            """
            import numba
            from numba import cuda
            numba.cuda.synchronize()
            cuda.to_device(arr)
            print("call .cuda() first")
            """,
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            class Wrapper:
                def __init__(self):
                    self.is_cuda = False
                def ready(self):
                    return self.is_cuda
            x.cuda
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = updated_node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "cuda":
            return updated_node
        if self._is_package(original_node.func.value):  # type: ignore[attr-defined]
            return updated_node
        new = updated_node.with_changes(func=func.with_changes(attr=cst.Name("npu")))
        return self.replace(original_node, updated_node, new, "`.cuda()` -> `.npu()`")

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if original_node.attr.value != "is_cuda" or self._is_package(original_node.value):
            return updated_node
        if self.get_metadata(ExpressionContextProvider, original_node, None) is not ExpressionContext.LOAD:
            return updated_node
        if isinstance(original_node.value, cst.Name) and original_node.value.value == "self":
            return updated_node
        new = updated_node.with_changes(attr=cst.Name("is_npu"))
        return self.replace(original_node, updated_node, new, "`.is_cuda` -> `.is_npu`")

    def _is_package(self, receiver: cst.BaseExpression) -> bool:
        """Whether `receiver` is an imported GPU package (`numba`, `torch`...), not a tensor or a model."""
        return any(
            name.source is QualifiedNameSource.IMPORT and name.name.split(".")[0] in _OTHER_GPU_PACKAGES
            and not name.name.startswith("torch.")
            for name in self.get_metadata(QualifiedNameProvider, receiver, set())
        )
