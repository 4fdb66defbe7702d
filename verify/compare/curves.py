"""What two runs recorded besides their operators, compared step by step: the loss curves, the hyperparameters,
the gradient norms, the inference outputs, and overflow (the first inf/nan, loss-scale traces, updates skipped on one
side only). Pure computation over runs; no torch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from verify.compare import metrics
from verify.compare import tolerances
from verify.compare.envelope import Envelope, grad_scale, of_grads, of_losses
from verify.compare.precision_policy import PrecisionPolicy, amp_dtype
from verify.record.schema import ACCUMULATION, HALF_DTYPES, MODULE_HPARAMS, RECORDED_SETTINGS
from verify.record.store import Run
from verify.errors import RunDirError


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


def compare_losses(ref: Run, actual: Run, rtol: float, measured: Envelope | None = None) -> LossComparison:
    """Each step's loss within `rtol`, or within ENVELOPE_FACTOR times the reference's own difference from its
    calibration runs at that step or before (`envelope`), whichever is larger: a GAN's chaotic loss is judged by what
    it does, and a later step's chaos never excuses an earlier step."""
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
    frame["tolerance"] = rtol
    if measured is not None:
        frame["envelope"] = of_losses(measured, frame[keys])
        frame["tolerance"] = np.fmax(rtol, tolerances.ENVELOPE_FACTOR * frame["envelope"].fillna(0.0))
    frame["passed"] = frame["rel_diff"] <= frame["tolerance"]
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
    # a setting verify reads off the run is compared where both runs were recorded with it (not by an older writer)
    unrecorded = [name for name in RECORDED_SETTINGS
                  if not (ref.hparams["name"].eq(name).any() and actual.hparams["name"].eq(name).any())]
    sides = [frame.loc[frame["step"].isin(common_steps) & ~frame["name"].isin(unrecorded)].astype({"group": "string"})
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
    """'lr 0.1 vs 0.01 in group 0 of optimizer 1 from step 3', 'dropout 0.1 vs 0.2 in encoder.drop': the parts
    that apply."""
    named = not (group is None or group is pd.NA or str(group) in ("", "nan", "<NA>"))
    group_text = (f" in {group}" if optimizer == MODULE_HPARAMS else f" in group {group}") if named else ""
    optimizer_text = f" of optimizer {optimizer}" if optimizer > 0 else ""
    unit = _UNITS.get(str(name), "")
    since = f" from step {since_step}" if since_step is not None else ""
    return f"{name} {ref_value} vs {actual_value}{unit}{group_text}{optimizer_text}{since}"


_UNITS = {ACCUMULATION: " backward() calls per optimizer step"}


def compare_grads(ref: Run, actual: Run, rtol: float, carried: pd.Series | None = None,
                  measured: Envelope | None = None) -> pd.DataFrame:
    """Each parameter's gradient norm per step, within `rtol`, or within the noise it carries, whichever is larger:
    ENVELOPE_FACTOR times the reference's own difference from its calibration runs (`envelope`) where measured, else
    the noise its step `carried` in from the state earlier steps left (op_verdicts.carried_noise: step -> noise)."""
    keys = ["step", "param"]
    columns = [*keys, "dtype", "norm", "nan_count", "inf_count"]
    # The gradients of a step a loss scaler skipped were never applied, and overflowed on purpose on the scaled side.
    skipped = skipped_steps(ref, actual)
    sides = [run.grads.loc[~run.grads["step"].isin(skipped), columns] for run in (ref, actual)]
    merged = sides[0].merge(sides[1], on=keys, how="inner", suffixes=("_ref", "_actual"))
    merged = merged.rename(columns=lambda c: f"{c.rsplit('_', 1)[1]}_{c.rsplit('_', 1)[0]}"
                           if c.endswith(("_ref", "_actual")) else c)
    ref_norm, actual_norm = merged["ref_norm"].to_numpy("float64"), merged["actual_norm"].to_numpy("float64")
    merged["rel_diff"] = np.abs(actual_norm - ref_norm) / grad_scale(merged["step"], ref_norm, actual_norm)
    nonfinite_agree = ((merged["ref_nan_count"] > 0) == (merged["actual_nan_count"] > 0)) & (
        (merged["ref_inf_count"] > 0) == (merged["actual_inf_count"] > 0))
    if measured is not None:
        merged["envelope"] = of_grads(measured, merged[keys])
        tolerance = np.fmax(rtol, tolerances.ENVELOPE_FACTOR * merged["envelope"].fillna(0.0).to_numpy())
    else:
        tolerance = np.fmax(rtol, (carried if carried is not None else pd.Series(dtype="float64")).reindex(
            merged["step"]).fillna(0.0).to_numpy())
    merged["tolerance"] = tolerance
    merged["passed"] = (merged["rel_diff"] <= tolerance) & nonfinite_agree
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
    values = {metric.name: np.full(len(merged), np.nan) for metric in metrics.OUTPUT_METRICS}
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
            for metric in metrics.OUTPUT_METRICS:
                values[metric.name][row] = metric.function(ref_tensor, actual_tensor)
    for name, column in values.items():
        merged[name] = column
    merged["top_k"] = [metrics.top_k(_classes(shape)) for shape in merged["ref_shape"]]
    by_tensor = ~np.isnan(values[metrics.COSINE.name])  # an undefined cosine (a zero output): judged by statistics
    tensor_ok = metrics.within_limits(metrics.OUTPUT_METRICS, values, limits.assign(**tolerances.OUTPUT_LIMITS))
    stats_ok = ~(merged["stats_error"].to_numpy() > limits["stats_rtol"].to_numpy())
    merged["passed"] = np.where(by_tensor, tensor_ok, stats_ok)
    return merged


def _classes(shape: str) -> int:
    """The scores a sample of an output has: its last dimension ("(8, 3)", "[8, 3]" -> 3); TOP_K where unknown."""
    sizes = [int(size) for size in re.findall(r"\d+", str(shape))]
    return sizes[-1] if sizes else metrics.TOP_K


# each at its worst over the steps; top_k: the k of "top-5" (fewer where an output has fewer classes)
_OUTPUT_FIGURES = {**{metric.name: metric.worst for metric in metrics.OUTPUT_METRICS}, "top_k": "min"}


def summarize_outputs(outputs: pd.DataFrame, policy: PrecisionPolicy) -> dict[str, Any]:
    """Inference outputs at their worst over the steps, per output and overall, with the criterion they were judged
    by: what the verdict names, summary.json holds and an adaptation report shows. Empty for a training pair."""
    if outputs.empty:
        return {}
    judged = outputs.assign(passed=outputs["passed"].astype(bool))
    per_output = judged.groupby("output").agg(**{name: (name, how) for name, how in _OUTPUT_FIGURES.items()},
                                              passed=("passed", "all"), steps=("step", "nunique"))
    overall = {name: getattr(judged[name], how)() for name, how in _OUTPUT_FIGURES.items()}
    first = judged.iloc[0]
    return {"per_output": per_output.reset_index().to_dict(orient="records"),
            "overall": overall | {"passed": bool(judged["passed"].all()), "outputs": len(per_output)},
            "criterion": tolerances.output_criterion(str(first["ref_dtype"]), str(first["actual_dtype"]),
                                                     policy.op_widen)}


def _expected_overflow(ops: pd.DataFrame, skipped: list[int]) -> pd.Series:
    """Rows whose inf/nan a loss scaler dealt with: backward ops of a step whose update the scaler skipped. Dynamic
    loss scaling overflows on purpose (a GradScaler starts high and backs off), so these are its work, not a fault."""
    return (ops["phase"] == "backward") & ops["step"].isin(skipped)


def _first_nonfinite(ops: pd.DataFrame, skipped: list[int], scalers_work: bool = False) -> dict[str, Any] | None:
    """The first op whose result holds an inf or a nan: outside what a loss scaler dealt with, or (`scalers_work`)
    inside it: where the scaled gradients of the steps it skipped first overflowed, the backward op with the forward
    line it differentiates."""
    expected = _expected_overflow(ops, skipped)
    bad = ops.loc[((ops["nan_count"].fillna(0) > 0) | (ops["inf_count"].fillna(0) > 0))
                  & (expected if scalers_work else ~expected)]
    if bad.empty:
        return None
    first = bad.sort_values(["step", "seq"]).iloc[0]
    # source: the user's line that computed it (`train_npu.py:55`), which `migrate --fix-from` keeps in fp32
    return {key: first.get(key) for key in ("step", "seq", "phase", "module", "op", "io", "dtype", "nan_count",
                                            "inf_count", "source")}


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
        "steps": [int(step) for step in scale.index],
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
        # no optimizer update at all: the run proves nothing of training. One skipped step is a GradScaler's usual
        # first back-off, so it takes two.
        "every_update_skipped": bool(len(scale) >= tolerances.MIN_STEPS_NEVER_UPDATED and not applied),
        # a reference without a GradScaler of its own that follows the port's (LossScalerTwin) skips where the port
        # did, and only because it did
        "follows_port": "twin" in run.manifest.loss_scaler and "script_scaler" not in run.manifest.loss_scaler,
    }


