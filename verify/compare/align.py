"""Pair the operator records of the reference run with those of the ported run. Nothing is dropped.

1. exact / related: the same call on both sides: step, phase, module, op#call_index, io and shape (a shape mismatch
   means the n-th call is not the same call: an extra call earlier in the module shifted the counter). Ops that the
   NPU replaces by another kernel (RELATED_OPS: aten op <-> fused NPU kernel) are identified by their family and
   rank instead, and such a pair is `related`;
2. sequence: within each (step, phase, module), difflib's longest matching blocks over op signatures (family, io,
   shape) of what is left, which survives ops inserted or removed on one side.

Whatever remains becomes an only_ref / only_actual row; ops that are expected on one side only (autocast casts) say so
in `note`. The work is done on integer codes (one vocabulary per string column, shared by both sides): a million
records align in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from enum import Enum

import numpy as np
import pandas as pd

from verify.record.schema import OP_COLUMNS, OP_SHARED_COLUMNS, OP_SIDE_COLUMNS


class AlignStatus(str, Enum):
    EXACT = "exact"
    RELATED = "related"
    SEQUENCE = "sequence"
    ONLY_REF = "only_ref"
    ONLY_ACTUAL = "only_actual"


STATUS_CODES = {status: code for code, status in enumerate(AlignStatus)}
MATCHED_STATUSES = (AlignStatus.EXACT.value, AlignStatus.RELATED.value, AlignStatus.SEQUENCE.value)

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
    "aten._scaled_dot_product_cudnn_attention_backward": "attention_backward",
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

# Ops that move or cast values without computing anything: judged by what they carry, never as arithmetic. A cast's or
# a device copy's result follows from its input (a dtype or device change is no divergence), and how many of them run
# depends on the device (a batch copied to the GPU, autocast's weight casts and their cache), so the n-th one on one
# side need not be the n-th on the other. The first divergent operator is always a computing op.
# Ops that draw from a device's random generator: on two devices they differ unless verify aligned them. Runs recorded
# before verify/capture/random_streams.py keyed every such op (manifest.random_keyed_by_tag) are read for them.
RANDOM_OPS = frozenset({
    "aten.bernoulli", "aten.bernoulli_", "aten.uniform_", "aten.normal", "aten.normal_", "aten.rand", "aten.randn",
    "aten.randint", "aten.randperm", "aten.multinomial", "aten.native_dropout", "aten.exponential_", "aten.random_",
    "aten.rand_like", "aten.randn_like", "aten.randint_like", "aten.cauchy_", "aten.geometric_", "aten.log_normal_",
})


def same_computation(op: str, other: str) -> bool:
    """Whether two recorded ops compute the same thing: one op, a RELATED_OPS family's kernels, or an op and its
    in-place form (aten.add and aten.add_)."""
    op, other = op.removesuffix("_"), other.removesuffix("_")
    return RELATED_OPS.get(op, op) == RELATED_OPS.get(other, other)


CARRIER_OPS = frozenset({
    "aten._to_copy", "aten.copy_", "aten.copy", "aten._copy_from", "aten._copy_from_and_resize",
    "aten.clone", "aten.contiguous", "aten.lift_fresh_copy", "aten._unsafe_view", "aten.view_copy",
    "aten.detach_copy", "aten.alias_copy", "aten.expand_copy", "aten.permute_copy", "aten.t_copy",
    "aten.transpose_copy", "aten._reshape_copy",
})

# The op records' columns, as the schema types them (the key is rebuilt by the reports from its parts).
STRING_COLUMNS = tuple(c for c, dtype in OP_COLUMNS.items() if dtype == "string" and c != "key")
FLOAT_COLUMNS = tuple(c for c, dtype in OP_COLUMNS.items() if dtype == "float64")
NUMBER_COLUMNS = tuple(c for c, dtype in OP_COLUMNS.items() if dtype in ("int64", "float64"))


@dataclass
class _Side:
    """One side as integer codes into vocabularies shared with the other side: passes work on ints, not strings."""

    codes: dict[str, np.ndarray]  # string column -> codes (-1 = missing)
    numbers: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.numbers["step"])


def _encode(ref: pd.DataFrame, actual: pd.DataFrame) -> tuple[_Side, _Side, dict[str, pd.Index]]:
    vocab, ref_codes, actual_codes = {}, {}, {}
    for column in STRING_COLUMNS:
        codes, uniques = pd.factorize(pd.concat([ref[column], actual[column]], ignore_index=True))
        ref_codes[column], actual_codes[column], vocab[column] = codes[:len(ref)], codes[len(ref):], uniques
    numbers = [{c: side[c].to_numpy(dtype="float64" if c in FLOAT_COLUMNS else "int64",
                                     na_value=np.nan if c in FLOAT_COLUMNS else 0)
                for c in NUMBER_COLUMNS} for side in (ref, actual)]
    return _Side(ref_codes, numbers[0]), _Side(actual_codes, numbers[1]), vocab


def _combined_key(columns: list[np.ndarray]) -> np.ndarray:
    """One int64 per row that is equal exactly when all columns are: a mixed-radix number, re-factorised only when
    the next digit would overflow int64."""
    key, bound = np.zeros(len(columns[0]), dtype="int64"), 1
    for column in columns:
        column = column.astype("int64") + 1  # -1 (missing) becomes 0
        radix = int(column.max(initial=0)) + 1
        if bound * radix >= 2**62:
            key = pd.factorize(key)[0]
            bound = int(key.max(initial=0)) + 1
        key, bound = key * radix + column, bound * radix
    return key


def _pairs_on(ref_key: np.ndarray, ref_ids: np.ndarray, actual_key: np.ndarray, actual_ids: np.ndarray) -> pd.DataFrame:
    """Rows equal on their key; a key present twice on one side pairs nothing (no guessing between duplicates)."""
    left = pd.DataFrame({"k": ref_key, "ref_id": ref_ids}).drop_duplicates("k", keep=False)
    right = pd.DataFrame({"k": actual_key, "actual_id": actual_ids}).drop_duplicates("k", keep=False)
    return left.merge(right, on="k", how="inner")[["ref_id", "actual_id"]]


def _group_columns(side: _Side, rows: np.ndarray) -> list[np.ndarray]:
    return [side.numbers["step"][rows], side.codes["phase"][rows], side.codes["module"][rows]]


def _family_codes(vocab: dict[str, pd.Index]) -> tuple[np.ndarray, np.ndarray]:
    """Per op in the vocabulary: its family code, and whether it is in RELATED_OPS."""
    names = pd.Series(np.asarray(vocab["op"], dtype=object))
    related = names.isin(RELATED_OPS).to_numpy()
    family = pd.factorize(names.map(RELATED_OPS).fillna(names))[0]
    return np.append(family, -1), np.append(related, False)  # index -1 (missing op) maps to the appended entry


def _identities(ref: _Side, actual: _Side, vocab: dict[str, pd.Index]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per row: (step, phase, module, what, index, io, shape), equal on both sides for the same call.

    `what` is the op and `index` its call_index, except for ops of a RELATED_OPS family in a (step, phase, module,
    io) where both sides made the same number of that family's calls: there `what` is the family and `index` the
    rank among its calls, so that an NPU kernel replacing some of the calls neither breaks nor shifts the pairing.
    Where the counts differ, ranks would pair the wrong calls, so those rows keep op#call_index and whatever stays
    unpaired goes to the sequence pass.
    """
    family, related = _family_codes(vocab)
    sides = (ref, actual)
    members = [np.flatnonzero(related[side.codes["op"]]) for side in sides]
    group = _combined_key([np.concatenate(parts) for parts in zip(*(
        [*_group_columns(side, rows), family[side.codes["op"][rows]], side.codes["io"][rows]]
        for side, rows in zip(sides, members)))])
    group = pd.factorize(group)[0] if len(group) else group
    groups = np.split(group, [len(members[0])])
    size = int(group.max(initial=-1)) + 1
    balanced = np.bincount(groups[0], minlength=size) == np.bincount(groups[1], minlength=size)
    identities = []
    for side, rows, side_group in zip(sides, members, groups):
        order = np.lexsort((side.numbers["seq"][rows], side.numbers["step"][rows]))
        rank = np.empty(len(rows), dtype="int64")
        rank[order] = pd.Series(side_group[order]).groupby(side_group[order]).cumcount().to_numpy()
        use_family = rows[balanced[side_group]]
        what = side.codes["op"].astype("int64")
        what[use_family] = len(vocab["op"]) + family[side.codes["op"][use_family]]
        index = side.numbers["call_index"].copy()
        index[use_family] = rank[balanced[side_group]]
        identities.append([*_group_columns(side, np.arange(len(side))), what, index, side.codes["io"],
                           side.codes["shape"]])
    return identities[0], identities[1]


