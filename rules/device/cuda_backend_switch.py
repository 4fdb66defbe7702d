from __future__ import annotations

import libcst as cst
from libcst.metadata import QualifiedNameProvider

from rules import Flag, PortRule, Safety, Severity, Unchanged, stored_attributes

# cuDNN tuning switches: no cuDNN on an NPU. (`cudnn.deterministic` is the determinism rules'.)
_CUDNN = ("torch.backends.cudnn.benchmark", "torch.backends.cudnn.enabled", "torch.backends.cudnn.benchmark_limit")
_CUDNN_SWITCHES = frozenset(name.rsplit(".", 1)[1] for name in _CUDNN)  # a cheap first test on every attribute
# Scaled-dot-product-attention kernel choices of CUDA.
_SDPA = (
    "torch.backends.cuda.sdp_kernel",
    "torch.backends.cuda.enable_flash_sdp",
    "torch.backends.cuda.enable_mem_efficient_sdp",
    "torch.backends.cuda.enable_math_sdp",
    "torch.backends.cuda.enable_cudnn_sdp",
    "torch.backends.cuda.preferred_linalg_library",
)


class CudaBackendSwitch(PortRule):
    """Report cuDNN and CUDA attention-kernel switches, which do nothing on an NPU.

    ## What it does
    Reports assignments to `torch.backends.cudnn.benchmark`, `.enabled` and `.benchmark_limit` (info), and calls of
    the CUDA SDPA kernel switches `torch.backends.cuda.sdp_kernel(...)`, `enable_flash_sdp(...)`,
    `enable_mem_efficient_sdp(...)`, `enable_math_sdp(...)`, `enable_cudnn_sdp(...)` and
    `preferred_linalg_library(...)` (warning).

    ## Why
    `transfer_to_npu` leaves `torch.backends.cuda/cudnn` alone and they have no effect on an NPU, in both modes. A
    script that pins an attention kernel for accuracy (say, math SDPA) gets torch_npu's own kernel instead, so the
    GPU and NPU runs may differ there.

    ## Safety
    Report only: the switches are harmless no-ops, and removing a `with` block's manager would move code.

    ## References
    Huawei's migration tool lists the sdp switches as unsupported in its op_list_2_8.json
    (<https://github.com/xiaobingling93-pixel/Ascend-mstt/tree/99c2e0f/msfmktransplt>, src/ms_fmk_transplt/resource/).
    """

    CODE = "DEV011"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("cudnn", "sdp", "linalg_library")
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)
    EXAMPLES = (
        Flag(
            """
            import torch
            torch.backends.cudnn.benchmark = True  # autotune convolutions
            torch.backends.cudnn.deterministic = True
            with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True):
                out = attention(q, k, v)
            torch.backends.cuda.enable_flash_sdp(False)
            """,
            lines=[2, 4, 6],
        ),
        Flag(
            """
            from torch.backends import cudnn
            cudnn.enabled = args.cudnn
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import torch
            if torch.backends.cudnn.benchmark:
                print("cudnn benchmark on")
            ok = torch.backends.cuda.flash_sdp_enabled()
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._stored: set[cst.Attribute] | None = None  # the module's assigned attributes, when first needed

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        switch = original_node.attr.value in _CUDNN_SWITCHES and self.refers_to(original_node, *_CUDNN)
        if switch and self._is_stored(original_node):
            self.report(
                original_node,
                f"`cudnn.{original_node.attr.value}` has no effect on an NPU",
                "keep or remove it; nothing on the NPU side needs it",
                severity=Severity.INFO,
            )
        return updated_node

    def _is_stored(self, attribute: cst.Attribute) -> bool:
        # Found once, on the first cuDNN switch, syntactically: far cheaper than ExpressionContextProvider.
        if self._stored is None:
            self._stored = stored_attributes(self.file.wrapper.module)
        return attribute in self._stored

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.refers_to(original_node.func, *_SDPA):
            self.report(
                original_node,
                "CUDA attention-kernel switch: no effect on an NPU, torch_npu picks its own kernel",
                "compare attention outputs with `verify` if the kernel choice mattered for accuracy",
            )
        return updated_node