def _longest_unskipped_run(steps: pd.Index, skipped: set[int]) -> int:
    longest = current = 0
    for step in steps:
        current = 0 if step in skipped else current + 1
        longest = max(longest, current)
    return longest


def _one_sided_skips(ref: Run, actual: Run) -> list[dict[str, Any]]:
    """Steps where, under the same loss scale and precision, one side's gradients overflowed and the other's did not.
    A reference that follows the port's scaler (the twin) skips the port's steps whatever happens, so its own
    overflows are in manifest.loss_scaler["overflowed"]; a side with its own GradScaler overflowed exactly at its
    skipped steps. An fp32 side never overflows where an fp16 one does: not comparable."""
    if amp_dtype(ref) != amp_dtype(actual):
        return []
    common = set(ref.losses["step"]) & set(actual.losses["step"])
    scales = [pd.to_numeric(run.losses.groupby("step")["loss_scale"].first(), errors="coerce")
              for run in (ref, actual)]
    overflowed = [set(run.manifest.loss_scaler.get("overflowed", run.manifest.skipped_steps)) for run in (ref, actual)]
    differing = []
    for step in sorted(common & (overflowed[0] ^ overflowed[1])):
        ref_scale, actual_scale = scales[0].get(step, np.nan), scales[1].get(step, np.nan)
        if np.isfinite(ref_scale) and ref_scale == actual_scale:
            differing.append({"step": int(step), "scale": float(ref_scale),
                              "side": "ref" if step in overflowed[0] else "actual"})
    return differing