def _uneven_one_sided(ref: _Side, actual: _Side, vocab: dict[str, pd.Index]) -> np.ndarray:
    """Rows (ref rows, then actual rows) of expected one-sided ops (casts) whose (step, phase, module, op, io) has a
    different count on each side: there the n-th cast is not the same cast (autocast caches casts on one side, not on
    the other), so they pair by shape and order in the sequence pass rather than by call_index."""
    one_sided = np.append(pd.Index(vocab["op"]).isin(list(ONE_SIDED_OPS)), False)
    columns = ([*_group_columns(side, np.arange(len(side))), side.codes["op"], side.codes["io"]]
               for side in (ref, actual))
    group = _combined_key([np.concatenate(pair) for pair in zip(*columns)])
    group = pd.factorize(group)[0] if len(group) else group
    counts = [np.bincount(part, minlength=int(group.max(initial=-1)) + 1) for part in np.split(group, [len(ref)])]
    op = np.concatenate([ref.codes["op"], actual.codes["op"]])
    return one_sided[op] & (counts[0] != counts[1])[group]


def _identity_pairs(ref: _Side, actual: _Side, vocab: dict[str, pd.Index]) -> pd.DataFrame:
    """Pass 1: same identity; `exact` when the op names agree too, else `related`."""
    ref_identity, actual_identity = _identities(ref, actual, vocab)
    keys = _combined_key([np.concatenate(pair) for pair in zip(ref_identity, actual_identity)])
    uneven = _uneven_one_sided(ref, actual, vocab)
    keys[uneven] = -1 - np.flatnonzero(uneven)  # a key of its own: pairs with nothing here
    pairs = _pairs_on(keys[:len(ref)], np.arange(len(ref)), keys[len(ref):], np.arange(len(actual)))
    same_op = ref.codes["op"][pairs["ref_id"].to_numpy()] == actual.codes["op"][pairs["actual_id"].to_numpy()]
    return pairs.assign(status=np.where(same_op, STATUS_CODES[AlignStatus.EXACT], STATUS_CODES[AlignStatus.RELATED]))


