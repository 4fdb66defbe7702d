from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged, dotted_name, frameworks


class _Verdict(NamedTuple):
    severity: Severity
    why: str
    instead: str


_KERNELS = "re-express the kernels with torch operators or an Ascend C custom operator"
# Top-level (or dotted) module -> what happens on an NPU host and what to use instead.
_CUDA_ONLY = {
    "amp_C": _Verdict(Severity.ERROR, "apex's compiled CUDA kernels", "torch._foreach_* ops or torch_npu.optim"),
    "apex_C": _Verdict(Severity.ERROR, "apex's compiled CUDA kernels", "torch operators"),
    "fused_layer_norm_cuda": _Verdict(Severity.ERROR, "apex's compiled CUDA kernels", "torch.nn.LayerNorm"),
    "cupy": _Verdict(Severity.ERROR, "a CUDA array library", "torch tensors on the npu device, or numpy on the CPU"),
    "pycuda": _Verdict(Severity.ERROR, "CUDA driver bindings", _KERNELS),
    "numba.cuda": _Verdict(Severity.ERROR, "numba's CUDA target", _KERNELS),
    "triton": _Verdict(
        Severity.ERROR, "a GPU kernel compiler", "triton-ascend after porting the kernels, or " + _KERNELS
    ),
    "pynvml": _Verdict(Severity.WARNING, "NVIDIA's management library", "npu-smi, or torch.npu.mem_get_info()"),
    "nvidia_smi": _Verdict(Severity.WARNING, "NVIDIA's management library", "npu-smi, or torch.npu.mem_get_info()"),
    "GPUtil": _Verdict(Severity.WARNING, "an nvidia-smi wrapper", "npu-smi, or torch.npu.mem_get_info()"),
    "nvtx": _Verdict(Severity.WARNING, "NVIDIA's profiler markers", "torch_npu.npu.mstx (mark, range_push/range_pop)"),
    "flash_attn": _Verdict(
        Severity.WARNING,
        "CUDA attention kernels",
        "torch.nn.functional.scaled_dot_product_attention or torch_npu.npu_fusion_attention",
    ),
    "xformers": _Verdict(
        Severity.WARNING, "CUDA attention kernels", "torch.nn.functional.scaled_dot_product_attention"
    ),
    "bitsandbytes": _Verdict(Severity.ERROR, "CUDA quantization kernels", "bf16/fp16 weights and torch.optim"),
    "transformer_engine": _Verdict(Severity.ERROR, "NVIDIA's fp8 kernels", "torch.nn layers under torch.autocast"),
    "mamba_ssm": _Verdict(Severity.ERROR, "custom CUDA scan kernels", _KERNELS),
    "causal_conv1d": _Verdict(Severity.ERROR, "custom CUDA kernels", _KERNELS),
    "torch_tensorrt": _Verdict(Severity.ERROR, "TensorRT", "eager mode, or torchair (torch.compile backend 'npu')"),
    "tensorrt": _Verdict(Severity.ERROR, "TensorRT", "eager mode, or torchair (torch.compile backend 'npu')"),
    # a framework's modules of CUDA kernels: its NPU build may provide them (verify/frameworks), and does some
    **{module: _Verdict(Severity.WARNING, *what) for module, what in frameworks.CUDA_ONLY_IMPORTS.items()},
    **{module: _Verdict(Severity.INFO, what, "") for module, what in frameworks.NPU_PROVIDED_IMPORTS.items()},
}


def _cuda_only(module: str) -> str | None:
    """The `_CUDA_ONLY` key that `module` is, or lies under."""
    parts = module.split(".")
    return next((key for key in (".".join(parts[:n]) for n in range(len(parts), 0, -1)) if key in _CUDA_ONLY), None)


class CudaOnlyImport(PortRule):
    """Report imports of CUDA-only packages (apex kernels, CuPy, Triton, pynvml, flash_attn, bitsandbytes...).

    ## What it does
    Reports each `import` / `from ... import` statement that loads a package with no NPU build, once per statement,
    with what the package is and what to use instead. `from numba import cuda` counts as `numba.cuda`. A framework's
    module that its NPU build provides all the same (DeepSpeed's FusedAdam) is reported as information: nothing to
    port.
    Imports inside `try:` blocks are reported too: the fallback they guard should be checked, not trusted.

    ## Why
    These packages either fail to import on an NPU host or import fine and then fail at the first kernel launch.
    Call sites that need a specific port are reported by the UNS rules (kernels, attention, quantization...).

    ## Safety
    Report-only: removing an import that the script uses would only move the failure.

    ## References
    Huawei's migration tool README, constraints (amp_C):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "IMP002"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = tuple(sorted({key.split(".")[0] for key in _CUDA_ONLY} | {"cuda"}))
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Flag(
            """
            import amp_C  # apex kernels
            import pynvml, os
            from numba import cuda
            from flash_attn.flash_attn_interface import flash_attn_func
            import triton.language as tl
            """,
            lines=[1, 2, 3, 4, 5],
        ),
        Flag(  # DeepSpeed's NPU accelerator provides its optimizers (info), not its transformer kernels (warning)
            """
            from deepspeed.ops.adam import FusedAdam
            from deepspeed.ops.transformer import DeepSpeedTransformerLayer
            """,
            lines=[1, 2],
        ),
        Unchanged(
            """
            import numba
            from numba import jit
            import torch.cuda
            from apex import amp
            from .triton_utils import helper
            """
        ),
    )

    def visit_Import(self, node: cst.Import) -> None:
        self._check(node, [dotted_name(alias.name) for alias in node.names])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        module = dotted_name(node.module)
        names = [] if isinstance(node.names, cst.ImportStar) else [dotted_name(alias.name) for alias in node.names]
        self._check(node, [module, *(f"{module}.{name}" for name in names)])

    def _check(self, node: cst.CSTNode, modules: list[str]) -> None:
        keys = list(dict.fromkeys(key for key in map(_cuda_only, modules) if key is not None))
        if not keys:
            return
        verdicts = [_CUDA_ONLY[key] for key in keys]
        severity = max((v.severity for v in verdicts), key=[Severity.INFO, Severity.WARNING, Severity.ERROR].index)
        self.report(
            node,
            "; ".join(f"{key}: {verdict.why}" if verdict.severity is Severity.INFO
                      else f"{key} is {verdict.why}, with no NPU build" for key, verdict in zip(keys, verdicts)),
            "; ".join(f"instead of {key}: {verdict.instead}" if verdict.instead else f"{key}: nothing to port"
                      for key, verdict in zip(keys, verdicts)),
            severity=severity,
        )