def compare_overflow(ref: Run, actual: Run, measured: Envelope | None = None) -> dict[str, Any]:
    """The first inf/nan of each side, their loss-scale traces and the updates one side alone skipped. Where the
    reference's own calibration overflowed at other steps than the reference, rounding alone decides whether fp16
    gradients overflow at these scales: one-sided skips are then within the script's noise, not findings."""
    ref_first = _first_nonfinite(ref.ops, ref.manifest.skipped_steps)
    actual_first = _first_nonfinite(actual.ops, actual.manifest.skipped_steps)
    same_op = bool(ref_first and actual_first and all(
        ref_first[k] == actual_first[k] for k in ("step", "phase", "module", "op")))
    one_sided = bool((ref_first is None) != (actual_first is None)) or (bool(ref_first and actual_first)
                                                                       and not same_op)
    firsts = [first for first in (ref_first, actual_first) if first]
    # Gradients overflowing at other steps is what the reference's own calibration did too: loss scaling at work
    # whose timing rounding decides (a GAN's generator backward through its discriminator overflows in the
    # discriminator's gradients, which no optimizer of that step applies, and no scaler skips).
    by_noise = one_sided and overflow_timing_is_noise(measured) and all(first["phase"] == "backward"
                                                                         for first in firsts)
    return {"ref_first": ref_first, "actual_first": actual_first,
            "actual_first_skipped": _first_nonfinite(actual.ops, actual.manifest.skipped_steps, scalers_work=True),
            "one_sided": one_sided and not by_noise,
            "firsts_within_noise": by_noise, **_skips_by_noise(_one_sided_skips(ref, actual), measured),
            "under_imposed_autocast": _under_imposed_autocast(ref, actual, ref_first if same_op else None),
            "ref_scale": _scale_trace(ref), "actual_scale": _scale_trace(actual)}


def _under_imposed_autocast(ref: Run, actual: Run, first: dict[str, Any] | None) -> bool:
    """Whether the inf/nan both sides made first, at the same op, is the port's half precision: the reference
    computed under the autocast imposed from the port (its original computes in fp32 as written), the op computed in
    half precision outside backward (a gradient overflow is the loss scaler's), and the loss of that step is not
    finite on the port (an inf a script makes on purpose, an attention mask's -inf, leaves the loss finite)."""
    if not (first and ref.manifest.autocast and first["dtype"] in HALF_DTYPES and first["phase"] != "backward"):
        return False
    losses = actual.losses.loc[actual.losses["step"] == first["step"], "loss"]
    return bool(len(losses) and not np.isfinite(pd.to_numeric(losses, errors="coerce")).all())


def never_updated(overflow: dict[str, Any]) -> str:
    """Which side's loss scaler skipped every update of the run for itself: "actual" (the port, whose reference only
    followed it: the original, which has no loss scaler, updates at each step), "both" (each side's own GradScaler)
    or ""."""
    ref, actual = overflow["ref_scale"], overflow["actual_scale"]
    if not actual["every_update_skipped"]:
        return ""
    if ref.get("follows_port"):
        return "actual"
    return "both" if ref["every_update_skipped"] else ""


def overflow_timing_is_noise(measured: Envelope | None) -> bool:
    """The reference's calibration overflowed at other steps than the reference: rounding decides where fp16
    gradients overflow at these scales."""
    return measured is not None and bool(measured.overflows_apart)


def _skips_by_noise(skips: list[dict[str, Any]], measured: Envelope | None) -> dict[str, Any]:
    if not overflow_timing_is_noise(measured):
        return {"one_sided_skips": skips, "skips_within_noise": []}
    return {"one_sided_skips": [], "skips_within_noise": skips, "calibration_overflows_apart": measured.overflows_apart}


def skipped_steps(ref: Run, actual: Run) -> list[int]:
    """Steps whose update a loss scaler skipped on either side: their gradients overflowed on purpose."""
    return sorted(set(ref.manifest.skipped_steps) | set(actual.manifest.skipped_steps))
