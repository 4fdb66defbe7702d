"""The operators' verdicts: each aligned pair of op records judged by its statistics (or md5 fingerprints, or full
tensors in tensor mode) against the tolerance of its dtypes, and the first divergent operator.

The first divergent operator is the earliest op, in reference execution order, whose outputs break their tolerance
beyond the noise they inherit while its inputs agree. Its inputs are the recorded calls that produced them (ops.inputs,
the data flow; tensor mode also records the inputs themselves). Runs recorded without a data flow (schema version 1,
msprobe dumps) take "the previous matched op of the same step agrees" as the evidence: in a sequential model that op
produced the input. The first recorded op of a step has only the batch and the weights as inputs, which are not
recorded; it counts as having agreeing inputs. No torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from verify.compare import envelope, metrics
from verify.compare.envelope import Envelope
from verify.compare import tolerances
from verify.compare.align import MATCHED_STATUSES, AlignStatus
from verify.compare.op_catalogue import CARRIERS
from verify.compare.curves import overflow_timing_is_noise, skipped_steps
from verify.compare.precision_policy import PrecisionPolicy
from verify.record.store import Run
from verify.errors import RunDirError
from verify.record.schema import INPUT_OP, STAT_COLUMNS, UPDATE_OP, Phase
from verify.record.statistics import STATISTICS, Comparison


# Which evidence decided a matched row's `passed`: its statistics against the reference's (and its envelope), md5
# fingerprints, full tensors, or its statistics against the calibration run that computes as the port does.
JUDGED_BY = ["stats", "md5", "tensor", "calibration"]
# The NaN and inf counts (verify/record/statistics.py): compared as present or absent on both sides.
_NONFINITE_COUNTS = tuple(statistic.column for statistic in STATISTICS if statistic.comparison is Comparison.PRESENCE)


def op_metrics(aligned: pd.DataFrame, ref: Run, actual: Run, policy: PrecisionPolicy,
               notes: list[str], measured: Envelope | None = None) -> pd.DataFrame:
    """Adds statistic differences, the judged error, tolerances, tensor/md5 metrics and `passed` to aligned rows.
    With the reference's measured envelope, each row's tolerance is ENVELOPE_FACTOR times its envelope where that is
    larger than its dtype's fixed tolerance (`envelope` column)."""
    table = aligned
    for stat in metrics.STAT_NAMES:
        ref_values = table[f"ref_{stat}"].to_numpy("float64")
        actual_values = table[f"actual_{stat}"].to_numpy("float64")
        table[f"{stat}_diff"] = metrics.difference(ref_values, actual_values)
        table[f"{stat}_rel_diff"] = metrics.relative_difference(ref_values, actual_values)
    table["stats_error"] = metrics.stats_error(
        {s: table[f"ref_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES},
        {s: table[f"actual_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES})
    limits = tolerances.pair_tolerances(table["ref_dtype"], table["actual_dtype"], policy.op_widen,
                                        policy.ref_amp if policy.ref_amp == policy.actual_amp else "")
    batch = _read_batches(table)
    limits.loc[batch, "stats_rtol"] = np.minimum(limits.loc[batch, "stats_rtol"],
                                                 tolerances.batch_rtol(_elements(table["ref_shape"][batch])))
    table["tolerance"] = limits["stats_rtol"].to_numpy()
    matched = table["status"].isin(MATCHED_STATUSES).to_numpy()
    calibrated = np.zeros(len(table), dtype=bool)
    if measured is not None:
        producers = _producer_pairs(table, np.flatnonzero(matched))[0]
        table["envelope"] = envelope.of_ops(measured, table, producers)
        _add_calibrated_error(table, envelope.computes_as_the_port(measured, actual))
        if "calibrated_error" in table and policy.op_widen == 1.0:
            table["calibrated_tolerance"] = _calibrated_tolerance(table, producers)
            # Integers are exact, and where one differs between two runs of the reference (what Lightning's ranks
            # tell each other of themselves) it differs from run to run: the envelope judges those.
            floating = ~table["actual_dtype"].isin(tolerances.EXACT_DTYPES).to_numpy(dtype=bool, na_value=False)
            calibrated = matched & floating & table["calibrated_error"].notna().to_numpy()
        # A batch read is data, never widened by the reference's noise: a calibration that rounds every floating
        # result rounds the data pipeline's Normalize too (0.00013 on mnist), whose 10 times let another shuffle pass.
        noise = np.where(batch, 0.0, table["envelope"].fillna(0.0).to_numpy())
        table["tolerance"] = np.fmax(table["tolerance"].to_numpy(), tolerances.ENVELOPE_FACTOR * noise)
    flips = _flipped_update_elements(table)
    flips = np.fmax(flips, _carried_flips(table, flips))
    table["tolerance"] = np.fmax(table["tolerance"].to_numpy(), flips)
    if "calibrated_tolerance" in table:
        table["calibrated_tolerance"] = np.fmax(table["calibrated_tolerance"].to_numpy("float64"), flips)
    nonfinite_agree = np.logical_and.reduce(
        [_has(table, f"ref_{count}") == _has(table, f"actual_{count}") for count in _NONFINITE_COUNTS])
    stats_ok = ~(table["stats_error"].to_numpy() > table["tolerance"].to_numpy())  # NaN (no stats) is not a failure
    if calibrated.any():  # within the reference's own noise, and computing what the run that computes as it does
        stats_ok &= ~(calibrated & (table["calibrated_error"].to_numpy("float64")
                                    > table["calibrated_tolerance"].to_numpy("float64")))
    judged_by = np.where(matched, np.where(calibrated, JUDGED_BY.index("calibration"), JUDGED_BY.index("stats")), -1)
    passed = stats_ok & nonfinite_agree
    passed = _judge_md5(table, matched, passed, nonfinite_agree, judged_by)
    passed = _judge_tensors(table, matched, passed, nonfinite_agree, judged_by, limits, ref, actual, notes)
    table["judged_by"] = pd.Categorical.from_codes(judged_by, categories=JUDGED_BY)
    passed = passed | _indices_of_agreeing_values(table, matched, passed)
    # Casts and copies carry values, they compute none: what they carry is judged at the ops that use it (their n-th
    # call on one side need not be the n-th on the other), so they are neither passed nor failed themselves.
    carried = table["ref_op"].isin(list(CARRIERS)).to_numpy(dtype=bool, na_value=False)
    judged = matched & ~_scaler_overflow(table, ref, actual, measured) & ~carried & ~_process_bookkeeping(table)
    table["passed"] = pd.arrays.BooleanArray(passed & judged, ~judged)  # unmatched rows: NA, neither pass nor fail
    return table


def _flipped_update_elements(table: pd.DataFrame) -> np.ndarray:
    """Per row: the error of an optimizer update whose few near-zero-gradient elements flipped their whole step
    (tolerances.UPDATE_FLIPPED_ELEMENTS), 0 for other rows."""
    update = (table["ref_op"] == UPDATE_OP).to_numpy(dtype=bool, na_value=False)
    flips = np.zeros(len(table))
    elements = _elements(table["ref_shape"][update])  # the updates' shapes alone: parsing every record's costs 0.25 s
    flips[update] = np.where(elements >= tolerances.UPDATE_FLIP_MIN_ELEMENTS,
                             tolerances.UPDATE_FLIPPED_ELEMENTS * 2.0 / np.maximum(elements, 1.0), 0.0)
    return flips


def _carried_flips(table: pd.DataFrame, flips: np.ndarray) -> np.ndarray:
    """Per row: the flipped update elements allowed at the updates of its module's parameters (what their update
    records differ by, up to their flip allowance, summed over the steps before), for a forward record computed from
    the weights alone (no recorded input: InstanceNorm's `weight.repeat`), which carries those parameters' values;
    0 for other rows. `flips` is each update record's own allowance (_flipped_update_elements). Anything past the
    carried amount still fails (issue 56)."""
    carried = np.zeros(len(table))
    update = (table["ref_op"] == UPDATE_OP).to_numpy(dtype=bool, na_value=False)
    # a recorded data flow that names no input (NA: a run recorded without one, which says nothing)
    inputs = table["ref_inputs"]
    weights_only = ((table["phase"] == "forward") & inputs.notna() & inputs.astype(str).eq("")).to_numpy(dtype=bool)
    rows = np.flatnonzero(weights_only & ~update)
    if not (update.any() and len(rows)):
        return carried
    allowed = np.fmin(table["stats_error"].to_numpy("float64")[update], flips[update])
    parameter = table["module"].astype(str).loc[update].reset_index(drop=True)  # the update records alone
    updates = pd.DataFrame({"step": table["step"].to_numpy("int64")[update], "owner": parameter.str.rpartition(".")[0],
                            "parameter": parameter, "allowed": np.nan_to_num(allowed)})
    # a parameter's allowance so far, after each step; a module's, the largest of its parameters'
    updates["so_far"] = updates.sort_values("step").groupby("parameter")["allowed"].cumsum()
    by_owner = updates.groupby(["owner", "step"], as_index=False)["so_far"].max().sort_values("step")
    if not (by_owner["so_far"] > 0).any():
        return carried
    # the module's path below its root (TransformerNet.res2.in1 -> res2.in1), as its parameters are named
    wanted = pd.DataFrame({"row": rows, "step": table["step"].to_numpy("int64")[rows],
                           "owner": table["module"].astype(str).iloc[rows].str.partition(".")[2].to_numpy()})
    found = pd.merge_asof(wanted.sort_values("step"), by_owner, on="step", by="owner", allow_exact_matches=False)
    carried[found["row"].to_numpy()] = tolerances.CARRIED_FLIPS_SLACK * found["so_far"].fillna(0.0).to_numpy()
    return carried


def _add_calibrated_error(table: pd.DataFrame, in_port_order: pd.DataFrame | None) -> None:
    """`calibrated_error`: each record's statistics error against the calibration run that computes as the port does
    (envelope.computes_as_the_port), where there is one; NaN elsewhere, and on records that run did not make."""
    if in_port_order is None:
        return
    keys = pd.MultiIndex.from_arrays([table["step"].to_numpy("int64"),
                                      table["ref_seq"].to_numpy(dtype="int64", na_value=-1), table["io"].astype(str)])
    calibration = in_port_order.reindex(keys)
    table["calibrated_error"] = metrics.stats_error(
        {s: calibration[s].to_numpy("float64") for s in metrics.STAT_NAMES},
        {s: table[f"actual_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES})


def _calibrated_tolerance(table: pd.DataFrame, producers: pd.DataFrame) -> np.ndarray:
    """Per row: what its calibrated_error may reach (issue 45). On the emulators a faithful port computes the bits of
    the calibration run that computes as it does, wherever their faces agree: of pytorch/examples' mnist, dcgan, vae,
    imagenet's resnet18, word_language_model and nanoGPT (fp32 and fp16 ports, 10 steps), the largest difference was
    0.19 of its dtype's floor (an fp16 bias gradient's sum the two faces' autocasts cast otherwise), while the
    reference differed from itself by up to 100%: the chaotic noise of the reference is not the port's. A difference
    that entered earlier travels on, and training amplifies it (an exact override of nanoGPT's gelu, computing the
    same function through other kernels, moves its records by 1e-9 at step 0 and by 1.05 times the fp32 floor at step
    8): a record may carry tolerances.ENVELOPE_FACTOR times the largest calibrated error of the calls that produced its
    inputs, of its own inputs' records and of any record of an earlier step (the state those steps left). Never below
    its dtype's floor (`tolerance` before the envelope widens it)."""
    error = table["calibrated_error"].fillna(0.0).to_numpy("float64")
    step = table["step"].to_numpy("int64")
    keys = pd.MultiIndex.from_arrays([step, table["ref_seq"].to_numpy(dtype="int64", na_value=-1)])
    per_call = pd.Series(error, index=keys).groupby(level=[0, 1]).max()
    carried = np.zeros(len(table))
    if len(producers):
        read = per_call.reindex(pd.MultiIndex.from_arrays([producers["step"], producers["seq"]])).fillna(0.0)
        flow = pd.Series(read.to_numpy(), index=producers["row"].to_numpy()).groupby(level=0).max()
        carried[flow.index.to_numpy()] = flow.to_numpy()
    is_input = table["io"].astype(str).str.startswith("in").to_numpy()
    own_inputs = pd.Series(np.where(is_input, error, 0.0), index=keys).groupby(level=[0, 1]).transform("max")
    by_step = pd.Series(error).groupby(step).max()
    earlier = by_step.cummax().shift(1, fill_value=0.0).reindex(step).to_numpy()
    carried = np.fmax.reduce([carried, own_inputs.to_numpy(), earlier])
    return np.fmax(table["tolerance"].to_numpy("float64"), tolerances.ENVELOPE_FACTOR * carried)


def _process_bookkeeping(table: pd.DataFrame) -> np.ndarray:
    """Integer collectives outside every module: what processes tell each other of themselves, not training values
    (DDP gathers each rank's buffer addresses as it is built), so they differ from run to run and are not judged."""
    collective = table["ref_op"].astype("string").str.startswith("c10d.").to_numpy(dtype=bool, na_value=False)
    integer = table["ref_dtype"].astype("string").str.startswith(("int", "uint")).to_numpy(dtype=bool, na_value=False)
    return collective & integer & (table["phase"] == "other").to_numpy(dtype=bool, na_value=False)


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


def _scaler_overflow(table: pd.DataFrame, ref: Run, actual: Run, measured: Envelope | None) -> np.ndarray:
    """Backward rows of a skipped step holding inf/nan on either side: dynamic loss scaling at work (compared by
    compare_overflow, skip for skip), not values to judge. An fp32 reference never overflows where its AMP port does.
    Where the reference's calibration overflowed at other steps than the reference, rounding decides where gradients
    overflow at these scales, and a backward row's inf/nan at any step is that too (a GAN's generator backward
    overflows in the discriminator's gradients, which no optimizer of that step applies and no scaler skips)."""
    nonfinite = np.logical_or.reduce(
        [_has(table, f"{side}_{count}") for side in ("ref", "actual") for count in _NONFINITE_COUNTS])
    backward = (table["phase"] == "backward").to_numpy()
    if overflow_timing_is_noise(measured):
        return nonfinite & backward
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
    values = {metric.name: np.full(len(table), np.nan) for metric in metrics.TENSOR_METRICS}
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
        for metric in metrics.TENSOR_METRICS:
            values[metric.name][row] = metric.function(ref_tensor, actual_tensor)
    for name, column in values.items():
        table[name] = column
    if unreadable:
        notes.append(f"{len(unreadable)} tensor pair(s) judged by statistics only (unreadable or different "
                     f"shapes), first: {unreadable[0]}")
    judged = np.zeros(len(table), bool)
    judged[rows] = True
    judged &= ~np.isnan(values[metrics.COSINE.name])
    tensor_ok = metrics.within_limits(metrics.TENSOR_METRICS, values, limits)  # msprobe's rule, our dtype limits
    judged_by[judged] = JUDGED_BY.index("tensor")
    return np.where(judged, tensor_ok & nonfinite_agree, passed)


def first_divergent_op(table: pd.DataFrame) -> dict[str, Any] | None:
    """The earliest op (ref step, seq) whose outputs break tolerance while its inputs agree (see module doc)."""
    computing = ~table["ref_op"].isin(list(CARRIERS)).to_numpy()  # casts and copies carry, they do not compute
    matched = np.flatnonzero(table["status"].isin(MATCHED_STATUSES).to_numpy() & computing)
    if not len(matched):
        return None
    step = table["step"].to_numpy()[matched]
    seq = table["ref_seq"].to_numpy(dtype="int64", na_value=0)[matched]
    # The batch records (INPUT_OP) are no op's inputs: they stand first in the chain, so that an op after a batch that
    # differs is not taken for the cause (findings._input_findings names the batch).
    batch = (table["ref_op"].iloc[matched] == INPUT_OP).to_numpy(dtype=bool, na_value=False)
    is_input = table["io"].iloc[matched].str.startswith("in").to_numpy(dtype=bool, na_value=False) & ~batch
    failed = (table["passed"].iloc[matched] == False).to_numpy(dtype=bool, na_value=False)  # noqa: E712
    # One id per op call, increasing in execution order (the table is sorted by step, then ref seq).
    op_id = pd.factorize(step * (int(seq.max()) + 1) + seq, sort=True)[0]
    n_ops = int(op_id.max()) + 1
    if "envelope" not in table:  # without a measured envelope, fixed rules stand in for the noise an op carries
        failed &= ~_explained_by_inherited_noise(table, matched)
        failed &= ~_state_after_the_first_step(table, matched, step)
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
    past = candidates[0]
    chosen = _where_it_enters(table, matched[~is_input], op_id[~is_input], past) if "envelope" in table else past
    own = failed if chosen == past else np.ones(len(matched), dtype=bool)
    rows = table.iloc[matched[(op_id == chosen) & own & ~is_input]]
    worst = rows.sort_values("stats_error", ascending=False, na_position="last").iloc[0]
    stats = STAT_COLUMNS
    record = {
        "step": int(worst["step"]), "seq": int(worst["ref_seq"]), "phase": str(worst["phase"]),
        "module": str(worst["module"]), "op": str(worst["ref_op"]), "actual_op": str(worst["actual_op"]),
        "io": str(worst["io"]), "status": str(worst["status"]), "judged_by": str(worst["judged_by"]),
        "ref_source": source_text(worst.get("ref_source")), "actual_source": source_text(worst.get("actual_source")),
        "dtype": str(worst["ref_dtype"]), "actual_dtype": str(worst["actual_dtype"]),
        "stats_error": float(worst["stats_error"]), "tolerance": float(worst["tolerance"]),
        "ref": {stat: float(worst[f"ref_{stat}"]) for stat in stats},
        "actual": {stat: float(worst[f"actual_{stat}"]) for stat in stats},
        "cosine": float(worst.get("cosine", np.nan)),
        "envelope": float(worst.get("envelope", np.nan)),
        "calibrated_error": float(worst.get("calibrated_error", np.nan)),
        "calibrated_tolerance": float(worst.get("calibrated_tolerance", np.nan)),
        "inputs_evidence": ("its recorded inputs agree" if inputs_recorded[chosen]
                            else "the ops that produced its inputs agree" if flow_known[chosen]
                            else "first recorded op of the step (inputs: batch and weights, not recorded)"
                            if first_of_step[chosen] else "the previous matched op of the step agrees"),
        "first_of_step": bool(first_of_step[chosen] and not inputs_recorded[chosen]),
        "ops_past_tolerance": int(failed.sum()),
    }
    if chosen != past:
        shown = table.iloc[matched[(op_id == past) & failed & ~is_input]].iloc[0]
        record["past_tolerance_at"] = op_label({"op": str(shown["ref_op"]), "module": str(shown["module"]),
                                                "phase": str(shown["phase"]), "step": int(shown["step"]),
                                                "io": str(shown["io"])})
        measure = ("past a share of it apart from the calibration run that computes as the port does"
                   if "calibrated_error" in table else
                   f"past {tolerances.ENVELOPE_FACTOR:g} times the reference's own noise")
        record["inputs_evidence"] = (
            f"below its dtype's floor, but {measure} while the ops that produced its inputs are not: the difference "
            f"enters the data flow here, and shows past tolerance downstream, first at {record['past_tolerance_at']}")
    return record


def _where_it_enters(table: pd.DataFrame, rows: np.ndarray, op_id: np.ndarray, past: int) -> int:
    """The op call (an op_id of `rows`, the matched output records) where the difference of the first op past its
    tolerance (`past`) enters the data flow: up the recorded producers (ops.inputs, through casts and copies), the
    earliest call whose output differs beyond the reference's own noise (`_beyond_noise`) while the calls that
    produced its inputs do not, even below its dtype's floor. A kernel 0.01% off in fp32 (its floor 2^-13 is 0.012%)
    shows past it only where a consumer amplifies it (a tanh's backward near saturation, a batch's sum of it); that
    consumer's inputs agree within the floor, and without the walk it was named. `past` itself where none differs.
    A difference also travels from step to step through the state the steps leave (weights, optimizer state), in no
    recorded data flow: an entry of an earlier step, ancestor or not, comes first (dcgan's fp16 port with its
    generator's ReLU 0.1% off, below fp16's floor: past tolerance first in the discriminator's backward at step 1,
    where a batch-norm backward reading the updated weights was named)."""
    step, seq = table["step"].to_numpy("int64"), table["ref_seq"].to_numpy(dtype="int64", na_value=-1)
    calls = {(step[row], seq[row]): call for row, call in zip(rows, op_id)}
    beyond = np.bincount(op_id, weights=_beyond_noise(table, rows), minlength=int(op_id.max()) + 1) > 0
    producers = _producers_through_carriers(table)
    by_call = {call: key for key, call in calls.items()}

    def differing(call: int) -> list[int]:
        return [up for up in (calls.get(key) for key in producers.get(by_call[call], ()))
                if up is not None and beyond[up]]

    pending, seen, entries = [past], {past}, []
    while pending:
        call = pending.pop()
        inputs_differ = differing(call)
        entries += [] if inputs_differ or call == past else [call]
        pending += [up for up in inputs_differ if up not in seen]
        seen.update(inputs_differ)
    earlier = [call for call in range(past) if beyond[call] and by_call[call][0] < by_call[past][0]
               and not differing(call)]
    return min(entries + earlier, default=past)


def _beyond_noise(table: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`: its difference passes tolerances.ENVELOPE_FACTOR times the reference's own (its envelope)
    and tolerances.ENTRY_SHARE_OF_FLOOR of its tolerance: the port computed it otherwise, where the floor alone
    would let it pass. A row without a measured envelope (an op the calibration did not make) is not judged so. On
    the emulators, where a calibration computes as the port does (its calibrated_error), that difference is the
    port's own and the sharper measure: past the share of its tolerance, with no noise of the reference's to allow."""
    error = table["stats_error"].to_numpy("float64")[rows]
    noise = table["envelope"].to_numpy("float64")[rows]
    least = tolerances.ENTRY_SHARE_OF_FLOOR * table["tolerance"].to_numpy("float64")[rows]
    with np.errstate(invalid="ignore"):
        beyond = (error > tolerances.ENVELOPE_FACTOR * noise) & (error > least)
        if "calibrated_error" not in table:
            return beyond
        calibrated = table["calibrated_error"].to_numpy("float64")[rows]
        return np.where(np.isnan(calibrated), beyond, calibrated > least)


def _producers_through_carriers(table: pd.DataFrame) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Per reference call (step, seq): the calls that produced its inputs, a cast or copy between replaced by what it
    carries (under autocast a matmul reads its input's cast), the batch records (INPUT_OP) left out: the data flow
    before them is judged by their own verdict."""
    known = table.loc[table["ref_seq"].notna()].drop_duplicates(["step", "ref_seq"])
    flow = {(int(step), int(seq)): (op, _seqs(inputs)) for step, seq, op, inputs in zip(
        known["step"], known["ref_seq"], known["ref_op"], known["ref_inputs"])}
    producers = {}
    for (step, seq), (op, inputs) in flow.items():
        pending, found = list(inputs), []
        while pending:
            up = pending.pop()
            up_op, up_inputs = flow.get((step, up), ("", []))
            if up_op in CARRIERS and up < seq:
                pending += up_inputs
            elif up_op not in ("", INPUT_OP):
                found.append((step, up))
        producers[(step, seq)] = found
    return producers


def _state_after_the_first_step(table: pd.DataFrame, rows: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per row of `rows`: a parameter after an optimizer step other than the first. It is the state training carries,
    not a computation of its own: an adaptive optimizer (Adam, Adadelta) moves each element by about lr whatever its
    gradient's size at its first steps, so the noise of a near-zero gradient flips whole steps (dcgan's faithful fp16
    port on the emulators' modelled noise: a batch-norm bias 6% apart at step 2, its gradient 0.3%). The first
    step's update is judged, where a port's optimizer shows; later steps are judged by the ops that read the state,
    with the noise it carries (tolerances.STATE_NOISE_GROWTH), by the gradients and by the losses."""
    update = (table["ref_op"].iloc[rows] == UPDATE_OP).to_numpy(dtype=bool, na_value=False)
    return update & (step > step.min())


MODEL_PHASES = (Phase.FORWARD.value, Phase.BACKWARD.value)


def _read_batches(table: pd.DataFrame) -> np.ndarray:
    """The batch records (INPUT_OP) that no op of a model produced (ops.inputs, through the casts and copies between:
    CARRIERS): data read, judged as such (tolerances.batch_rtol). A discriminator's batch made by its generator's last
    op, detached or copied, is that op's output."""
    batch = (table["ref_op"] == INPUT_OP).to_numpy(dtype=bool, na_value=False).copy()
    known = table.loc[table["ref_seq"].notna()].drop_duplicates(["step", "ref_seq"])
    calls = {(step, int(seq)): (op, phase, producers) for step, seq, op, phase, producers in zip(
        known["step"], known["ref_seq"], known["ref_op"], known["phase"], known["ref_inputs"])}
    for row in np.flatnonzero(batch):
        batch[row] = not _made_by_a_model(calls, table["step"].iat[row], table["ref_inputs"].iat[row])
    return batch


def _made_by_a_model(calls: dict[tuple[Any, int], tuple[Any, Any, Any]], step: Any, producers: Any) -> bool:
    """Whether the first call up the data flow from `producers` (the reference's seqs in `step`) that is no cast or
    copy is an op of a model's forward or backward."""
    pending, seen = _seqs(producers), set()
    while pending:
        seq = pending.pop()
        if seq in seen:
            continue
        seen.add(seq)
        op, phase, inputs = calls.get((step, seq), ("", "", ""))
        if op in CARRIERS:
            pending += _seqs(inputs)
        elif phase in MODEL_PHASES and op != INPUT_OP:
            return True
    return False


# The status of a call that only one side made, per side.
_UNPAIRED = {"ref": AlignStatus.ONLY_REF.value, "actual": AlignStatus.ONLY_ACTUAL.value}


def one_sided_producers(table: pd.DataFrame, first: dict[str, Any], passes_through: frozenset[str]
                        ) -> dict[str, list[int]]:
    """Per side ("ref", "actual"): the table rows of the calls only that side made whose outputs flow into the
    first divergent op `first`, up each side's recorded data flow (its ops.inputs) through other such calls and
    through `passes_through` (casts and copies, expected one-sided ops), to the paired calls; in execution order, one
    row per call. A port that computes another activation through a config (relu for GPT-2's tanh GELU, eight ops)
    pairs none of its calls, and the op after it is the first to differ."""
    rows = table.loc[table["step"] == first["step"]]
    chosen = rows.loc[(rows["ref_seq"] == first["seq"]) & rows["status"].isin(MATCHED_STATUSES)].iloc[0]
    found = {}
    for side in _UNPAIRED:
        calls = rows.loc[rows[f"{side}_seq"].notna()].drop_duplicates(f"{side}_seq")
        by_seq = dict(zip(calls[f"{side}_seq"].astype("int64"), calls.index))
        pending, seen, unpaired = _seqs(chosen[f"{side}_inputs"]), set(), []
        while pending:
            seq = pending.pop()
            if seq in seen or seq not in by_seq:
                continue
            seen.add(seq)
            row = by_seq[seq]
            op = str(table.at[row, f"{side}_op"])
            through = op in passes_through
            if not through and (table.at[row, "status"] != _UNPAIRED[side] or op == INPUT_OP):
                continue  # a paired call, or the batch: the data flow before it is judged by its own verdict
            unpaired += [] if through else [seq]
            pending += _seqs(table.at[row, f"{side}_inputs"])
        found[side] = [by_seq[seq] for seq in sorted(unpaired)]
    return found


def _seqs(producers: Any) -> list[int]:
    """The seqs a recorded ops.inputs lists ("12,15"; empty or NA: none)."""
    return [] if pd.isna(producers) else [int(part) for part in str(producers).split(",") if part]


def _elements(shapes: pd.Series) -> np.ndarray:
    """The element counts of recorded shapes ("64x1x28x28"; "" for a scalar)."""
    return np.array([np.prod([int(size) for size in str(shape).split("x") if size.isdigit()]) for shape in shapes],
                    dtype="float64")


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
    matched = np.flatnonzero(table["status"].isin(MATCHED_STATUSES).to_numpy())
    calls = pd.DataFrame({
        "step": table["step"].to_numpy()[matched], "seq": table["ref_seq"].to_numpy(dtype="int64", na_value=0)[matched],
        "shape": table["ref_shape"].cat.codes.to_numpy()[matched],
        "error": np.nan_to_num(table["stats_error"].to_numpy("float64")[matched], nan=0.0),
        "tolerance": table["tolerance"].to_numpy("float64")[matched]}, index=matched)
    limit = np.zeros(len(table))  # a recorded data flow replaces the stand-ins: no producer, nothing inherited
    pairs, known = _producer_pairs(table, matched)
    if len(known) < len(matched):  # a run without a recorded data flow (schema version 1, an msprobe dump)
        limit[matched] = _stand_in_limit(calls)
        limit[known] = 0.0
    per_call = calls.groupby(["step", "seq"])[["error", "tolerance"]].max().reset_index()
    flow = pairs.merge(per_call, on=["step", "seq"]).groupby("row")[["error", "tolerance"]].max()
    limit[flow.index.to_numpy()] = _limit(flow["error"].to_numpy(), flow["tolerance"].to_numpy())
    limit[matched] = np.fmax(limit[matched], _state_noise(calls))
    error = np.nan_to_num(table["stats_error"].to_numpy("float64")[rows], nan=0.0)
    exact = table["tolerance"].to_numpy("float64")[rows] == 0
    return (error <= limit[rows]) & ~exact


def _state_noise(calls: pd.DataFrame) -> np.ndarray:
    """Per call: the noise its step inherits from the state the earlier steps left."""
    return carried_noise(calls["step"], calls["error"]).reindex(calls["step"]).to_numpy()


def carried_noise(step: pd.Series, error: pd.Series) -> pd.Series:
    """Per step: the noise it inherits from the state the earlier steps left, tolerances.STATE_NOISE_GROWTH times the
    largest error of any earlier step (none at the first step). The gradients of a step carry it too (curves)."""
    worst = pd.Series(np.nan_to_num(error.to_numpy("float64"), nan=0.0)).groupby(step.to_numpy()).max().sort_index()
    return worst.cummax().shift(1, fill_value=0.0) * tolerances.STATE_NOISE_GROWTH


def carried_noise_of(table: pd.DataFrame) -> pd.Series:
    """carried_noise over the matched op records of a comparison table (empty without op records)."""
    matched = table.loc[table["status"].isin(MATCHED_STATUSES)]
    return carried_noise(matched["step"], matched["stats_error"])


def _limit(inherited_error: np.ndarray, inherited_tolerance: np.ndarray) -> np.ndarray:
    return np.nan_to_num(tolerances.NOISE_AMPLIFICATION * np.fmax(inherited_error, inherited_tolerance), nan=0.0)


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


def source_text(value: Any) -> str:
    """A record's ops.source, "" where it has none (runs recorded before it, msprobe dumps)."""
    return value if isinstance(value, str) else ""


def op_label(op: dict[str, Any]) -> str:
    where = f"{op['module']} " if op["module"] else ""
    return f"{op['op']} ({where}{op['phase']}, step {op['step']}, {op['io']})"


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
