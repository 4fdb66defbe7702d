"""Compare a reference run with a ported run: loss curves, hyperparameters, operators, gradients, overflow, outputs.

Pure computation over two `Run` (read by compare_cli from a run directory or an msprobe dump): it returns a
`ComparisonResult` that report.py renders. It never imports torch, so a comparison runs on any laptop.

The first divergent operator is the earliest op, in reference execution order, whose outputs break their tolerance
while its inputs agree. Tensor mode records inputs (io "in0", ...) and uses them. Statistics mode records outputs
only, so "its inputs agree" is approximated by "the previous matched op of the same step agrees": in a sequential
model that op produced the input; in a branching one it is the nearest evidence that the values flowing in are sound.
The first recorded op of a step has only the batch and the weights as inputs, which are not recorded; it counts as
having agreeing inputs, and when it is the first op of the first step a data-order finding is raised too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

from verify import environment, metrics, tolerances
from verify.align import CARRIER_OPS, RANDOM_OPS, AlignStatus, align_ops, same_computation
from verify.store import Run, RunDirError
from verify.schema import AUTOCAST_DTYPES, HALF_DTYPES, INPUT_OP, STAT_COLUMNS, DumpMode, Status, VerifyFailure

MATCHED = (AlignStatus.EXACT.value, AlignStatus.RELATED.value, AlignStatus.SEQUENCE.value)
JUDGED_BY = ["stats", "md5", "tensor"]  # which evidence decided a matched row's `passed`
# How few matched ops make two runs look like different scripts rather than a port of one script.
LOW_MATCH_SHARE = 0.5


class CompareError(VerifyFailure):
    """Inputs that cannot be compared at all (unreadable run directory, unsafe path): exit code 2."""


@dataclass(frozen=True)
class CompareOptions:
    loss_rtol: float | None = None  # None: the precision policy's default (tolerances.LOSS_RTOL or AMP_VS_FP32_...)


class FindingCode(str, Enum):
    RUN_FAILED = "run_failed"
    STEPS_DIFFER = "steps_differ"  # both ran as far as they could, one of them fewer steps than the other
    HPARAM_MISMATCH = "hparam_mismatch"
    OVERFLOW = "overflow"
    SCALE_COLLAPSE = "scale_collapse"
    LOSS_DIVERGES = "loss_diverges"
    OUTPUT_DIVERGES = "output_diverges"
    OP_DIVERGES = "op_diverges"
    OP_CHANGED = "op_changed"  # the port calls another computation where the original calls this one
    DATA_ORDER = "data_order"
    NONDETERMINISM = "nondeterminism"
    GRAD_DIVERGES = "grad_diverges"
    AMP_ONE_SIDE = "amp_one_side"
    LOW_MATCH = "low_match"
    GRADS_NOT_RESET = "grads_not_reset"
    SCALE_STUCK = "scale_stuck"
    ENVIRONMENT_DIFFERS = "environment_differs"  # not failing by itself: it names a cause (verify/environment.py)


# Findings that fail the verdict, causes before symptoms: the one-line reason names the first that is present. The
# first divergent operator comes before the loss it moves.
FAILING = (FindingCode.RUN_FAILED, FindingCode.STEPS_DIFFER, FindingCode.HPARAM_MISMATCH, FindingCode.DATA_ORDER,
           FindingCode.GRADS_NOT_RESET, FindingCode.OP_CHANGED, FindingCode.OVERFLOW, FindingCode.OP_DIVERGES,
           FindingCode.NONDETERMINISM,
           FindingCode.OUTPUT_DIVERGES, FindingCode.LOSS_DIVERGES, FindingCode.GRAD_DIVERGES, FindingCode.LOW_MATCH)


@dataclass
class Finding:
    code: FindingCode
    message: str  # one line, with the numbers
    detail: dict[str, Any] = field(default_factory=dict)  # what advice rules and reports need (op, dtype, side...)


@dataclass
class PrecisionPolicy:
    ref_amp: str  # "" (fp32), "float16" or "bfloat16"
    actual_amp: str
    op_widen: float  # factor on every op tolerance
    loss_rtol: float
    description: str  # the sentence the verdict carries

    @property
    def mixed(self) -> bool:
        return self.ref_amp != self.actual_amp


@dataclass
class LossComparison:
    frame: pd.DataFrame  # step, micro_step, ref_loss, actual_loss, abs_diff, rel_diff, ref/actual_loss_scale, passed
    rtol: float
    steps_compared: int = 0
    max_abs_diff: float = float("nan")
    mean_abs_diff: float = float("nan")
    max_rel_diff: float = float("nan")
    mean_rel_diff: float = float("nan")
    first_step_past_tolerance: int | None = None


@dataclass
class Verdict:
    passed: bool
    reason: str  # one line: PASS/FAIL and why

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


@dataclass
class ComparisonResult:
    verdict: Verdict
    policy: PrecisionPolicy
    ref: Run
    actual: Run
    loss: LossComparison
    ops: pd.DataFrame  # align_ops + metrics + tolerance + passed
    first_divergent: dict[str, Any] | None
    hparams: pd.DataFrame  # differences only: step, group, name, ref_value, actual_value, message
    grads: pd.DataFrame  # step, param, ref_norm, actual_norm, rel_diff, passed
    outputs: pd.DataFrame  # inference: step, output, metrics, passed
    overflow: dict[str, Any]
    findings: list[Finding]
    notes: list[str]
    ops_not_compared: str = ""  # why no operator was compared (compare._ops_not_compared), "" when they were

    def status_counts(self) -> dict[str, int]:
        counts = self.ops["status"].value_counts() if len(self.ops) else pd.Series(dtype="int64")
        return {status.value: int(counts.get(status.value, 0)) for status in AlignStatus}

    def summary(self) -> dict[str, Any]:
        """What CI reads in summary.json: verdict, numbers, findings; no per-op rows. Values may be numpy or pandas
        scalars: report.write_json makes them plain JSON data."""
        loss = {item.name: getattr(self.loss, item.name) for item in fields(self.loss) if item.name != "frame"}
        return {
            "verdict": "PASS" if self.verdict.passed else "FAIL",
            "passed": self.verdict.passed,
            "exit_code": self.verdict.exit_code,
            "reason": self.verdict.reason,
            "comparison": self.policy.description,
            "ref": {"path": str(self.ref.root), "title": self.ref.manifest.title, "source": self.ref.source,
                    "emulated": self.ref.manifest.emulated},
            "actual": {"path": str(self.actual.root), "title": self.actual.manifest.title,
                       "source": self.actual.source, "emulated": self.actual.manifest.emulated},
            "loss": loss,
            "ops": {**self.status_counts(), "past_tolerance": int((self.ops["passed"] == False).sum()),  # noqa: E712
                    "not_compared": self.ops_not_compared},
            "first_divergent": self.first_divergent,
            "hparam_differences": self.hparams["message"].tolist(),
            "environment_differences": [asdict(d) for d in
                                        environment.differences(self.ref.manifest, self.actual.manifest)],
            "overflow": self.overflow,
            "findings": [{"code": f.code.value, "message": f.message, "detail": f.detail} for f in self.findings],
            "notes": self.notes,
        }


# --- precision policy ----------------------------------------------------------------------------------------------


def amp_dtype(run: Run) -> str:
    """The half dtype a run computed its forward in: the autocast it was given, else what its ops show."""
    imposed = AUTOCAST_DTYPES.get(run.manifest.autocast, run.manifest.autocast if run.manifest.autocast in HALF_DTYPES
                                  else "")
    if imposed:
        return imposed
    forward = run.ops.loc[run.ops["phase"] == "forward", "dtype"]
    seen = forward[forward.isin(HALF_DTYPES)]
    return str(seen.mode().iloc[0]) if len(seen) else ""


def precision_policy(ref: Run, actual: Run, options: CompareOptions) -> PrecisionPolicy:
    ref_amp, actual_amp = amp_dtype(ref), amp_dtype(actual)
    if ref_amp == actual_amp:
        widen, loss_rtol = 1.0, tolerances.LOSS_RTOL
        description = (f"same-AMP policy ({ref_amp} autocast on both sides): dtype tolerances" if ref_amp
                       else "same precision (fp32 on both sides): dtype tolerances")
    else:
        widen, loss_rtol = tolerances.AMP_VS_FP32_OP_FACTOR, tolerances.AMP_VS_FP32_LOSS_RTOL
        description = (f"fp32-vs-AMP: ref {ref_amp or 'fp32'}, actual {actual_amp or 'fp32'}; op tolerances of the "
                       f"looser dtype widened x{widen:g}, loss rtol {loss_rtol:g}. This mixes AMP noise with porting "
                       "errors: rerun the reference under the same autocast to isolate the port")
    if options.loss_rtol is not None:
        loss_rtol = options.loss_rtol
    return PrecisionPolicy(ref_amp, actual_amp, widen, loss_rtol, description)


# --- operators -----------------------------------------------------------------------------------------------------


def op_metrics(aligned: pd.DataFrame, ref: Run, actual: Run, policy: PrecisionPolicy,
               notes: list[str]) -> pd.DataFrame:
    """Adds statistic differences, the judged error, tolerances, tensor/md5 metrics and `passed` to aligned rows."""
    table = aligned
    for stat in metrics.STAT_NAMES:
        ref_values, actual_values = table[f"ref_{stat}"].to_numpy("float64"), table[f"actual_{stat}"].to_numpy("float64")
        table[f"{stat}_diff"] = metrics.difference(ref_values, actual_values)
        table[f"{stat}_rel_diff"] = metrics.relative_difference(ref_values, actual_values)
    table["stats_error"] = metrics.stats_error(
        {s: table[f"ref_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES},
        {s: table[f"actual_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES})
    limits = tolerances.pair_tolerances(table["ref_dtype"], table["actual_dtype"], policy.op_widen)
    batch = (table["ref_op"] == INPUT_OP).to_numpy(dtype=bool, na_value=False)
    limits.loc[batch, "stats_rtol"] = np.minimum(limits.loc[batch, "stats_rtol"], tolerances.BATCH_RTOL)
    table["tolerance"] = limits["stats_rtol"].to_numpy()
    matched = table["status"].isin(MATCHED).to_numpy()
    nonfinite_agree = (_has(table, "ref_nan_count") == _has(table, "actual_nan_count")) & (
        _has(table, "ref_inf_count") == _has(table, "actual_inf_count"))
    stats_ok = ~(table["stats_error"].to_numpy() > table["tolerance"].to_numpy())  # NaN (no stats) is not a failure
    judged_by = np.where(matched, JUDGED_BY.index("stats"), -1)
    passed = stats_ok & nonfinite_agree
    passed = _judge_md5(table, matched, passed, nonfinite_agree, judged_by)
    passed = _judge_tensors(table, matched, passed, nonfinite_agree, judged_by, limits, ref, actual, notes)
    table["judged_by"] = pd.Categorical.from_codes(judged_by, categories=JUDGED_BY)
    passed = passed | _indices_of_agreeing_values(table, matched, passed)
    # Casts and copies carry values, they compute none: what they carry is judged at the ops that use it (their n-th
    # call on one side need not be the n-th on the other), so they are neither passed nor failed themselves.
    carried = table["ref_op"].isin(list(CARRIER_OPS)).to_numpy(dtype=bool, na_value=False)
    judged = matched & ~_scaler_overflow(table, ref, actual) & ~carried
    table["passed"] = pd.arrays.BooleanArray(passed & judged, ~judged)  # unmatched rows: NA, neither pass nor fail
    return table


def _indices_of_agreeing_values(table: pd.DataFrame, matched: np.ndarray, passed: np.ndarray) -> np.ndarray:
    """Integer outputs of an op whose floating outputs agree: the indices of max_pool2d_with_indices, topk, sort or
    max.dim. They come from comparing floats, and values within tolerance may tie-break to other positions, so the
    values they index decide. An op with integer outputs only (argmax, an index computation) stays exact."""
    exact = table["ref_dtype"].isin(tolerances.EXACT_DTYPES).to_numpy(dtype=bool, na_value=False)
    seq = table["ref_seq"].to_numpy(dtype="int64", na_value=-1)  # actual-only rows have none
    call = pd.factorize(table["step"].to_numpy("int64") * (seq.max(initial=0) + 1) + seq)[0]
    size = int(call.max(initial=-1)) + 1
    floats = matched & ~exact
    values_agree = (np.bincount(call, weights=floats & passed, minlength=size)
                    == np.bincount(call, weights=floats, minlength=size)) & (np.bincount(call, weights=floats,
                                                                                          minlength=size) > 0)
    return matched & exact & values_agree[call]


def skipped_steps(ref: Run, actual: Run) -> list[int]:
    """Steps whose update a loss scaler skipped on either side: their gradients overflowed on purpose."""
    return sorted(set(ref.manifest.skipped_steps) | set(actual.manifest.skipped_steps))


def _scaler_overflow(table: pd.DataFrame, ref: Run, actual: Run) -> np.ndarray:
    """Backward rows of a skipped step holding inf/nan on either side: dynamic loss scaling at work (compared by
    compare_overflow, skip for skip), not values to judge. An fp32 reference never overflows where its AMP port does."""
    nonfinite = (_has(table, "ref_nan_count") | _has(table, "ref_inf_count") | _has(table, "actual_nan_count")
                 | _has(table, "actual_inf_count"))
    backward = (table["phase"] == "backward").to_numpy()
    return nonfinite & backward & table["step"].isin(skipped_steps(ref, actual)).to_numpy()


def _has(table: pd.DataFrame, column: str) -> np.ndarray:
    return table[column].fillna(0).to_numpy("float64") > 0


def _filled(column: pd.Series) -> np.ndarray:
    """Rows of a categorical string column (align_ops' output) that hold a non-empty value, without touching strings."""
    codes = column.cat.codes.to_numpy()
    # dtype=bool: on pandas 2.0 comparing "string" categories gives a BooleanArray, which would make an object array
    non_empty = np.append(np.asarray(column.cat.categories != "", dtype=bool), False)
    return non_empty[codes]  # code -1 (missing) takes the appended False


def _judge_md5(table: pd.DataFrame, matched: np.ndarray, passed: np.ndarray, nonfinite_agree: np.ndarray,
               judged_by: np.ndarray) -> np.ndarray:
    both = matched & _filled(table["ref_md5"]) & _filled(table["actual_md5"])
    # Both sides' columns share one vocabulary (align_ops), so equal codes are equal fingerprints.
    equal = metrics.md5_equal(table["ref_md5"].cat.codes.to_numpy(), table["actual_md5"].cat.codes.to_numpy())
    table["md5_equal"] = pd.arrays.BooleanArray(equal & both, ~both)
    judged_by[both] = JUDGED_BY.index("md5")
    return np.where(both, equal & nonfinite_agree, passed)


def _judge_tensors(table: pd.DataFrame, matched: np.ndarray, passed: np.ndarray, nonfinite_agree: np.ndarray,
                   judged_by: np.ndarray, limits: pd.DataFrame, ref: Run, actual: Run, notes: list[str]) -> np.ndarray:
    """Tensor mode: full-tensor metrics for the (few) rows whose both sides saved their tensor."""
    rows = np.flatnonzero(matched & _filled(table["ref_tensor_file"]) & _filled(table["actual_tensor_file"]))
    ref_files, actual_files = table["ref_tensor_file"].to_numpy()[rows], table["actual_tensor_file"].to_numpy()[rows]
    values = {name: np.full(len(table), np.nan) for name in metrics.TENSOR_METRICS}
    unreadable = []
    for row, ref_file, actual_file in zip(rows, ref_files, actual_files):  # one per saved tensor pair: file reads
        try:
            ref_tensor, actual_tensor = ref.load_array(ref_file), actual.load_array(actual_file)
        except (OSError, ValueError, RunDirError) as error:
            unreadable.append(f"{ref_file} / {actual_file}: {error}")
            continue
        if ref_tensor.shape != actual_tensor.shape:
            unreadable.append(f"{ref_file}: shape {ref_tensor.shape} vs {actual_tensor.shape}")
            continue
        for name, metric in metrics.TENSOR_METRICS.items():
            values[name][row] = metric(ref_tensor, actual_tensor)
    for name, column in values.items():
        table[name] = column
    if unreadable:
        notes.append(f"{len(unreadable)} tensor pair(s) judged by statistics only (unreadable or different "
                     f"shapes), first: {unreadable[0]}")
    judged = np.zeros(len(table), bool)
    judged[rows] = True
    judged &= ~np.isnan(values["cosine"])
    # msprobe's rule, with our dtype thresholds: a low cosine fails; a large error fails unless nearly all elements
    # are close (a few outliers in a big tensor).
    tensor_ok = (values["cosine"] >= limits["cosine_min"].to_numpy()) & ~(
        (values["max_abs_error"] > limits["max_abs_error"].to_numpy())
        & (values["within_5e3"] < limits["within_5e3_min"].to_numpy()))
    judged_by[judged] = JUDGED_BY.index("tensor")
    return np.where(judged, tensor_ok & nonfinite_agree, passed)


def first_divergent_op(table: pd.DataFrame) -> dict[str, Any] | None:
    """The earliest op (ref step, seq) whose outputs break tolerance while its inputs agree (see module doc)."""
    computing = ~table["ref_op"].isin(list(CARRIER_OPS)).to_numpy()  # casts and copies carry, they do not compute
    matched = np.flatnonzero(table["status"].isin(MATCHED).to_numpy() & computing)
    if not len(matched):
        return None
    step = table["step"].to_numpy()[matched]
    seq = table["ref_seq"].to_numpy(dtype="int64", na_value=0)[matched]
    # The batch records (INPUT_OP) are no op's inputs: they stand first in the chain, so that an op after a batch that
    # differs is not taken for the cause (compare._input_findings names the batch).
    batch = (table["ref_op"].iloc[matched] == INPUT_OP).to_numpy(dtype=bool, na_value=False)
    is_input = table["io"].iloc[matched].str.startswith("in").to_numpy(dtype=bool, na_value=False) & ~batch
    failed = (table["passed"].iloc[matched] == False).to_numpy(dtype=bool, na_value=False)  # noqa: E712
    # One id per op call, increasing in execution order (the table is sorted by step, then ref seq).
    op_id = pd.factorize(step * (int(seq.max()) + 1) + seq, sort=True)[0]
    n_ops = int(op_id.max()) + 1
    failed &= ~_explained_by_inherited_noise(table, matched)
    output_failed = np.bincount(op_id, weights=failed & ~is_input, minlength=n_ops) > 0
    input_failed = np.bincount(op_id, weights=failed & is_input, minlength=n_ops) > 0
    inputs_recorded = np.bincount(op_id, weights=is_input, minlength=n_ops) > 0
    op_step = np.zeros(n_ops, dtype="int64")
    op_step[op_id] = step
    first_of_step = np.r_[True, op_step[1:] != op_step[:-1]]
    previous_ok = np.r_[True, ~output_failed[:-1]] | first_of_step
    op_seq = np.zeros(n_ops, dtype="int64")
    op_seq[op_id] = seq
    flow_known, producers_failed = _producers_failed(table, matched, op_id, op_step, op_seq, output_failed)
    inputs_ok = np.where(inputs_recorded, ~input_failed, np.where(flow_known, ~producers_failed, previous_ok))
    is_batch = np.bincount(op_id, weights=batch, minlength=n_ops) > 0
    candidates = np.flatnonzero(output_failed & inputs_ok & ~is_batch)
    if not len(candidates):
        return None
    chosen = candidates[0]
    rows = table.iloc[matched[(op_id == chosen) & failed & ~is_input]]
    worst = rows.sort_values("stats_error", ascending=False, na_position="last").iloc[0]
    stats = STAT_COLUMNS
    return {
        "step": int(worst["step"]), "seq": int(worst["ref_seq"]), "phase": str(worst["phase"]),
        "module": str(worst["module"]), "op": str(worst["ref_op"]), "actual_op": str(worst["actual_op"]),
        "io": str(worst["io"]), "status": str(worst["status"]), "judged_by": str(worst["judged_by"]),
        "dtype": str(worst["ref_dtype"]), "actual_dtype": str(worst["actual_dtype"]),
        "stats_error": float(worst["stats_error"]), "tolerance": float(worst["tolerance"]),
        "ref": {stat: float(worst[f"ref_{stat}"]) for stat in stats},
        "actual": {stat: float(worst[f"actual_{stat}"]) for stat in stats},
        "cosine": float(worst.get("cosine", np.nan)),
        "inputs_evidence": ("its recorded inputs agree" if inputs_recorded[chosen]
                            else "the ops that produced its inputs agree" if flow_known[chosen]
                            else "first recorded op of the step (inputs: batch and weights, not recorded)"
                            if first_of_step[chosen] else "the previous matched op of the step agrees"),
        "first_of_step": bool(first_of_step[chosen] and not inputs_recorded[chosen]),
        "ops_past_tolerance": int(failed.sum()),
    }


def _producer_pairs(table: pd.DataFrame, rows: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """The data flow (ops.inputs) of `rows`: a (row, step, seq) pair per recorded call of the reference whose output
    the row's op read, and the rows whose run recorded a data flow at all (not schema version 1 runs)."""
    inputs = table["ref_inputs"].iloc[rows]
    known = rows[inputs.notna().to_numpy()]
    listed = pd.DataFrame({"row": known, "step": table["step"].to_numpy()[known],
                           "seq": inputs.dropna().astype(str).str.split(",").to_numpy()}).explode("seq")
    return listed.loc[listed["seq"].fillna("") != ""].astype({"seq": "int64"}), known


def _producers_failed(table: pd.DataFrame, matched: np.ndarray, op_id: np.ndarray, op_step: np.ndarray,
                      op_seq: np.ndarray, output_failed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op call: whether its data flow was recorded, and whether a call that produced its inputs failed."""
    pairs, known_rows = _producer_pairs(table, matched)
    call_of_row = np.full(len(table), -1)
    call_of_row[matched] = op_id
    known = np.zeros(len(output_failed), dtype=bool)
    known[call_of_row[known_rows]] = True
    failed_calls = pd.MultiIndex.from_arrays([op_step[output_failed], op_seq[output_failed]])
    from_failed = pd.MultiIndex.from_frame(pairs[["step", "seq"]]).isin(failed_calls)
    failed = np.zeros(len(output_failed), dtype=bool)
    failed[call_of_row[pairs["row"].to_numpy()[from_failed]]] = True
    return known, failed


def _explained_by_inherited_noise(table: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`: its error is no larger than the noise the op inherits explains, that is at most
    tolerances.NOISE_AMPLIFICATION times the error of the calls that produced its inputs, or within the tolerance of
    their dtypes (an fp32 residual add of a bf16 matmul's output is as noisy as bf16). The producers are the recorded
    data flow (ops.inputs); runs recorded without it (schema version 1) get two stand-ins: the calls just before the
    op in its step, casts included (tolerances.INHERITED_NOISE_WINDOW: an fp32 layer norm whose incoming gradient
    comes from bf16 matmuls), and the earlier calls of the step with an output of its shape (gradient clipping's
    multiply on gradients made in backward). Integer outputs stay exact."""
    matched = np.flatnonzero(table["status"].isin(MATCHED).to_numpy())
    calls = pd.DataFrame({
        "step": table["step"].to_numpy()[matched], "seq": table["ref_seq"].to_numpy(dtype="int64", na_value=0)[matched],
        "shape": table["ref_shape"].cat.codes.to_numpy()[matched],
        "error": np.nan_to_num(table["stats_error"].to_numpy("float64")[matched], nan=0.0),
        "tolerance": table["tolerance"].to_numpy("float64")[matched]}, index=matched)
    limit = np.zeros(len(table))
    limit[matched] = _stand_in_limit(calls)
    pairs, known = _producer_pairs(table, matched)
    limit[known] = 0.0  # a recorded data flow replaces the stand-ins: no producer, nothing inherited
    per_call = calls.groupby(["step", "seq"])[["error", "tolerance"]].max().reset_index()
    flow = pairs.merge(per_call, on=["step", "seq"]).groupby("row")[["error", "tolerance"]].max()
    limit[flow.index.to_numpy()] = _limit(flow["error"].to_numpy(), flow["tolerance"].to_numpy())
    error = np.nan_to_num(table["stats_error"].to_numpy("float64")[rows], nan=0.0)
    exact = table["tolerance"].to_numpy("float64")[rows] == 0
    return (error <= limit[rows]) & ~exact


def _limit(inherited_error: np.ndarray, inherited_tolerance: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.fmax(tolerances.NOISE_AMPLIFICATION * inherited_error, inherited_tolerance), nan=0.0)


def _stand_in_limit(calls: pd.DataFrame) -> np.ndarray:
    """Without a recorded data flow: the window of calls before each one, and the earlier calls of its shape."""
    calls = calls.assign(call=pd.factorize(calls["step"] * (int(calls["seq"].max()) + 1) + calls["seq"],
                                           sort=True)[0])
    per_call = calls.groupby("call").agg(step=("step", "first"), error=("error", "max"), tolerance=("tolerance", "max"))
    window = per_call.groupby("step")[["error", "tolerance"]].transform(
        lambda values: values.shift(1).rolling(tolerances.INHERITED_NOISE_WINDOW, min_periods=1).max())
    by_shape = calls.groupby(["step", "shape", "call"])[["error", "tolerance"]].max()
    same_shape = by_shape.groupby(level=["step", "shape"]).transform(lambda values: values.shift(1).cummax()).reindex(
        pd.MultiIndex.from_frame(calls[["step", "shape", "call"]]))
    before = window.reindex(calls["call"])
    return _limit(np.fmax(before["error"].to_numpy(), same_shape["error"].to_numpy()),
                  np.fmax(before["tolerance"].to_numpy(), same_shape["tolerance"].to_numpy()))


def _op_label(op: dict[str, Any]) -> str:
    where = f"{op['module']} " if op["module"] else ""
    return f"{op['op']} ({where}{op['phase']}, step {op['step']}, {op['io']})"


# --- losses, hyperparameters, gradients, outputs ---------------------------------------------------------------------


def compare_losses(ref: Run, actual: Run, rtol: float) -> LossComparison:
    keys = ["step", "micro_step"]
    left = ref.losses.loc[:, ["step", "micro_step", "loss", "loss_scale"]].rename(
        columns={"loss": "ref_loss", "loss_scale": "ref_loss_scale"})
    right = actual.losses.loc[:, ["step", "micro_step", "loss", "loss_scale"]].rename(
        columns={"loss": "actual_loss", "loss_scale": "actual_loss_scale"})
    frame = left.merge(right, on=keys, how="inner").sort_values(keys).reset_index(drop=True)
    ref_loss = pd.to_numeric(frame["ref_loss"], errors="coerce").to_numpy("float64")
    actual_loss = pd.to_numeric(frame["actual_loss"], errors="coerce").to_numpy("float64")
    frame["abs_diff"] = np.abs(actual_loss - ref_loss)
    frame["rel_diff"] = frame["abs_diff"] / np.maximum(np.abs(ref_loss), metrics.TINY)
    # A loss that is NaN/inf on either side is past any tolerance, also when both are (nothing is learnt then).
    frame["rel_diff"] = frame["rel_diff"].where(np.isfinite(ref_loss) & np.isfinite(actual_loss), np.inf)
    frame["passed"] = frame["rel_diff"] <= rtol
    result = LossComparison(frame=frame, rtol=rtol, steps_compared=int(frame["step"].nunique()))
    if len(frame):
        finite = frame.loc[np.isfinite(frame["rel_diff"])]
        result.max_abs_diff, result.mean_abs_diff = float(finite["abs_diff"].max()), float(finite["abs_diff"].mean())
        result.max_rel_diff = float(frame["rel_diff"].max())
        result.mean_rel_diff = float(finite["rel_diff"].mean())
        failing = frame.loc[~frame["passed"], "step"]
        result.first_step_past_tolerance = int(failing.iloc[0]) if len(failing) else None
    return result


def _hparam_text(value: Any) -> str:
    """A canonical text for comparing and showing a value, whether the reader parsed its JSON or not."""
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return "(absent)"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True)


def compare_hparams(ref: Run, actual: Run) -> pd.DataFrame:
    """Every hyperparameter that differs, at the first step it differs: 'lr 0.1 vs 0.01 in group 0'. Only steps both
    runs made count: a run that stopped early (a crash, a NaN loss) has not lost its optimizer."""
    keys = [key for key in ("step", "optimizer", "group", "name") if key in ref.hparams and key in actual.hparams]
    common_steps = set(ref.hparams["step"]) & set(actual.hparams["step"])
    sides = [frame.loc[frame["step"].isin(common_steps)].astype({"group": "string"})
             .assign(text=lambda rows: rows["value"].map(_hparam_text))[[*keys, "text"]]
             for frame in (ref.hparams, actual.hparams)]
    merged = sides[0].merge(sides[1], on=keys, how="outer", suffixes=("_ref", "_actual"))
    merged["ref_value"] = merged["text_ref"].fillna("(absent)")
    merged["actual_value"] = merged["text_actual"].fillna("(absent)")
    # A scheduler's bookkeeping copies (initial_lr, ...) sort after the value they copy (lr), which names the cause.
    differing = (merged.loc[merged["ref_value"] != merged["actual_value"]]
                 .assign(derived=lambda rows: rows["name"].astype(str).str.startswith("initial_"))
                 .sort_values([key for key in keys if key != "name"] + ["derived", "name"]))
    first = differing.drop_duplicates([k for k in keys if k != "step"]).reset_index(drop=True)
    first_step = int(merged["step"].min()) if len(merged) else 0
    # Composed in Python, row by row (a handful of rows): pandas arithmetic on strings depends on each column's dtype
    # (object, pandas 3's str, all-NA), and `+` between them raises on pandas 3.
    optimizers = (pd.to_numeric(first["optimizer"], errors="coerce").fillna(0).astype(int).tolist()
                  if "optimizer" in first else [0] * len(first))
    first["message"] = [
        _hparam_message(name, ref_value, actual_value, group, optimizer, step if step > first_step else None)
        for name, ref_value, actual_value, group, optimizer, step in zip(
            first["name"], first["ref_value"], first["actual_value"], first["group"], optimizers, first["step"])]
    return first[["step", "group", "name", "ref_value", "actual_value", "message"]]


def _hparam_message(name: Any, ref_value: str, actual_value: str, group: Any, optimizer: int,
                    since_step: int | None) -> str:
    """'lr 0.1 vs 0.01 in group 0 of optimizer 1 from step 3': the parts that apply."""
    group_text = "" if group is None or group is pd.NA or str(group) in ("", "nan", "<NA>") else f" in group {group}"
    optimizer_text = f" of optimizer {optimizer}" if optimizer > 0 else ""
    since = f" from step {since_step}" if since_step is not None else ""
    return f"{name} {ref_value} vs {actual_value}{group_text}{optimizer_text}{since}"


def compare_grads(ref: Run, actual: Run, rtol: float) -> pd.DataFrame:
    keys = ["step", "param"]
    columns = [*keys, "dtype", "norm", "nan_count", "inf_count"]
    # The gradients of a step a loss scaler skipped were never applied, and overflowed on purpose on the scaled side.
    skipped = skipped_steps(ref, actual)
    sides = [run.grads.loc[~run.grads["step"].isin(skipped), columns] for run in (ref, actual)]
    merged = sides[0].merge(sides[1], on=keys, how="inner", suffixes=("_ref", "_actual"))
    merged = merged.rename(columns=lambda c: f"{c.rsplit('_', 1)[1]}_{c.rsplit('_', 1)[0]}"
                           if c.endswith(("_ref", "_actual")) else c)
    ref_norm, actual_norm = merged["ref_norm"].to_numpy("float64"), merged["actual_norm"].to_numpy("float64")
    scale = np.maximum(np.maximum(np.abs(ref_norm), np.abs(actual_norm)), tolerances.GRAD_NORM_ATOL)
    merged["rel_diff"] = np.abs(actual_norm - ref_norm) / scale
    nonfinite_agree = ((merged["ref_nan_count"] > 0) == (merged["actual_nan_count"] > 0)) & (
        (merged["ref_inf_count"] > 0) == (merged["actual_inf_count"] > 0))
    merged["passed"] = (merged["rel_diff"] <= rtol) & nonfinite_agree
    return merged.sort_values(keys).reset_index(drop=True)


def compare_outputs(ref: Run, actual: Run, policy: PrecisionPolicy, notes: list[str]) -> pd.DataFrame:
    """Inference: the outermost module's outputs, by full tensors when saved, else by statistics."""
    keys = ["step", "output"]
    merged = ref.outputs.merge(actual.outputs, on=keys, how="inner", suffixes=("_ref", "_actual"))
    merged = merged.rename(columns=lambda c: f"{c.rsplit('_', 1)[1]}_{c.rsplit('_', 1)[0]}"
                           if c.endswith(("_ref", "_actual")) else c)
    limits = tolerances.pair_tolerances(merged["ref_dtype"], merged["actual_dtype"], policy.op_widen)
    merged["stats_error"] = metrics.stats_error(
        {s: merged[f"ref_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES},
        {s: merged[f"actual_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES})
    values = {name: np.full(len(merged), np.nan) for name in metrics.OUTPUT_METRICS}
    for row in range(len(merged)):  # one iteration per output tensor: a handful per step
        ref_file, actual_file = merged["ref_tensor_file"].iloc[row], merged["actual_tensor_file"].iloc[row]
        if pd.isna(ref_file) or pd.isna(actual_file) or not ref_file or not actual_file:
            continue
        try:
            ref_tensor, actual_tensor = ref.load_array(ref_file), actual.load_array(actual_file)
        except (OSError, ValueError, RunDirError) as error:
            notes.append(f"output {merged['output'].iloc[row]} at step {merged['step'].iloc[row]}: {error}")
            continue
        if ref_tensor.shape == actual_tensor.shape:
            for name, metric in metrics.OUTPUT_METRICS.items():
                values[name][row] = metric(ref_tensor, actual_tensor)
    for name, column in values.items():
        merged[name] = column
    by_tensor = ~np.isnan(values["cosine"])
    tensor_ok = (values["cosine"] >= limits["cosine_min"].to_numpy()) & ~(
        values["top1_agreement"] < tolerances.OUTPUT_TOP1_MIN) & ~(values["top5_agreement"] < tolerances.OUTPUT_TOP5_MIN)
    stats_ok = ~(merged["stats_error"].to_numpy() > limits["stats_rtol"].to_numpy())
    merged["passed"] = np.where(by_tensor, tensor_ok, stats_ok)
    return merged


# --- overflow ------------------------------------------------------------------------------------------------------


def _expected_overflow(ops: pd.DataFrame, skipped: list[int]) -> pd.Series:
    """Rows whose inf/nan a loss scaler dealt with: backward ops of a step whose update the scaler skipped. Dynamic
    loss scaling overflows on purpose (a GradScaler starts high and backs off), so these are its work, not a fault."""
    return (ops["phase"] == "backward") & ops["step"].isin(skipped)


def _first_nonfinite(ops: pd.DataFrame, skipped: list[int]) -> dict[str, Any] | None:
    bad = ops.loc[((ops["nan_count"].fillna(0) > 0) | (ops["inf_count"].fillna(0) > 0))
                  & ~_expected_overflow(ops, skipped)]
    if bad.empty:
        return None
    first = bad.sort_values(["step", "seq"]).iloc[0]
    return {key: first[key] for key in ("step", "seq", "phase", "module", "op", "io", "dtype", "nan_count",
                                        "inf_count")}


def _scale_trace(run: Run) -> dict[str, Any]:
    """The loss scale per step and how it moved. The first steps of dynamic loss scaling back off until the scale
    fits (the calibration): only drops after the first step that was not skipped count as overflows in training."""
    scale = pd.to_numeric(run.losses.groupby("step")["loss_scale"].first(), errors="coerce").dropna()
    skipped = set(run.manifest.skipped_steps)
    applied = [step for step in scale.index if step not in skipped]
    after_calibration = scale.loc[scale.index >= applied[0]] if applied else scale.iloc[:0]
    drops = int((after_calibration.diff() < 0).sum())
    interval = int(run.manifest.loss_scaler.get("growth_interval") or 0)
    return {
        "scales": [float(v) for v in scale.to_numpy()],
        "skipped": sorted(skipped),
        "drops": drops,
        "collapsed": bool(len(scale) > 1 and (scale.diff() < 0).any()
                          and scale.min() <= tolerances.SCALE_COLLAPSE_FLOOR),
        "frequent": bool(len(after_calibration) > 1
                         and drops >= tolerances.FREQUENT_OVERFLOW_SHARE * (len(after_calibration) - 1)),
        # a dynamic scaler grows after `interval` steps without overflow; one that never does is static or stuck
        "stuck": bool(len(scale) and (not run.manifest.loss_scaler.get("dynamic", True) or (
            interval and _longest_unskipped_run(scale.index, skipped) > interval and not (scale.diff() > 0).any()))),
    }


def _longest_unskipped_run(steps: pd.Index, skipped: set[int]) -> int:
    longest = current = 0
    for step in steps:
        current = 0 if step in skipped else current + 1
        longest = max(longest, current)
    return longest


def _one_sided_skips(ref: Run, actual: Run) -> list[dict[str, Any]]:
    """Steps where, under the same loss scale, one side's gradients overflowed and the other's did not. A reference
    that follows the port's scaler (the twin) skips the port's steps whatever happens, so its own overflows are in
    manifest.loss_scaler["overflowed"]; a side with its own GradScaler overflowed exactly at its skipped steps."""
    common = set(ref.losses["step"]) & set(actual.losses["step"])
    scales = [pd.to_numeric(run.losses.groupby("step")["loss_scale"].first(), errors="coerce")
              for run in (ref, actual)]
    overflowed = [set(run.manifest.loss_scaler.get("overflowed", run.manifest.skipped_steps)) for run in (ref, actual)]
    differing = []
    for step in sorted(common & (overflowed[0] ^ overflowed[1])):
        ref_scale, actual_scale = scales[0].get(step, np.nan), scales[1].get(step, np.nan)
        if np.isfinite(ref_scale) and ref_scale == actual_scale:  # an fp32 reference never overflows: not comparable
            differing.append({"step": int(step), "scale": float(ref_scale),
                              "side": "ref" if step in overflowed[0] else "actual"})
    return differing


def compare_overflow(ref: Run, actual: Run) -> dict[str, Any]:
    ref_first = _first_nonfinite(ref.ops, ref.manifest.skipped_steps)
    actual_first = _first_nonfinite(actual.ops, actual.manifest.skipped_steps)
    same_op = bool(ref_first and actual_first and all(
        ref_first[k] == actual_first[k] for k in ("step", "phase", "module", "op")))
    return {"ref_first": ref_first, "actual_first": actual_first,
            "one_sided": bool((ref_first is None) != (actual_first is None)) or (
                bool(ref_first and actual_first) and not same_op),
            "one_sided_skips": _one_sided_skips(ref, actual),
            "ref_scale": _scale_trace(ref), "actual_scale": _scale_trace(actual)}


# --- findings and the verdict ----------------------------------------------------------------------------------------


def _how_runs_ended(ref: Run, actual: Run) -> tuple[list[Finding], str]:
    """The findings from how the two scripts ended, and the ending they share ("" when both ran every step).

    A pair proves something only where the reference ran: a reference that stopped (crashed, timed out, lost its
    loss to NaN, made no step) is CompareError (exit 2), and so are two sides that both stopped before their first
    step. Two sides that ended alike (the same status and error after the same number of steps: a short epoch, a bug
    the port faithfully keeps) are judged on the steps they made. Otherwise a port that stopped is a failed run, and
    ending by itself after another number of steps than the reference is a finding."""
    ref_ran, actual_ran = (run.manifest.status in _RAN_THROUGH for run in (ref, actual))
    if ref_ran and actual_ran:
        return [], ""
    where = f"(runs: {ref.root}, {actual.root})"
    same_ending = _ending(ref) == _ending(actual)
    if not (ref_ran or actual_ran) and ref.manifest.steps_completed == actual.manifest.steps_completed == 0:
        errors = _error_words(ref) if same_ending else f"ref {_error_words(ref)}; actual {_error_words(actual)}"
        raise CompareError(f"both sides stopped before their first step: {errors} {where}")
    if same_ending:
        return [], _shared_ending(ref)
    if ref.manifest.status not in _ENDED_BY_ITSELF:
        port = "" if actual_ran else f"; the port {_stop_words(actual)}: {_error_words(actual)}"
        raise CompareError(f"the reference {_stop_words(ref)}: {_error_words(ref)}{port}; a reference that cannot "
                           f"run proves nothing {where}")
    if actual.manifest.status not in _ENDED_BY_ITSELF:
        status = actual.manifest.status
        return [Finding(FindingCode.RUN_FAILED, f"actual run {status}: {actual.manifest.message or _error(actual)}",
                        {"side": "actual", "status": status})], ""
    return [Finding(FindingCode.STEPS_DIFFER, (
        f"the scripts ran different numbers of steps: ref {_steps_made(ref)}, actual {_steps_made(actual)}"),
        {"ref_steps": ref.manifest.steps_completed, "actual_steps": actual.manifest.steps_completed,
         "steps_requested": ref.manifest.steps_requested})], ""


# Statuses of a script that ran every step asked for ("": an msprobe dump, which records no status), and of one that
# ran as far as it could: its loop ended before the steps asked for (Status.SHORT).
_RAN_THROUGH = (Status.OK.value, "")
_ENDED_BY_ITSELF = (*_RAN_THROUGH, Status.SHORT.value)
# The variables torchrun sets for each process; a script reading one of them was written for a launcher.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")


def _ending(run: Run) -> tuple[str, int, str]:
    return run.manifest.status, run.manifest.steps_completed, _error(run)


def _error(run: Run) -> str:
    """What stopped a run: the exception (the traceback's last line), else the manifest's message."""
    manifest = run.manifest
    return (manifest.traceback.strip().splitlines() or [manifest.message or manifest.status])[-1]


def _error_words(run: Run) -> str:
    error = _error(run)
    if any(error == f"KeyError: '{name}'" for name in TORCHRUN_VARIABLES):
        return f"{error}; the script expects a launcher such as torchrun"
    return error


def _stop_words(run: Run) -> str:
    """'crashed after 3 of 10 steps', 'made no step'."""
    manifest = run.manifest
    if manifest.status == Status.NO_STEPS.value:
        return "made no step"
    return f"{manifest.status} after {manifest.steps_completed} of {manifest.steps_requested} steps"


def _steps_made(run: Run) -> str:
    manifest = run.manifest
    if manifest.status in _RAN_THROUGH:
        return f"all {manifest.steps_completed}"
    return f"{manifest.steps_completed} of {manifest.steps_requested} (it ended by itself)"


def _shared_ending(run: Run) -> str:
    """The note and verdict words for two sides that ended alike after the same steps."""
    manifest = run.manifest
    done, asked = manifest.steps_completed, manifest.steps_requested
    if manifest.status == Status.SHORT.value:
        return f"both scripts ended by themselves after {done} of {asked} steps; judged on those {done}"
    return (f"both scripts stopped ({manifest.status}) after {done} of {asked} steps with the same error, "
            f"{_error(run)}; judged on those {done}")


def _environment_finding(ref: Run, actual: Run, first: dict[str, Any] | None) -> list[Finding]:
    found = environment.differences(ref.manifest, actual.manifest)
    if not found:
        return []
    explains = environment.explaining(found, first)
    message = f"environments differ in {len(found)} setting(s): " + "; ".join(d.text for d in found[:6]) + (
        f"; and {len(found) - 6} more (summary.json)" if len(found) > 6 else "")
    return [Finding(FindingCode.ENVIRONMENT_DIFFERS, message, {
        "explains": "; ".join(d.text for d in explains), "op": (first or {}).get("op"),
        "step": (first or {}).get("step")})]


def _overflow_findings(overflow: dict[str, Any]) -> list[Finding]:
    findings = []
    for side in ("ref", "actual"):
        first = overflow[f"{side}_first"]
        if first and overflow["one_sided"]:
            findings.append(Finding(FindingCode.OVERFLOW, (
                f"{side} only: first inf/nan from {first['op']} ({first['module'] or 'top level'}, {first['phase']}, "
                f"step {first['step']}, {first['dtype']}: {first['nan_count']} nan, {first['inf_count']} inf)"),
                {"side": side, **first}))
    for skip in overflow["one_sided_skips"]:
        findings.append(Finding(FindingCode.OVERFLOW, (
            f"{skip['side']} only: gradients overflowed at step {skip['step']} under the same loss scale "
            f"{skip['scale']:g} (the other side's did not), so that side's update was skipped"),
            {**skip, "op": "the backward pass", "dtype": "float16"}))
    for side in ("ref", "actual"):
        trace = overflow[f"{side}_scale"]
        if trace["collapsed"] or trace["frequent"]:
            findings.append(Finding(FindingCode.SCALE_COLLAPSE, (
                f"{side} loss scale fell {trace['drops']} times after calibration, to {trace['scales'][-1]:g}"
                + (" (collapsed: it reached 1)" if trace["collapsed"] else "")), {"side": side, **trace}))
        if trace["stuck"]:
            findings.append(Finding(FindingCode.SCALE_STUCK, (
                f"{side} loss scale never grows ({trace['scales'][0]:g}): a static scale, or no growth over more steps "
                "without overflow than its growth interval"), {"side": side, **trace}))
    return findings


def _grads_reset_findings(ref: Run, actual: Run) -> list[Finding]:
    """A side whose backward() finds the previous step's gradients still there accumulates across steps."""
    common = set(ref.losses["step"]) & set(actual.losses["step"])
    carried = [set(run.manifest.grads_carried_steps) & common for run in (ref, actual)]
    findings = []
    for side, mine, theirs in (("ref", carried[0], carried[1]), ("actual", carried[1], carried[0])):
        only_here = sorted(mine - theirs)
        if only_here:
            findings.append(Finding(FindingCode.GRADS_NOT_RESET, (
                f"the {side} side does not reset gradients between steps: from step {only_here[0]}, its backward() "
                "adds to the previous step's gradients (optimizer.zero_grad() missing or misplaced)"),
                {"side": side, "step": only_here[0], "steps": only_here}))
    return findings


def _op_findings(first: dict[str, Any] | None, ref: Run, actual: Run, hparams: pd.DataFrame,
                 inputs_differ: bool) -> list[Finding]:
    if first is None:
        return []
    follows = ", ".join(_hparams_behind(first, hparams))
    same_script = bool(ref.manifest.script_sha256) and ref.manifest.script_sha256 == actual.manifest.script_sha256
    same_device = ref.manifest.device == actual.manifest.device
    # Same script and device but other hyperparameters (its arguments) is not a repeat of one run.
    code = FindingCode.NONDETERMINISM if same_script and same_device and not follows else FindingCode.OP_DIVERGES
    by_hand = _updates_by_hand(first, ref, actual)
    message = (f"first divergent operator: {_op_label(first)}, stats error {first['stats_error']:.3g} > "
               f"{first['tolerance']:.3g}; {first['inputs_evidence']}"
               + (f"; it follows from the {follows} difference" if follows else "")
               + ("; it is the script's own parameter update (no optimizer): its learning rate or rule differs"
                  if by_hand else ""))
    findings = [Finding(code, message, {**first, "follows_hparams": follows, "update_by_hand": by_hand})]
    if first["step"] == 0 and (first["first_of_step"] or _before_first_forward(first, ref.ops)) and not inputs_differ:
        findings.append(Finding(FindingCode.DATA_ORDER, (
            f"{_op_label(first)} runs before the first forward of step 0 and already differs: the batch or the "
            "initial weights differ"), first))
    return findings


def _updates_by_hand(op: dict[str, Any], ref: Run, actual: Run) -> bool:
    """An in-place op at the top level after the step's backward, in runs without an optimizer: the script updates
    its parameters itself (`p.data.add_(p.grad, alpha=-lr)`), so a learning rate there is no recorded hyperparameter
    and the update is where a different one shows first."""
    if op["phase"] != "other" or not op["op"].endswith("_") or not (ref.hparams.empty and actual.hparams.empty):
        return False
    backward = ref.ops.loc[(ref.ops["step"] == op["step"]) & (ref.ops["phase"] == "backward"), "seq"]
    return bool(len(backward)) and op["seq"] > backward.min()


def _input_findings(table: pd.DataFrame) -> list[Finding]:
    """The batch the outermost module received at step 0 differs: the sides read different data, which explains
    every difference after it, so it is named before any operator."""
    inputs = table.loc[(table["ref_op"] == INPUT_OP) & (table["step"] == 0) & (table["passed"] == False)]  # noqa: E712
    if inputs.empty:
        return []
    row = inputs.iloc[0]
    return [Finding(FindingCode.DATA_ORDER, (
        f"the sides read different data: the {row['io']} input of {row['module']}'s first forward differs at step 0 "
        f"({row['ref_dtype']} {row['ref_shape']}: mean {row['ref_mean']:.6g} vs {row['actual_mean']:.6g}, min "
        f"{row['ref_min']:.6g} vs {row['actual_min']:.6g}, max {row['ref_max']:.6g} vs {row['actual_max']:.6g})"),
        {"step": 0, "module": str(row["module"]), "io": str(row["io"]), "source": "inputs"})]


def _changed_op_findings(table: pd.DataFrame) -> list[Finding]:
    """The first forward record paired with another computation (gelu where the original calls relu): a changed
    layer or function, which every numeric difference after it may follow from. Forward only: a backward is derived
    from its forward, and devices decompose backward ops differently (a GPU's native_dropout_backward is a plain mul
    where the mask was made apart)."""
    paired = table.loc[table["status"].isin(MATCHED) & (table["phase"] == "forward")
                       & ~table["ref_op"].isin(list(CARRIER_OPS))
                       & (table["ref_op"].astype(str) != table["actual_op"].astype(str)), ["ref_op", "actual_op"]]
    pairs = paired.astype(str).drop_duplicates()
    changed = pairs.loc[[not same_computation(op, other) for op, other in zip(pairs["ref_op"], pairs["actual_op"])]]
    rows = paired.astype(str).merge(changed, on=["ref_op", "actual_op"]).set_axis(
        paired.index[paired.astype(str).apply(tuple, axis=1).isin(set(changed.apply(tuple, axis=1)))])
    if rows.empty:
        return []
    row = table.loc[rows.index[0]]
    detail = {"op": str(row["ref_op"]), "actual_op": str(row["actual_op"]), "module": str(row["module"]),
              "phase": str(row["phase"]), "step": int(row["step"]), "seq": int(row["ref_seq"])}
    where = f"{detail['module']} " if detail["module"] else ""
    return [Finding(FindingCode.OP_CHANGED, (
        f"the port computes {detail['actual_op']} where the original computes {detail['op']} ({where}"
        f"{detail['phase']}, step {detail['step']}): a changed operator"), detail)]


def _hparams_behind(op: dict[str, Any], hparams: pd.DataFrame) -> list[str]:
    """The differing hyperparameters that already changed this op's values. A step's hyperparameters are recorded
    just before its optimizer step, so one that differs from step s changes the update of step s and, through the
    weights, every op of later steps; the forward and backward of step s ran before it and owe it nothing."""
    steps = hparams["step"]
    behind = (steps < op["step"]) | ((steps == op["step"]) & (op["phase"] == "optimizer"))
    return list(dict.fromkeys(hparams.loc[behind, "name"].astype(str)))


def _before_first_forward(op: dict[str, Any], ops: pd.DataFrame) -> bool:
    """A top-level op of step 0 that runs before any module's forward: data loading, preprocessing, weight init.
    Model construction usually comes first, so the batch is rarely the first recorded op itself."""
    forward = ops.loc[(ops["step"] == 0) & (ops["phase"] == "forward"), "seq"]
    return op["phase"] == "other" and (forward.empty or op["seq"] < forward.min())


def _loss_finding(loss: LossComparison) -> list[Finding]:
    if loss.first_step_past_tolerance is None:
        return []
    row = loss.frame.loc[~loss.frame["passed"]].iloc[0]
    return [Finding(FindingCode.LOSS_DIVERGES, (
        f"loss differs by {row['rel_diff']:.2%} at step {int(row['step'])} ({row['ref_loss']:.6g} vs "
        f"{row['actual_loss']:.6g}; tolerance {loss.rtol:.2%}); max {loss.max_rel_diff:.2%} over "
        f"{loss.steps_compared} steps"), {"step": int(row["step"]), "rel_diff": float(row["rel_diff"])})]


def _grad_finding(grads: pd.DataFrame, rtol: float) -> list[Finding]:
    failing = grads.loc[~grads["passed"]]
    if failing.empty:
        return []
    row = failing.iloc[0]
    return [Finding(FindingCode.GRAD_DIVERGES, (
        f"gradient norm of {row['param']} differs by {row['rel_diff']:.2%} at step {int(row['step'])} "
        f"({row['ref_norm']:.6g} vs {row['actual_norm']:.6g}; tolerance {rtol:.2%}); "
        f"{len(failing)} of {len(grads)} parameter-steps past tolerance"), {"param": row["param"]})]


def _output_finding(outputs: pd.DataFrame) -> list[Finding]:
    failing = outputs.loc[~outputs["passed"].astype(bool)]
    if failing.empty:
        return []
    row = failing.iloc[0]
    return [Finding(FindingCode.OUTPUT_DIVERGES, (
        f"inference output {row['output']} differs at step {int(row['step'])}: cosine {row['cosine']:.6f}, "
        f"max abs {row['max_abs_error']:.3g}, top-1 agreement {row['top1_agreement']:.2%}"), {})]


def _match_finding(table: pd.DataFrame) -> list[Finding]:
    # Only steps both runs recorded: the steps after one side stopped early (a crash, a NaN) pair nothing by nature.
    common = set(table.loc[table["ref_op"].notna(), "step"]) & set(table.loc[table["actual_op"].notna(), "step"])
    table = table.loc[table["step"].isin(common)]
    if table.empty:
        return []
    share = float(table["status"].isin(MATCHED).mean())
    if share >= LOW_MATCH_SHARE:
        return []
    return [Finding(FindingCode.LOW_MATCH, (
        f"only {share:.0%} of operator records could be paired: the runs may come from different scripts or "
        "models"), {"share": share})]


def _cause_rank(finding: Finding, first: dict[str, Any] | None) -> float:
    """Causes before symptoms: FAILING's order, except that an overflow after the first divergent operator on the
    timeline of the run (a later step, or later in the same step) follows from that divergence and ranks after it."""
    rank = FAILING.index(finding.code)
    if finding.code is FindingCode.OVERFLOW and _happens_after(finding.detail, first):
        return FAILING.index(FindingCode.OP_DIVERGES) + 0.5
    return rank


def _happens_after(detail: dict[str, Any], first: dict[str, Any] | None) -> bool:
    """Whether what `detail` names comes after the op `first` in execution order: its step, then its seq; a finding
    without a seq (a skipped update) happens at the end of its step, after every op of it."""
    step = detail.get("step")
    if first is None or step is None or step != first["step"]:
        return first is not None and step is not None and step > first["step"]
    seq = detail.get("seq")
    return seq is None or seq > first["seq"]


def _verdict(findings: list[Finding], loss: LossComparison, table: pd.DataFrame, policy: PrecisionPolicy,
             first: dict[str, Any] | None, ops_not_compared: str, shared_ending: str) -> Verdict:
    failing = sorted((f for f in findings if f.code in FAILING), key=lambda f: _cause_rank(f, first))
    if failing:
        return Verdict(False, f"FAIL: {failing[0].message}")
    if loss.steps_compared == 0 and table.empty:
        return Verdict(False, "FAIL: nothing to compare (no common loss steps and no operator records)")
    loss_text = (f"loss within {loss.rtol:.2%} at all {loss.steps_compared} steps (max {loss.max_rel_diff:.3%})"
                 if loss.steps_compared else "no loss recorded")
    ops_text = (f"operators not compared: {ops_not_compared}" if ops_not_compared else
                f"{int(table['status'].isin(MATCHED).sum())} op records matched, all within tolerance")
    ending = f"; {shared_ending.split(';')[0]}" if shared_ending else ""
    return Verdict(True, f"PASS: {loss_text}; {ops_text} ({policy.description.split(':')[0]}){ending}")


def _random_notes(ref: Run, actual: Run) -> list[str]:
    """Whether both sides drew their dropout masks from the keyed stream, and the random draws left to each device's
    own generator (on two real devices those differ, whatever the port does)."""
    aligned = [run.manifest.align_random for run in (ref, actual)]
    notes = ["dropout masks drawn from one keyed stream on both sides (verify/random_streams.py)" if all(aligned)
             else "dropout masks from each device's own generator" + ("" if not any(aligned) else " on one side")]
    unaligned = sorted({*ref.manifest.random_not_aligned, *actual.manifest.random_not_aligned})
    for run in (ref, actual):  # inside modules: at the top level, draws are mostly data and weights made on the CPU
        ops = run.ops
        drawn = ops.loc[ops["op"].isin(list(RANDOM_OPS)) & (ops["module"] != ""), ["op", "module"]].drop_duplicates()
        unaligned += [f"{op} in {module}" for op, module in drawn.itertuples(index=False)
                      if f"{op} in {module}" not in unaligned]
    if unaligned:
        notes.append(f"random draws left to each device's own generator ({len(unaligned)}): "
                     + ", ".join(unaligned[:8]) + (", ..." if len(unaligned) > 8 else "")
                     + "; on two different devices their values differ")
    return notes


def _step_notes(ref: Run, actual: Run) -> list[str]:
    notes = []
    ref_steps, actual_steps = set(ref.losses["step"].tolist()), set(actual.losses["step"].tolist())
    if ref_steps != actual_steps and ref_steps and actual_steps:
        notes.append(f"step counts differ: ref {len(ref_steps)}, actual {len(actual_steps)}; compared the "
                     f"{len(ref_steps & actual_steps)} common steps")
    if ref.manifest.seed != actual.manifest.seed:
        notes.append(f"seeds differ: ref {ref.manifest.seed}, actual {actual.manifest.seed}")
    return notes


def unscaled_backward(run: Run) -> pd.DataFrame:
    """The run's op records with the statistics of backward ops divided by the loss scale of their step: under a
    GradScaler every gradient flowing back is multiplied by the scale, so an fp32 reference and its scaled AMP port
    (or two sides under different scales) are compared on the gradients themselves."""
    scales = pd.to_numeric(run.losses.groupby("step")["loss_scale"].first(), errors="coerce").dropna()
    ops = run.ops
    if scales.empty or ops.empty:
        return ops
    factor = ops["step"].map(scales).where(ops["phase"] == "backward").fillna(1.0).to_numpy("float64")
    if (factor == 1.0).all():
        return ops
    ops = ops.copy()
    for column in metrics.STAT_NAMES:
        ops[column] = ops[column].to_numpy("float64") / factor
    return ops


def _ops_not_compared(ref: Run, actual: Run) -> str:
    """Why the operators cannot be compared ("" when both sides recorded some): a side without records is named, so
    that the other side's records are not counted as unmatched."""
    missing = {side: _why_no_ops(run) for side, run in (("ref", ref), ("actual", actual)) if run.ops.empty}
    if len(missing) == 2:
        reasons = set(missing.values())
        return (f"neither side recorded any: both {reasons.pop()}" if len(reasons) == 1
                else f"neither side recorded any: ref {missing['ref']}, actual {missing['actual']}")
    return "".join(f"the {side} side recorded none: it {why}" for side, why in missing.items())


def _why_no_ops(run: Run) -> str:
    if run.manifest.dump_mode == DumpMode.OFF.value:
        return "ran with --dump off"
    if run.manifest.steps_completed == 0:
        return "stopped before its first step"
    return "has no operator table"


def _evidence(loss: LossComparison, hparams_compared: bool, grads: pd.DataFrame, outputs: pd.DataFrame) -> str:
    """What a comparison without operators was judged on: 'losses, hyperparameters and gradients'."""
    kinds = [kind for kind, present in (("losses", loss.steps_compared > 0), ("hyperparameters", hparams_compared),
                                        ("gradients", len(grads) > 0), ("outputs", len(outputs) > 0)) if present]
    return " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds) or "nothing"


def compare_runs(ref: Run, actual: Run, options: CompareOptions = CompareOptions()) -> ComparisonResult:
    """The comparison of two runs; CompareError where they prove nothing (see _how_runs_ended)."""
    ended, shared_ending = _how_runs_ended(ref, actual)
    notes = [*(f"ref: {n}" for n in ref.notes), *(f"actual: {n}" for n in actual.notes), *_step_notes(ref, actual),
             *_random_notes(ref, actual)]
    if shared_ending:
        notes.append(shared_ending)
    policy = precision_policy(ref, actual, options)
    ops_not_compared = _ops_not_compared(ref, actual)
    sides = (ref.ops.iloc[:0], actual.ops.iloc[:0]) if ops_not_compared else (
        unscaled_backward(ref), unscaled_backward(actual))
    table = op_metrics(align_ops(*sides), ref, actual, policy, notes)
    first = first_divergent_op(table)
    loss = compare_losses(ref, actual, policy.loss_rtol)
    hparams = compare_hparams(ref, actual)
    grads = compare_grads(ref, actual, policy.loss_rtol)
    outputs = compare_outputs(ref, actual, policy, notes)
    overflow = compare_overflow(ref, actual)
    inputs = _input_findings(table)
    if ops_not_compared:
        evidence = _evidence(loss, not (ref.hparams.empty or actual.hparams.empty), grads, outputs)
        notes.append(f"operators not compared: {ops_not_compared}; judged on the {evidence}")
    findings = [
        *ended,
        *(Finding(FindingCode.HPARAM_MISMATCH, f"hyperparameter differs: {message}", {"name": name})
          for message, name in zip(hparams["message"], hparams["name"])),
        *_grads_reset_findings(ref, actual),
        *_environment_finding(ref, actual, first),
        *_overflow_findings(overflow),
        *_loss_finding(loss),
        *_output_finding(outputs),
        *inputs,
        *_changed_op_findings(table),
        *_op_findings(first, ref, actual, hparams, bool(inputs)),
        *_grad_finding(grads, policy.loss_rtol),
        *_match_finding(table),
    ]
    if policy.mixed:
        findings.append(Finding(FindingCode.AMP_ONE_SIDE, policy.description,
                                {"ref_amp": policy.ref_amp, "actual_amp": policy.actual_amp}))
    return ComparisonResult(
        verdict=_verdict(findings, loss, table, policy, first, ops_not_compared, shared_ending), policy=policy,
        ref=ref, actual=actual, loss=loss, ops=table, first_divergent=first, hparams=hparams, grads=grads,
        outputs=outputs, overflow=overflow, findings=findings, notes=notes, ops_not_compared=ops_not_compared)
