"""What verify knows about ops by their recorded names ('aten.addmm', 'npu.npu_rms_norm'), in one place: which ops
compute the same thing with other kernels (families), which are expected on one side only, which only carry values,
which draw random numbers, which are nondeterministic on GPUs, and which a precision switch changes. Alignment
(align.py), the operators' verdicts (op_verdicts.py), the findings, the notes (runs.py) and the advice read these
rows; nothing else names an op's kind. No torch.

A user extends the families and the one-sided ops with mapping files (`--op-mapping FILE` on `verify compare` and
on the pair command, repeatable), as msprobe's api and module mapping files do. A mapping file is a JSON object with
up to two keys:

    {
      "related": {
        "npu.npu_add_layer_norm": "aten.native_layer_norm",
        "npu.npu_my_attention": ["aten._scaled_dot_product_flash_attention",
                                 "aten._scaled_dot_product_flash_attention_for_cpu"]
      },
      "one_sided": {"npu.npu_my_layout_cast": "layout cast of my kernel library"}
    }

`related` maps a kernel of the port (an NPU fused kernel, say) to the reference op whose output it computes, or to a
list of such ops (the kernels the reference may call in its place on different devices): one call of the kernel
stands for one call of one of them. They become one family, so that alignment pairs their calls (status `related`,
within a module call where both sides make as many calls of the family) and a pair of them is not a changed op. Where
one of them is already in a family (the built-in FAMILIES below), the others join it. What a fused kernel absorbs
around that op (the add of npu_add_layer_norm) stays unmatched on the reference's side. `one_sided` names ops expected
on one side only, with the note the reports show for them. Op names are written as verify records them,
`namespace.name` (ops.csv's ref_op and actual_op: 'aten.mul', 'npu.npu_rms_norm'). A file not of this form stops
the command with exit 2 and one line naming the file and what is wrong, before anything runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from verify.errors import VerifyFailure


@dataclass(frozen=True)
class OpFamily:
    """Ops that compute the same thing with different kernels, so that their outputs are comparable."""

    name: str
    ops: tuple[str, ...]
    why: str


FAMILIES: tuple[OpFamily, ...] = (
    OpFamily("attention", (
        "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
        "npu.npu_fusion_attention"),
        "scaled dot-product attention: CUDA picks flash or memory-efficient kernels, the CPU its own, and torch_npu "
        "replaces all of them by its fused attention kernel"),
    OpFamily("attention_backward", (
        "aten._scaled_dot_product_flash_attention_backward", "aten._scaled_dot_product_efficient_attention_backward",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
        "aten._scaled_dot_product_cudnn_attention_backward", "npu.npu_fusion_attention_grad"),
        "the backward kernels of the attention family"),
    OpFamily("batch_norm", (
        "aten.cudnn_batch_norm", "aten.native_batch_norm", "aten._native_batch_norm_legit",
        "aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit_no_training"),
        "cuDNN's kernel on CUDA, the native one elsewhere, the functional variant under torch.compile"),
    OpFamily("batch_norm_backward", ("aten.cudnn_batch_norm_backward", "aten.native_batch_norm_backward"),
             "the backward kernels of the batch norm family"),
    OpFamily("layer_norm", ("aten.native_layer_norm", "npu.npu_layer_norm_eval"),
             "torch_npu ships a fused layer norm that the ported model may call instead"),
    OpFamily("rms_norm", ("aten._fused_rms_norm", "npu.npu_rms_norm"),
             "torch_npu ships a fused RMS norm that the ported model may call instead"),
    OpFamily("gelu", ("aten.gelu", "npu.npu_gelu", "npu.fast_gelu", "npu.npu_fast_gelu"),
             "NPU fast and fused variants of GELU"),
    OpFamily("silu", ("aten.silu", "npu.npu_silu"), "the NPU's fused SiLU"),
    OpFamily("dropout", ("aten.native_dropout", "npu._npu_dropout", "npu.npu_dropout_with_add_softmax"),
             "the NPU generates its mask in a separate kernel"),
    OpFamily("convolution", ("aten.convolution", "aten.cudnn_convolution", "aten._convolution", "npu.npu_conv2d"),
             "cuDNN entry points seen on CUDA against the generic op elsewhere"),
    OpFamily("linear", ("aten.addmm", "npu.npu_linear"), "addmm on 2-D inputs, a fused NPU linear on the port"),
    OpFamily("rotary", ("npu.npu_rotary_mul",),
             "torch_npu's fused rotary multiply against the eager arithmetic is not one-to-one, but a model ported to "
             "call npu_rotary_mul often calls a helper op of the same role on the reference"),
    OpFamily("log_softmax", ("aten._log_softmax", "npu.npu_softmax_cross_entropy_with_logits"),
             "softmax cross-entropy pieces"),
)

# Ops expected on one side only, with the reason shown in the report instead of an alarming "unmatched".
ONE_SIDED: dict[str, str] = {
    # Autocast inserts casts to and from fp16/bf16: a port that gained AMP has them and its fp32 reference does not.
    "aten._to_copy": "cast (autocast on one side only)",
    # Copying a batch to the device: a no-op on a CPU reference, a real copy on the (emulated) NPU.
    "aten.copy_": "device copy",
    # NPU format casts (ND <-> NZ fractal layouts) have no CUDA counterpart.
    "npu.npu_format_cast": "NPU memory-format cast",
}

# Ops that move or cast values without computing anything: judged by what they carry, never as arithmetic. A cast's or
# a device copy's result follows from its input (a dtype or device change is no divergence), and how many of them run
# depends on the device (a batch copied to the GPU, autocast's weight casts and their cache), so the n-th one on one
# side need not be the n-th on the other. The first divergent operator is always a computing op.
CARRIERS = frozenset({
    "aten._to_copy", "aten.copy_", "aten.copy", "aten._copy_from", "aten._copy_from_and_resize",
    "aten.clone", "aten.contiguous", "aten.lift_fresh_copy", "aten._unsafe_view", "aten.view_copy",
    "aten.detach_copy", "aten.alias_copy", "aten.expand_copy", "aten.permute_copy", "aten.t_copy",
    "aten.transpose_copy", "aten._reshape_copy",
})

# Ops that draw from a device's random generator: on two devices they differ unless verify aligned them. Runs recorded
# before verify/capture/random_streams.py keyed every such op (manifest.random_keyed_by_tag) are read for them.
RANDOM = frozenset({
    "aten.bernoulli", "aten.bernoulli_", "aten.uniform_", "aten.normal", "aten.normal_", "aten.rand", "aten.randn",
    "aten.randint", "aten.randperm", "aten.multinomial", "aten.native_dropout", "aten.exponential_", "aten.random_",
    "aten.rand_like", "aten.randn_like", "aten.randint_like", "aten.cauchy_", "aten.geometric_", "aten.log_normal_",
})

# Ops whose GPU kernels accumulate with atomics, so two runs of the same script differ (PyTorch's reproducibility
# notes; Huawei's precision advice lists embedding backward too): the advice asks for `verify determinism` first.
NONDETERMINISTIC = frozenset({
    "aten.index_add", "aten.index_add_", "aten.scatter_add", "aten.scatter_add_", "aten.index_put_",
    "aten.embedding_dense_backward", "aten._embedding_bag", "aten._embedding_bag_backward",
    "aten.upsample_bilinear2d_backward", "aten.upsample_nearest2d_backward", "aten.cumsum",
    "aten.nll_loss2d_backward", "aten.max_pool3d_with_indices_backward", "aten.avg_pool3d_backward",
    "aten.bincount", "aten.histc",
})

# Ops whose results a matmul or convolution precision switch (TF32, HF32) changes by itself.
MATMULS = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.matmul", "aten.linear", "aten.mv",
    "aten.addmv", "aten.einsum", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention", "aten.scaled_dot_product_attention",
})
CONVOLUTIONS = frozenset({
    "aten.convolution", "aten.convolution_backward", "aten._convolution", "aten.conv1d", "aten.conv2d",
    "aten.conv3d", "aten.conv_transpose1d", "aten.conv_transpose2d", "aten.conv_transpose3d",
    "aten.cudnn_convolution", "aten.mkldnn_convolution", "aten._slow_conv2d_forward",
})
# Kernels that compute several ops as one: the ops they fuse run below them, unrecorded, so where one diverges its
# part that differs is not named. Per op: what it fuses, and how a script computes those parts as eager ops instead.
# Measured: the Lightning transformer example with its ReLU's kernel 1% off named aten._transformer_encoder_layer_fwd
# (nn.TransformerEncoderLayer's fast path, taken where no gradient is needed).
_MHA_FASTPATH_OFF = "torch.backends.mha.set_fastpath_enabled(False)"
FUSED: dict[str, tuple[str, str]] = {
    "aten._transformer_encoder_layer_fwd": (
        "a whole nn.TransformerEncoderLayer (attention, linear layers, activation, layer norms)", _MHA_FASTPATH_OFF),
    "aten._native_multi_head_attention": ("nn.MultiheadAttention's projections and attention", _MHA_FASTPATH_OFF),
    "aten._fused_adam_": ("Adam's whole update of every parameter", "Adam(..., fused=False)"),
    "aten._fused_adamw_": ("AdamW's whole update of every parameter", "AdamW(..., fused=False)"),
    "aten._fused_sgd_": ("SGD's whole update of every parameter", "SGD(..., fused=False)"),
}
# Environment settings (verify/record/environment.py's names) whose difference changes these ops' values by itself.
CHANGED_BY_SETTING: dict[str, frozenset[str]] = {
    "precision.fp32_matmul": MATMULS,
    "precision.fp32_conv": CONVOLUTIONS,
    "precision.float32_matmul_precision": MATMULS,
    "environment.CLOSE_MATMUL_K_SHIFT": MATMULS,
}


@dataclass(frozen=True)
class OpCatalogue:
    """The facts a comparison reads that a user may extend: the families (op -> family name) and the one-sided ops
    (op -> the note the reports show)."""

    families: Mapping[str, str]
    one_sided: Mapping[str, str]
    sources: tuple[str, ...] = ()  # the user's mapping files it holds

    def family(self, op: str) -> str:
        return self.families.get(op, op)

    def same_computation(self, op: str, other: str) -> bool:
        """Whether two recorded ops compute the same thing: one op, a family's kernels, or an op and its in-place
        form (aten.add and aten.add_)."""
        return self.family(op.removesuffix("_")) == self.family(other.removesuffix("_"))

    def extended(self, path: Path) -> OpCatalogue:
        """This catalogue with a user's mapping file (module docstring); VerifyFailure naming the file if it is not
        of that form."""
        mapping = _read_mapping(path)
        families = dict(self.families)
        for kernel, reference_ops in mapping.get("related", {}).items():
            members = [kernel, *([reference_ops] if isinstance(reference_ops, str) else reference_ops)]
            joined = {families[op] for op in members if op in families}
            name = next((families[op] for op in members if op in families), kernel)
            families.update({op: name for op, family in families.items() if family in joined})
            families.update({op: name for op in members})
        return OpCatalogue(families, {**self.one_sided, **mapping.get("one_sided", {})}, (*self.sources, str(path)))


BUILT_IN = OpCatalogue({op: family.name for family in FAMILIES for op in family.ops}, ONE_SIDED)


def read_catalogue(paths: list[Path] | None) -> OpCatalogue:
    """The built-in catalogue extended by the user's mapping files, in order."""
    catalogue = BUILT_IN
    for path in paths or ():
        catalogue = catalogue.extended(path)
    return catalogue