def _sequence_pairs(ref: _Side, actual: _Side, ref_rows: np.ndarray, actual_rows: np.ndarray,
                    vocab: dict[str, pd.Index]) -> pd.DataFrame:
    """Longest matching blocks of op signatures (family, io, shape) per (step, phase, module) on both sides."""
    family, _ = _family_codes(vocab)
    one_sided = np.append(pd.Index(vocab["op"]).isin(list(ONE_SIDED_OPS)), False)  # index -1: a missing op
    groups = _combined_key([np.concatenate(pair) for pair in zip(_group_columns(ref, ref_rows),
                                                                   _group_columns(actual, actual_rows))])
    # Signatures and slots of both sides in one vocabulary: a mixed-radix key made per side would number the same
    # (family, io, shape) differently wherever one side has an op the other lacks (a swapped activation).
    sides = ((ref, ref_rows), (actual, actual_rows))
    ops = np.concatenate([side.codes["op"][rows] for side, rows in sides])
    slot = _combined_key([np.concatenate([side.codes[column][rows] for side, rows in sides])
                          for column in ("io", "shape")])
    signature = _combined_key([family[ops], slot])
    slot[one_sided[ops]] = -1  # an expected one-sided op (a cast) never stands in for another

    def by_group(side: _Side, rows: np.ndarray, part: slice) -> dict[int, tuple[np.ndarray, list, np.ndarray]]:
        group, side_signature, side_slot = groups[part], signature[part], slot[part]
        order = np.lexsort((side.codes["io"][rows], side.numbers["seq"][rows], group))
        rows, group, side_signature, side_slot = rows[order], group[order], side_signature[order], side_slot[order]
        bounds = np.flatnonzero(np.diff(group)) + 1
        return {int(g[0]): (r, s.tolist(), t) for g, r, s, t in zip(
            np.split(group, bounds), np.split(rows, bounds), np.split(side_signature, bounds),
            np.split(side_slot, bounds))}

    ref_groups = by_group(ref, ref_rows, slice(0, len(ref_rows)))
    actual_groups = by_group(actual, actual_rows, slice(len(ref_rows), None))
    ref_ids, actual_ids = [], []
    for group, (ref_group, ref_signature, ref_slot) in ref_groups.items():  # one iteration per module call, not row
        if group not in actual_groups:
            continue
        actual_group, actual_signature, actual_slot = actual_groups[group]
        matcher = SequenceMatcher(None, ref_signature, actual_signature, autojunk=False)
        for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
            # Equal runs pair; so do other ops of the same io and shape in a run of the same length in the same place:
            # a port that swapped an op (ReLU for GELU) is compared op for op, and the swapped op is the divergence.
            if tag == "equal":
                keep = np.ones(a_end - a_start, dtype=bool)
            elif tag == "replace" and a_end - a_start == b_end - b_start:
                keep = (ref_slot[a_start:a_end] == actual_slot[b_start:b_end]) & (ref_slot[a_start:a_end] >= 0)
            else:
                continue
            ref_ids.append(ref_group[a_start:a_end][keep])
            actual_ids.append(actual_group[b_start:b_end][keep])
    if not ref_ids:
        return pd.DataFrame({"ref_id": [], "actual_id": [], "status": []}, dtype="int64")
    return pd.DataFrame({"ref_id": np.concatenate(ref_ids), "actual_id": np.concatenate(actual_ids),
                         "status": STATUS_CODES[AlignStatus.SEQUENCE]})


