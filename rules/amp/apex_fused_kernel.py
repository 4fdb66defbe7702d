from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from rules import Case, Flag, PortRule, Safety, Severity, Unchanged, attribute_chain, keyword, with_args


@dataclass(frozen=True)
class _Port:
    """How an apex class maps onto torch: which arguments carry over, which go, which must be spelled out."""

    target: str
    positional: int  # leading positional arguments that mean the same in both
    keywords: frozenset[str]  # keywords torch accepts with the same meaning
    # apex-only keyword -> the value torch behaves as (None: any value).
    dropped: dict[str, str | None] = field(default_factory=dict)
    # parameter -> (its position, apex's default), where torch's default differs.
    added: dict[str, tuple[int, str]] = field(default_factory=dict)


_ADAM_KEYWORDS = frozenset({"params", "lr", "betas", "eps", "weight_decay", "amsgrad", "capturable"})
_ADAM_DROPPED = {"bias_correction": "True", "set_grad_none": None, "master_weights": "False", "adam_w_mode": None}
_NORM_KEYWORDS = frozenset({"normalized_shape", "eps", "elementwise_affine"})
_PORTS = {
    # apex FusedAdam is AdamW unless adam_w_mode=False, and its weight_decay defaults to 0, torch AdamW's to 0.01.
    "apex.optimizers.FusedAdam": _Port(
        "torch.optim.AdamW", 2, _ADAM_KEYWORDS, _ADAM_DROPPED, added={"weight_decay": (4, "0.0")}
    ),
    "apex.optimizers.FusedSGD": _Port(
        "torch.optim.SGD",
        6,
        frozenset({"params", "lr", "momentum", "dampening", "weight_decay", "nesterov"}),
        {"wd_after_momentum": "False", "materialize_master_grads": "True", "set_grad_none": None},
    ),
    "apex.normalization.FusedLayerNorm": _Port("torch.nn.LayerNorm", 3, _NORM_KEYWORDS),
    # torch RMSNorm's eps defaults to the dtype's machine epsilon, apex's to 1e-5.
    "apex.normalization.FusedRMSNorm": _Port("torch.nn.RMSNorm", 3, _NORM_KEYWORDS, added={"eps": (1, "1e-5")}),
}
_ADAM = _Port("torch.optim.Adam", 2, _ADAM_KEYWORDS, _ADAM_DROPPED)
_NO_PORT = {
    "apex.optimizers.FusedLAMB": "torch_npu.optim.NpuFusedLamb",
    "apex.optimizers.FusedMixedPrecisionLamb": "torch_npu.optim.NpuFusedLamb",
    "apex.optimizers.FusedNovoGrad": "a torch.optim optimizer",
    "apex.optimizers.FusedAdagrad": "torch.optim.Adagrad",
    "apex.normalization.MixedFusedLayerNorm": "torch.nn.LayerNorm (weights kept in fp32 by autocast)",
    "apex.normalization.MixedFusedRMSNorm": "torch.nn.RMSNorm (weights kept in fp32 by autocast)",
}

_KERNELS = (*_PORTS, *_NO_PORT)