_SECTIONS = {"related": "a kernel of the port -> the reference op or list of ops it computes",
             "one_sided": "an op expected on one side only -> the note the reports show"}


def _read_mapping(path: Path) -> dict[str, dict[str, Any]]:
    def bad(what: str) -> VerifyFailure:
        return VerifyFailure(f"op mapping file {path}: {what} (its format: verify/compare/op_catalogue.py)")

    def check_name(section: str, op: str, name: Any) -> None:
        if not isinstance(name, str) or "." not in name.strip(".") or name != name.strip():
            raise bad(f"{section}[{op!r}]: {name!r} is not an op name as verify records it, 'namespace.name' "
                      "('npu.npu_rms_norm', 'aten.mul')")

    try:
        mapping = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise bad(f"cannot be read: {error.strerror or error}") from None
    except ValueError as error:
        raise bad(f"is not valid JSON: {error}") from None
    if not isinstance(mapping, dict):
        raise bad(f"holds a JSON {type(mapping).__name__}, not an object with the keys {', '.join(_SECTIONS)}")
    for section, entries in mapping.items():
        if section not in _SECTIONS:
            raise bad(f"unknown key {section!r}; the keys are "
                      + "; ".join(f"{key!r}: {meaning}" for key, meaning in _SECTIONS.items()))
        if not isinstance(entries, dict):
            raise bad(f"{section!r} must be an object: {_SECTIONS[section]}")
        for op, value in entries.items():
            check_name(section, op, op)
            if section == "one_sided":
                if not (isinstance(value, str) and value.strip()):
                    raise bad(f"one_sided[{op!r}] must be the note shown for it, a non-empty string")
                continue
            targets = [value] if isinstance(value, str) else value
            if not isinstance(targets, list) or not targets:
                raise bad(f"related[{op!r}] must be an op name or a non-empty list of op names")
            for name in targets:
                check_name(section, op, name)
    return mapping
