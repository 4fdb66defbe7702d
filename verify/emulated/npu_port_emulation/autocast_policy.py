"""NPU autocast numerics on the CPU.

CPU autocast runs convolutions and matrix products in the low-precision dtype, as the NPU does, but leaves most
other ops in whatever dtype arrives: a softmax, layer_norm or sum after an fp16 linear stays fp16 on the CPU, while
CUDA autocast (whose op lists the NPU's follow) computes them in float32. This module registers, for the CPU autocast
dispatch key, the float32 and low-precision casts of the CUDA op lists (torch 2.13, aten/src/ATen/autocast_mode.h)
on the ops that CPU autocast does not already handle. The CUDA target needs none of this: it has CUDA autocast.

CUDA autocast also bans ops outright: binary_cross_entropy raises "unsafe to autocast" whatever its input dtypes
(torch_npu's autocast registers the same refusal), where CPU autocast would run it in float32. The emulated NPU
raises as they do, so that a port computing BCELoss under autocast fails here as it would on the NPU.

The CPU also lacks kernels that the devices have: oneDNN has no float16 LSTM ("could not create a primitive
descriptor for the LSTM forward propagation primitive"), which CUDA (cuDNN) and the NPU (torch_npu's own kernel) run
in float16 under autocast. Such ops (FP32_FALLBACK_OPS) compute in float32 and round their results to the autocast
dtype, as the device returns them; each one so computed is kept in COMPUTED_IN_FP32, which verify's manifest names.

Difference that remains: CUDA's "promote" list (addcmul, index_put, ...) is left to CPU autocast's own handling.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

# CUDA autocast's float32 list: (op, overloads); no overloads means every overload that is not an out= variant.
FLOAT32_OPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (name, ())
    for name in (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "softplus", "layer_norm", "native_layer_norm", "group_norm", "nuclear_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
        "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
        "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
    )
) + (
    ("pow", ("Tensor_Scalar", "Tensor_Tensor", "Scalar")),
    ("frobenius_norm", ("dim",)),
    ("norm", ("Scalar", "ScalarOpt_dim", "names_ScalarOpt_dim")),
)

# CUDA autocast's low-precision list.
LOW_PRECISION_OPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (name, ())
    for name in (
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
        "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
        "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
        "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    )
)

# CUDA autocast's banned ops (the NPU's too), with the advice their refusal gives.
BANNED_OPS: dict[str, str] = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer. In this case, combine the two "
        "layers using torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which are "
        "safe to autocast. (Raised by npu-port's emulated NPU, as CUDA and NPU autocast raise it.)"
    ),
}

# Ops the CPU cannot run in a dtype the devices run them in under autocast: op -> the dtypes it lacks.
FP32_FALLBACK_OPS: dict[str, tuple[torch.dtype, ...]] = {"lstm": (torch.float16,)}
COMPUTED_IN_FP32: set[str] = set()  # "aten.lstm.input (float16)": what this process computed in float32 and rounded

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_REDUCED = (torch.float16, torch.bfloat16)


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in _REDUCED:
        return value.float()
    return value


def _to_low_precision(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in (torch.float32, *_REDUCED):
        return value.to(torch.get_autocast_dtype("cpu"))
    return value


def _casting_kernel(op: torch._ops.OpOverload, cast: Callable[[Any], Any]) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = tree_map(cast, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return op(*args, **kwargs)

    return kernel


def _dispatched_overloads(name: str, chosen: tuple[str, ...], dispatched: set[str]) -> list[torch._ops.OpOverload]:
    """The overloads of aten `name` (those `chosen`, or all but out= variants) that the dispatcher runs: this
    leaves out TorchScript-only overloads (acos.int) and ops this torch does not have."""
    packet = getattr(torch.ops.aten, name, None)
    names = chosen or [overload for overload in getattr(packet, "overloads", list)() if "out" not in overload]
    qualified = {overload: f"aten::{name}" + ("" if overload == "default" else f".{overload}") for overload in names}
    return [getattr(packet, overload) for overload, op_name in qualified.items() if op_name in dispatched]


def _register(library: torch.library.Library, ops: tuple, cast: Callable[[Any], Any]) -> None:
    dispatched = set(torch._C._dispatch_get_all_op_names())
    for name, chosen in ops:
        for op in _dispatched_overloads(name, chosen, dispatched):
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "AutocastCPU"):  # else CPU has a policy
                library.impl(op, _casting_kernel(op, cast), "AutocastCPU")


def _fallback_kernel(op: torch._ops.OpOverload, lacking: tuple[torch.dtype, ...]) -> Callable:
    """CPU autocast's low-precision policy for `op`, except in the dtypes the CPU lacks for it: there float32, with the
    results rounded to that dtype (autograd sees the casts, so the backward runs in float32 too)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("cpu")
        if dtype not in lacking:
            return _casting_kernel(op, _to_low_precision)(*args, **kwargs)
        COMPUTED_IN_FP32.add(f"{op.name().replace('::', '.')} ({str(dtype).removeprefix('torch.')})")
        args, kwargs = tree_map(_to_float32, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            result = op(*args, **kwargs)
        return tree_map(lambda value: value.to(dtype) if _is_float(value) else value, result)

    return kernel


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _fall_back(library: torch.library.Library) -> None:
    """Replace CPU autocast's own policy for FP32_FALLBACK_OPS with one that computes what the CPU lacks in float32."""
    dispatched = set(torch._C._dispatch_get_all_op_names())
    for name, lacking in FP32_FALLBACK_OPS.items():
        for op in _dispatched_overloads(name, (), dispatched):
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
                warnings.simplefilter("ignore", UserWarning)
                library.impl(op, _fallback_kernel(op, lacking), "AutocastCPU")


def _refusing_kernel(message: str) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return kernel


def _ban(library: torch.library.Library) -> None:
    """Replace CPU autocast's own policy for the banned ops (float32 for binary_cross_entropy) with a refusal."""
    dispatched = set(torch._C._dispatch_get_all_op_names())
    for name, message in BANNED_OPS.items():
        for op in _dispatched_overloads(name, (), dispatched):
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
                warnings.simplefilter("ignore", UserWarning)
                library.impl(op, _refusing_kernel(message), "AutocastCPU")


def install_npu_autocast_policy() -> torch.library.Library:
    """Registers the casts and the bans; the returned library must stay alive for them to stay registered."""
    library = torch.library.Library("aten", "IMPL")
    _register(library, FLOAT32_OPS, _to_float32)
    _register(library, LOW_PRECISION_OPS, _to_low_precision)
    _fall_back(library)
    _ban(library)
    return library
