"""Pair the operator records of the reference run with those of the ported run. Nothing is dropped.

Three passes, each over what the previous one left unpaired:

1. exact: same key (step/phase/module/op#n) and io, and the same shape (a shape mismatch means the n-th call of
   the op is not the same call on both sides: an extra call earlier in the module shifted the counter);
2. related: ops that the NPU replaces by a different op (RELATED_OPS: aten op <-> fused NPU kernel), paired by their
   order within (step, phase, module);
3. sequence: within each (step, phase, module), difflib's longest matching blocks over op signatures, which survives
   ops inserted or removed on one side.

Whatever remains becomes an only_ref / only_actual row; ops that are expected on one side only (autocast casts) say so
in `note`.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from enum import Enum

import numpy as np
import pandas as pd

GROUP = ["step", "phase", "module"]


class AlignStatus(str, Enum):
    EXACT = "exact"
    RELATED = "related"
    SEQUENCE = "sequence"
    ONLY_REF = "only_ref"
    ONLY_ACTUAL = "only_actual"


# op -> family. Ops of one family compute the same thing with different kernels, so their outputs are comparable.
RELATED_OPS: dict[str, str] = {
    # Scaled dot-product attention: CUDA picks flash or memory-efficient kernels, the CPU its own, and torch_npu
    # replaces all of them by its fused attention kernel.
    "aten._scaled_dot_product_flash_attention": "attention",
    "aten._scaled_dot_product_efficient_attention": "attention",
    "aten._scaled_dot_product_cudnn_attention": "attention",
    "aten._scaled_dot_product_flash_attention_for_cpu": "attention",
    "npu.npu_fusion_attention": "attention",
    "aten._scaled_dot_product_flash_attention_backward": "attention_backward",
    "aten._scaled_dot_product_efficient_attention_backward": "attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": "attention_backward",
    "npu.npu_fusion_attention_grad": "attention_backward",
    # Batch norm: cuDNN's kernel on CUDA, the native one elsewhere, the functional variant under torch.compile.
    "aten.cudnn_batch_norm": "batch_norm",
    "aten.native_batch_norm": "batch_norm",
    "aten._native_batch_norm_legit": "batch_norm",
    "aten._native_batch_norm_legit_functional": "batch_norm",
    "aten._native_batch_norm_legit_no_training": "batch_norm",
    "aten.cudnn_batch_norm_backward": "batch_norm_backward",
    "aten.native_batch_norm_backward": "batch_norm_backward",
    # Layer norm and RMS norm: torch_npu ships fused kernels that the ported model may call instead.
    "aten.native_layer_norm": "layer_norm",
    "npu.npu_layer_norm_eval": "layer_norm",
    "aten._fused_rms_norm": "rms_norm",
    "npu.npu_rms_norm": "rms_norm",
    # Activations: NPU fast/fused variants of GELU and SiLU.
    "aten.gelu": "gelu",
    "npu.npu_gelu": "gelu",
    "npu.fast_gelu": "gelu",
    "npu.npu_fast_gelu": "gelu",
    "aten.silu": "silu",
    "npu.npu_silu": "silu",
    # Dropout: the NPU generates its mask in a separate kernel.
    "aten.native_dropout": "dropout",
    "npu._npu_dropout": "dropout",
    "npu.npu_dropout_with_add_softmax": "dropout",
    # Convolution: cuDNN entry points seen on CUDA against the generic op elsewhere.
    "aten.convolution": "convolution",
    "aten.cudnn_convolution": "convolution",
    "aten._convolution": "convolution",
    "npu.npu_conv2d": "convolution",
    # Linear: addmm on 2-D inputs, a fused NPU linear on the port.
    "aten.addmm": "linear",
    "npu.npu_linear": "linear",
    # Rotary embedding: torch_npu's fused rotary multiply against the eager arithmetic is not one-to-one, but a
    # model ported to call npu_rotary_mul often calls a helper op of the same role on the reference.
    "npu.npu_rotary_mul": "rotary",
    # Softmax cross-entropy pieces.
    "aten._log_softmax": "log_softmax",
    "npu.npu_softmax_cross_entropy_with_logits": "log_softmax",
}

# Ops expected on one side only, with the reason shown in the report instead of an alarming "unmatched".
ONE_SIDED_OPS: dict[str, str] = {
    # Autocast inserts casts to and from fp16/bf16: a port that gained AMP has them and its fp32 reference does not.
    "aten._to_copy": "cast (autocast on one side only)",
    # Copying a batch to the device: a no-op on a CPU reference, a real copy on the (emulated) NPU.
    "aten.copy_": "device copy",
    # NPU format casts (ND <-> NZ fractal layouts) have no CUDA counterpart.
    "npu.npu_format_cast": "NPU memory-format cast",
}


def _family(op: pd.Series) -> pd.Series:
    return op.map(RELATED_OPS).fillna(op)


def _exact_pairs(ref: pd.DataFrame, actual: pd.DataFrame) -> pd.DataFrame:
    left = ref.loc[~ref.duplicated(["key", "io"], keep=False), ["key", "io", "shape", "ref_id"]]
    right = actual.loc[~actual.duplicated(["key", "io"], keep=False), ["key", "io", "shape", "actual_id"]]
    pairs = left.merge(right, on=["key", "io", "shape"], how="inner")
    return pairs[["ref_id", "actual_id"]]


def _related_pairs(ref: pd.DataFrame, actual: pd.DataFrame) -> pd.DataFrame:
    """Pair related ops by their order within (step, phase, module, family, io)."""

    def ranked(side: pd.DataFrame) -> pd.DataFrame:
        side = side.loc[side["op"].isin(RELATED_OPS)].sort_values(["step", "seq"])
        side = side.assign(family=side["op"].map(RELATED_OPS))
        return side.assign(rank=side.groupby([*GROUP, "family", "io"], sort=False).cumcount())

    keys = [*GROUP, "family", "io", "rank"]
    pairs = ranked(ref)[[*keys, "ref_id"]].merge(ranked(actual)[[*keys, "actual_id"]], on=keys, how="inner")
    return pairs[["ref_id", "actual_id"]]


def _sequence_pairs(ref: pd.DataFrame, actual: pd.DataFrame) -> pd.DataFrame:
    """Longest matching blocks of op signatures (family|io) per (step, phase, module) present on both sides."""
    ref = ref.sort_values(["step", "seq", "io"]).assign(signature=lambda f: _family(f["op"]) + "|" + f["io"])
    actual = actual.sort_values(["step", "seq", "io"]).assign(signature=lambda f: _family(f["op"]) + "|" + f["io"])
    actual_groups = {key: group for key, group in actual.groupby(GROUP, sort=False)}
    ref_ids, actual_ids = [], []
    for key, ref_group in ref.groupby(GROUP, sort=False):  # one iteration per module call group, not per row
        actual_group = actual_groups.get(key)
        if actual_group is None:
            continue
        matcher = SequenceMatcher(None, ref_group["signature"].tolist(), actual_group["signature"].tolist(),
                                  autojunk=False)
        for block in matcher.get_matching_blocks():
            ref_ids.append(ref_group["ref_id"].to_numpy()[block.a:block.a + block.size])
            actual_ids.append(actual_group["actual_id"].to_numpy()[block.b:block.b + block.size])
    if not ref_ids:
        return pd.DataFrame({"ref_id": [], "actual_id": []}, dtype="int64")
    return pd.DataFrame({"ref_id": np.concatenate(ref_ids), "actual_id": np.concatenate(actual_ids)})


def _prefixed(side: pd.DataFrame, ids: np.ndarray, prefix: str) -> pd.DataFrame:
    """Rows `ids` of `side` (-1 = missing: all NaN), columns renamed `prefix_column`."""
    rows = side.drop(columns=[f"{prefix}_id"]).reindex(ids).reset_index(drop=True)
    return rows.add_prefix(f"{prefix}_")


def align_ops(ref: pd.DataFrame, actual: pd.DataFrame) -> pd.DataFrame:
    """One row per pair or unpaired record: `status`, shared step/phase/module/io, then ref_* and actual_* columns.

    Rows are in reference execution order, with actual-only rows placed at their own step and seq.
    """
    ref = ref.reset_index(drop=True).assign(ref_id=np.arange(len(ref)))
    actual = actual.reset_index(drop=True).assign(actual_id=np.arange(len(actual)))
    found = []
    for status, pairing in ((AlignStatus.EXACT, _exact_pairs), (AlignStatus.RELATED, _related_pairs),
                            (AlignStatus.SEQUENCE, _sequence_pairs)):
        ref_left = ref.loc[~ref["ref_id"].isin(_taken(found, "ref_id"))]
        actual_left = actual.loc[~actual["actual_id"].isin(_taken(found, "actual_id"))]
        if ref_left.empty or actual_left.empty:
            break
        found.append(pairing(ref_left, actual_left).assign(status=status.value))
    only_ref = ref.loc[~ref["ref_id"].isin(_taken(found, "ref_id")), ["ref_id"]].assign(
        actual_id=-1, status=AlignStatus.ONLY_REF.value)
    only_actual = actual.loc[~actual["actual_id"].isin(_taken(found, "actual_id")), ["actual_id"]].assign(
        ref_id=-1, status=AlignStatus.ONLY_ACTUAL.value)
    pairs = pd.concat([*found, only_ref, only_actual], ignore_index=True)
    return _assemble(ref, actual, pairs)


def _taken(found: list[pd.DataFrame], column: str) -> np.ndarray:
    return np.concatenate([pairs[column].to_numpy() for pairs in found]) if found else np.array([], dtype="int64")


def _assemble(ref: pd.DataFrame, actual: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    ref_ids = pairs["ref_id"].to_numpy(dtype="int64")
    actual_ids = pairs["actual_id"].to_numpy(dtype="int64")
    ref_rows = _prefixed(ref, ref_ids, "ref")
    actual_rows = _prefixed(actual, actual_ids, "actual")
    has_ref = ref_ids >= 0
    shared = {column: ref_rows[f"ref_{column}"].where(has_ref, actual_rows[f"actual_{column}"])
              for column in ("step", "phase", "module", "io")}
    op = ref_rows["ref_op"].where(has_ref, actual_rows["actual_op"])
    table = pd.concat([pd.DataFrame(shared), pairs[["status"]].reset_index(drop=True), ref_rows, actual_rows],
                      axis=1)
    table["step"] = table["step"].astype("int64")
    # Order: ref execution order; an actual-only row sorts at its own seq, which is close to where it ran.
    table["order"] = ref_rows["ref_seq"].where(has_ref, actual_rows["actual_seq"])
    table["note"] = op.map(ONE_SIDED_OPS).where(~pairs["status"].isin(
        [AlignStatus.EXACT.value, AlignStatus.RELATED.value, AlignStatus.SEQUENCE.value]).to_numpy(), pd.NA)
    table = table.sort_values(["step", "order", "io"], kind="stable").drop(columns="order")
    return table.reset_index(drop=True)