class ApexFusedKernel(PortRule):
    """Replace apex's fused optimizers and norms, CUDA-only kernels, with their torch counterparts.

    ## What it does
    `apex.optimizers.FusedAdam` becomes `torch.optim.AdamW` (`torch.optim.Adam` with `adam_w_mode=False`),
    `FusedSGD` becomes `torch.optim.SGD`, `apex.normalization.FusedLayerNorm` / `FusedRMSNorm` become
    `torch.nn.LayerNorm` / `torch.nn.RMSNorm`. Hyperparameters keep their apex values: `weight_decay=0.0` is spelled
    out for AdamW and `eps=1e-5` for RMSNorm, whose torch defaults differ. apex-only keywords are dropped when they
    hold the value torch behaves as; any other value, or an unknown argument, stops the rewrite and the call is
    reported. `FusedLAMB`, `FusedNovoGrad`, `MixedFusedLayerNorm`... are reported with a suggested replacement.
    The apex import is removed once unused.

    ## Why
    apex's fused kernels are CUDA extensions (`amp_C`, `fused_layer_norm_cuda`) and do not load on an NPU host;
    neither Huawei's tool nor `transfer_to_npu` handles them. `torch_npu.optim.NpuFused*` are faster but need
    parameters that are never re-allocated, so the portable torch classes are the default.

    ## Safety
    Unsafe: the unfused torch kernels round differently from apex's, and master-weight handling differs.

    ## References
    Huawei's migration tool README, constraints (FusedAdam unsupported):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>; torch_npu/optim.
    """

    CODE = "AMP006"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C3", "C9")
    TRIGGERS = ("apex",)
    EXAMPLES = (
        Case(
            """
            import torch
            from apex.optimizers import FusedAdam, FusedSGD
            from apex.normalization import FusedRMSNorm
            optimizer = FusedAdam(model.parameters(), lr=1e-3, bias_correction=True)  # fused
            sgd = FusedSGD(params, 0.1, 0.9, weight_decay=1e-4)
            norm = FusedRMSNorm(hidden)
            """,
            """
            import torch
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3,
                                          weight_decay=0.0)  # fused
            sgd = torch.optim.SGD(params, 0.1, 0.9, weight_decay=1e-4)
            norm = torch.nn.RMSNorm(hidden, eps=1e-5)
            """,
            lines=[4, 5, 6],
        ),
        Case(
            """
            import apex
            opt = apex.optimizers.FusedAdam(params, lr=3e-4, adam_w_mode=False, weight_decay=0.01)
            ln = apex.normalization.FusedLayerNorm(512, eps=1e-6)
            """,
            """
            import torch

            opt = torch.optim.Adam(params, lr=3e-4, weight_decay=0.01)
            ln = torch.nn.LayerNorm(512, eps=1e-6)
            """,
            lines=[2, 3],
        ),
        Flag(
            """
            from apex.optimizers import FusedLAMB, FusedAdam
            opt = FusedLAMB(params, lr=1e-3)
            opt = FusedAdam(params, lr=1e-3, master_weights=True)
            """,
            lines=[2, 3],
        ),
        Unchanged(
            """
            import torch
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            FusedAdam = make_optimizer
            opt = FusedAdam(params)
            """
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.refers_to(original_node.func, *_KERNELS):
            return updated_node  # most calls: known so without resolving their names
        names = self.qualified_names(original_node.func)
        name = next((name for name in names if name in _PORTS or name in _NO_PORT), None)
        if name is None:
            return updated_node
        port = _PORTS.get(name)
        if name == "apex.optimizers.FusedAdam" and _keyword_code(updated_node, "adam_w_mode") == "False":
            port = _ADAM
        args = _ported_arguments(updated_node, port) if port is not None else None
        if port is None or args is None:
            replacement = port.target if port is not None else _NO_PORT[name]
            self.report(
                original_node,
                f"{name} is a CUDA-only apex kernel",
                f"replace it with {replacement} by hand (its arguments do not map one to one)",
                severity=Severity.ERROR,
            )
            return updated_node
        new = with_args(updated_node.with_changes(func=attribute_chain(port.target)), args)
        result = self.replace(
            original_node, updated_node, new, f"{name} -> {port.target}", imports=[("torch", None)]
        )
        if result is new:
            RemoveImportsVisitor.remove_unused_import_by_node(self.context, original_node.func)
        return result


def _keyword_code(call: cst.Call, name: str) -> str | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return cst.Module([]).code_for_node(arg.value)
    return None


def _ported_arguments(call: cst.Call, port: _Port) -> list[cst.Arg] | None:
    """The arguments of the torch call, or None when one of apex's has no torch meaning."""
    kept: list[cst.Arg] = []
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None:
            if index >= port.positional:
                return None
            kept.append(arg)
        elif arg.keyword.value in port.keywords:
            kept.append(arg)
        elif arg.keyword.value not in port.dropped:
            return None
        elif port.dropped[arg.keyword.value] not in (None, cst.Module([]).code_for_node(arg.value)):
            return None
    given = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    positional = sum(arg.keyword is None for arg in call.args)
    kept += [
        keyword(name, cst.parse_expression(default))
        for name, (position, default) in port.added.items()
        if name not in given and position >= positional
    ]
    return kept