def align_ops(ref: pd.DataFrame, actual: pd.DataFrame) -> pd.DataFrame:
    """One row per pair or unpaired record: `status`, shared step/phase/module/io, then ref_* and actual_* columns.

    Rows are in reference execution order, with actual-only rows placed at their own step and seq. String columns
    come back as categoricals sharing one vocabulary on both sides.
    """
    ref_side, actual_side, vocab = _encode(ref, actual)
    found = [_identity_pairs(ref_side, actual_side, vocab)]
    ref_rows = np.setdiff1d(np.arange(len(ref_side)), found[0]["ref_id"].to_numpy())
    actual_rows = np.setdiff1d(np.arange(len(actual_side)), found[0]["actual_id"].to_numpy())
    if len(ref_rows) and len(actual_rows):
        found.append(_sequence_pairs(ref_side, actual_side, ref_rows, actual_rows, vocab))
        ref_rows = np.setdiff1d(ref_rows, found[-1]["ref_id"].to_numpy())
        actual_rows = np.setdiff1d(actual_rows, found[-1]["actual_id"].to_numpy())
    found.append(pd.DataFrame({"ref_id": ref_rows, "actual_id": -1, "status": STATUS_CODES[AlignStatus.ONLY_REF]}))
    found.append(pd.DataFrame({"ref_id": -1, "actual_id": actual_rows,
                               "status": STATUS_CODES[AlignStatus.ONLY_ACTUAL]}))
    pairs = pd.concat(found, ignore_index=True)
    ref_ids, actual_ids = pairs["ref_id"].to_numpy("int64"), pairs["actual_id"].to_numpy("int64")
    statuses = pairs["status"].to_numpy("int64")
    # Reference execution order; an actual-only row sorts at its own step and seq, close to where it ran.
    has_ref = ref_ids >= 0
    step = np.where(has_ref, _take(ref_side.numbers["step"], ref_ids, 0), _take(actual_side.numbers["step"], actual_ids, 0))
    seq = np.where(has_ref, _take(ref_side.numbers["seq"], ref_ids, 0), _take(actual_side.numbers["seq"], actual_ids, 0))
    io = np.where(has_ref, _take(ref_side.codes["io"], ref_ids, -1), _take(actual_side.codes["io"], actual_ids, -1))
    order = np.lexsort((io, seq, step))
    ref_ids, actual_ids, statuses = ref_ids[order], actual_ids[order], statuses[order]
    return _assemble(ref_side, actual_side, vocab, ref_ids, actual_ids,
                     pd.Categorical.from_codes(statuses, categories=[status.value for status in AlignStatus]))


def _take(values: np.ndarray, ids: np.ndarray, missing: object) -> np.ndarray:
    return np.where(ids >= 0, values[np.maximum(ids, 0)], missing) if len(values) else np.full(len(ids), missing)


def _column(vocab: pd.Index, codes: np.ndarray) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=vocab)


def _assemble(ref: _Side, actual: _Side, vocab: dict[str, pd.Index], ref_ids: np.ndarray, actual_ids: np.ndarray,
              status: pd.Categorical) -> pd.DataFrame:
    has_ref = ref_ids >= 0
    table: dict[str, object] = {}
    for column in OP_SHARED_COLUMNS:
        if column == "step":
            table[column] = np.where(has_ref, _take(ref.numbers["step"], ref_ids, 0),
                                     _take(actual.numbers["step"], actual_ids, 0))
        else:
            table[column] = _column(vocab[column], np.where(has_ref, _take(ref.codes[column], ref_ids, -1),
                                                            _take(actual.codes[column], actual_ids, -1)))
    table["status"] = status
    for prefix, side, ids in (("ref", ref, ref_ids), ("actual", actual, actual_ids)):
        for column in OP_SIDE_COLUMNS:
            if column in side.codes:
                table[f"{prefix}_{column}"] = _column(vocab[column], _take(side.codes[column], ids, -1))
            elif side.numbers[column].dtype.kind == "f":
                table[f"{prefix}_{column}"] = _take(side.numbers[column], ids, np.nan)
            else:
                table[f"{prefix}_{column}"] = pd.arrays.IntegerArray(_take(side.numbers[column], ids, 0), ids < 0)
    op_codes = np.where(has_ref, _take(ref.codes["op"], ref_ids, -1), _take(actual.codes["op"], actual_ids, -1))
    notes = list(dict.fromkeys(ONE_SIDED_OPS.values()))
    note_of_op = np.array([notes.index(ONE_SIDED_OPS[op]) if op in ONE_SIDED_OPS else -1 for op in vocab["op"]] + [-1])
    one_sided = (ref_ids < 0) | (actual_ids < 0)
    table["note"] = pd.Categorical.from_codes(np.where(one_sided, note_of_op[op_codes], -1), categories=notes)
    return pd.DataFrame(table)
