"""The reference's own noise, measured: its envelope.

A calibration run (verify/capture/perturbation.py) is the reference once more in the summation order of the port's
emulated device (or, where that order cannot be set, under another rounding and summation order). How far each of
its records moves from the reference's is what that alone does to this script: a cancelling sum, a normalisation's
backward, a ReLU's flipped sign, Adam's sign-like first update or a GAN's chaotic loss move far, a plain matmul hardly
at all. No constant tuned on one script can know that; the script's own calibration does.

Per record the envelope is the largest difference of the reference from any of its calibration runs, measured as the
port's difference is (metrics.stats_error for ops, relative differences for losses and gradient norms). An op's
envelope also takes the same op's envelope at the steps before it, the envelopes of the calls that produced its
inputs (the recorded data flow) and of its call's other records: one calibration run is one sample of the noise, and
an op whose own sample happened to come out small still carries what flows through it (measured: on pytorch/examples'
mnist ported to fp16, a backward matmul of step 8 differed by 0.017 where its own calibration sample showed 0.0008
and the same op 0.02 at the steps before it). Noise grows as training goes and never travels back in time: a chaotic
step 8 does not widen step 0, where a port's own divergence shows against the reference's 1e-7. The verdict judges
the port's difference against tolerances.ENVELOPE_FACTOR times the envelope, never below the dtype's fixed tolerance
(its floor, the devices' accuracy standard). Torch-free: it reads run folders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from verify import devices
from verify.compare import metrics, tolerances
from verify.compare.align import MATCHED_STATUSES, align_ops
from verify.record.store import Run

# A record's place in its run, and the op it belongs to at every step (the same call of the same module).
RECORD = ["step", "ref_seq", "io"]
SAME_OP = ["phase", "module", "ref_op", "ref_call_index", "io"]


@dataclass
class Envelope:
    runs: int  # calibration runs measured
    ops: pd.DataFrame  # RECORD and SAME_OP columns, error: the reference's largest stats error against its calibrations
    losses: pd.Series  # (step, micro_step) -> relative loss difference
    grads: pd.Series  # (step, param) -> relative gradient norm difference
    overflows_apart: list[int]  # steps a calibration's fp16 gradients overflowed at and the reference's not, or back
    in_port_order: int = 0  # of the runs, those summed in the port's device's order alone (perturbation.py)
    # The statistics (metrics.STAT_NAMES, by RECORD) of the first run summed in the port's device's order alone, and
    # that order's block count: the run that computes as an emulated port computes (computes_as_the_port)
    in_port_stats: pd.DataFrame | None = None
    in_port_blocks: int = 0

    def describe(self) -> str:
        runs = "one calibration run" if self.runs == 1 else f"{self.runs} calibration runs"
        how = ("summed as the port's device sums" if self.in_port_order == self.runs
               else "under another rounding and summation order" if not self.in_port_order
               else f"{self.in_port_order} summed as the port's device sums, the others under another rounding")
        return (f"judged against the reference's own noise: {runs} of the reference {how}; a record diverges past "
                f"{tolerances.ENVELOPE_FACTOR:g} times the reference's difference from itself, and never within its "
                "dtype's fixed tolerance")


def measure(ref: Run, calibrations: Sequence[Run], unscaled: Callable[[Run], pd.DataFrame]) -> Envelope | None:
    """The envelope of `ref` from its calibration runs (None without any). `unscaled` gives a run's op records as
    the comparison reads them (backward statistics divided by the loss scale)."""
    if not calibrations:
        return None
    aligned = [_aligned(unscaled(ref), unscaled(run)) for run in calibrations]
    ops = pd.concat([_op_errors(table) for table in aligned])
    ops = ops.groupby(list(dict.fromkeys(RECORD + SAME_OP)), dropna=False)["error"].max().reset_index()
    losses = [_loss_differences(ref, run) for run in calibrations]
    grads = [_grad_differences(ref, run) for run in calibrations]
    apart = sorted(set().union(*(_overflowed(ref) ^ _overflowed(run) for run in calibrations)))
    in_port_order = sum(run.manifest.perturbation.get("rounded") is False for run in calibrations)
    exact = [number for number, run in enumerate(calibrations) if _in_port_order(run)][:1]
    return Envelope(len(calibrations), ops, _largest(losses), _largest(grads), apart, in_port_order,
                    *((_stats(aligned[exact[0]]), int(calibrations[exact[0]].manifest.perturbation["blocks"]))
                      if exact else ()))


def _in_port_order(run: Run) -> bool:
    """A calibration summed in the port's device's order with no other change: no random rounding (perturbation.py)
    and no half precision's."""
    plan = run.manifest.perturbation
    return plan.get("rounded") is False and not plan.get("half") and bool(plan.get("blocks"))


def _stats(table: pd.DataFrame) -> pd.DataFrame:
    """The calibration's side of an aligned table: its statistics by RECORD."""
    return _keys(table)[RECORD].assign(**{stat: table[f"actual_{stat}"].to_numpy("float64")
                                          for stat in metrics.STAT_NAMES}).drop_duplicates(RECORD).set_index(RECORD)


def computes_as_the_port(measured: Envelope | None, port: Run) -> pd.DataFrame | None:
    """The statistics of the calibration run that computes as `port` does, by RECORD, where one does: `port` is
    emulated, sums in its device's order (not --exact-emulation), and the calibration summed in that order with no
    random rounding. On the emulators a faithful port then computes the calibration's bits wherever their faces agree
    (the losses of pytorch/examples' dcgan and siamese_network come out bit-identical), so the port's difference from
    it is its own, with none of the reference's noise in between; never on a real device, whose order is not known."""
    if measured is None or measured.in_port_stats is None or not port.manifest.emulated:
        return None
    if port.manifest.exact_emulation or measured.in_port_blocks != devices.row(port.manifest.device).summation_blocks:
        return None
    return measured.in_port_stats


def _overflowed(run: Run) -> set[int]:
    return set(run.manifest.loss_scaler.get("overflowed", run.manifest.skipped_steps))


def _largest(parts: list[pd.Series]) -> pd.Series:
    joined = pd.concat(parts)
    return joined.groupby(level=list(range(joined.index.nlevels))).max() if len(joined) else joined


def _aligned(ref_ops: pd.DataFrame, calibration_ops: pd.DataFrame) -> pd.DataFrame:
    table = align_ops(ref_ops, calibration_ops)
    return table.loc[table["status"].isin(MATCHED_STATUSES)]


def _op_errors(table: pd.DataFrame) -> pd.DataFrame:
    error = metrics.stats_error({s: table[f"ref_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES},
                                {s: table[f"actual_{s}"].to_numpy("float64") for s in metrics.STAT_NAMES})
    return _keys(table).assign(error=np.nan_to_num(error, nan=0.0))


def _keys(table: pd.DataFrame) -> pd.DataFrame:
    """RECORD and SAME_OP of each row of an aligned table, as plain columns."""
    return pd.DataFrame({"step": table["step"].to_numpy("int64"),
                         "ref_seq": table["ref_seq"].to_numpy(dtype="int64", na_value=-1),
                         **{column: table[column].astype(str).to_numpy() for column in ("phase", "module", "ref_op",
                                                                                         "io")},
                         "ref_call_index": table["ref_call_index"].to_numpy(dtype="int64", na_value=-1)})


def _loss_differences(ref: Run, calibration: Run) -> pd.Series:
    keys = ["step", "micro_step"]
    merged = ref.losses[[*keys, "loss"]].merge(calibration.losses[[*keys, "loss"]], on=keys, suffixes=("", "_c"))
    ref_loss = pd.to_numeric(merged["loss"], errors="coerce").to_numpy("float64")
    other = pd.to_numeric(merged["loss_c"], errors="coerce").to_numpy("float64")
    with np.errstate(invalid="ignore"):
        relative = np.abs(other - ref_loss) / np.maximum(np.abs(ref_loss), metrics.TINY)
    return pd.Series(np.nan_to_num(relative, nan=0.0), index=pd.MultiIndex.from_frame(merged[keys]))


def _grad_differences(ref: Run, calibration: Run) -> pd.Series:
    keys = ["step", "param"]
    merged = ref.grads[[*keys, "norm"]].merge(calibration.grads[[*keys, "norm"]], on=keys, suffixes=("", "_c"))
    ref_norm, other = merged["norm"].to_numpy("float64"), merged["norm_c"].to_numpy("float64")
    with np.errstate(invalid="ignore"):  # a NaN norm (an overflowed gradient) has no difference to measure
        relative = np.abs(other - ref_norm) / grad_scale(merged["step"], ref_norm, other)
    return pd.Series(np.nan_to_num(relative, nan=0.0), index=pd.MultiIndex.from_frame(merged[keys]))


def of_losses(envelope: Envelope, keys: pd.DataFrame) -> np.ndarray:
    """Per (step, micro_step) row: the loss's envelope, the largest its calibration showed at this step or any before
    (one sample per step; the noise a chaotic loss carries grows from step to step, and a later step's never reaches
    back to widen an earlier one)."""
    return _up_to_each_step(envelope.losses, keys, same=[])


def of_grads(envelope: Envelope, keys: pd.DataFrame) -> np.ndarray:
    """Per (step, param) row: the gradient norm's envelope, the largest the same parameter's showed at this step or
    any before (measured: pytorch/examples' imagenet, resnet18 on --dummy data, fp16 port: layer2.0.conv1.weight's
    gradient norm moved 1.09% in the port at step 1 where its calibration sample moved 0.02%, and 1.7% at step 2)."""
    return _up_to_each_step(envelope.grads, keys, same=["param"])


def _up_to_each_step(measured: pd.Series, keys: pd.DataFrame, same: list[str]) -> np.ndarray:
    """Per row of `keys`: the largest difference `measured` shows for the same `same` (the same parameter, the same
    op) at the row's step or any step before it: noise grows as training goes, and is never taken back in time (a
    chaotic step 8 does not explain a difference at step 0). NaN where none was measured so far."""
    rows = keys[[*same, "step"]].astype({"step": "int64"}).assign(row=np.arange(len(keys))).sort_values("step")
    if measured.empty:
        return np.full(len(keys), np.nan)
    frame = measured.rename("noise").reset_index().astype({"step": "int64"})
    per_step = frame.groupby([*same, "step"])["noise"].max().reset_index().sort_values("step")
    per_step["noise"] = per_step.groupby(same)["noise"].cummax() if same else per_step["noise"].cummax()
    # merge_asof demands one dtype a key: a name column is object on one side and pandas' str dtype on the other
    # when one table was read from a run and the other built here (pandas 3)
    texts = {name: "string" for name in same if not pd.api.types.is_numeric_dtype(rows[name])
             or not pd.api.types.is_numeric_dtype(per_step[name])}
    joined = pd.merge_asof(rows.astype(texts), per_step.astype(texts), on="step", by=same or None,
                           direction="backward")
    return joined.sort_values("row")["noise"].to_numpy("float64")


def grad_scale(step: pd.Series, ref_norm: np.ndarray, other_norm: np.ndarray) -> np.ndarray:
    """What a gradient norm's difference is relative to: the larger norm, or a share of its step's largest (a
    cancelling bias gradient is mostly noise), never below GRAD_NORM_ATOL."""
    largest = pd.Series(ref_norm).groupby(step.to_numpy()).transform("max").to_numpy("float64")
    return np.fmax.reduce([np.abs(ref_norm), np.abs(other_norm), tolerances.GRAD_NORM_SHARE_OF_LARGEST * largest,
                           np.full(len(ref_norm), tolerances.GRAD_NORM_ATOL)])


def of_ops(envelope: Envelope, table: pd.DataFrame, producers: pd.DataFrame) -> np.ndarray:
    """Per row of an aligned comparison table: its envelope, widened by the same op's at its step and the steps
    before, by its call's other records, and by the calls that produced its inputs (`producers`: row, step, seq pairs
    of the recorded data flow). NaN where the calibration has no such record (an op only the port computes)."""
    keys = _keys(table)
    own = envelope.ops.set_index(RECORD)["error"].reindex(pd.MultiIndex.from_frame(keys[RECORD]))
    same_op = _up_to_each_step(envelope.ops.set_index([*SAME_OP, "step"])["error"], keys, same=SAME_OP)
    per_call = envelope.ops.groupby(["step", "ref_seq"])["error"].max()
    call = per_call.reindex(pd.MultiIndex.from_frame(keys[["step", "ref_seq"]]))
    widened = np.fmax.reduce([own.to_numpy("float64"), same_op, call.to_numpy("float64")])
    if len(producers):
        inherited = per_call.reindex(pd.MultiIndex.from_arrays([producers["step"], producers["seq"]])).to_numpy()
        flow = pd.Series(inherited, index=producers["row"].to_numpy()).groupby(level=0).max()
        positions = flow.index.to_numpy()  # row positions in the table
        widened[positions] = np.fmax(widened[positions], flow.to_numpy("float64"))
    return widened
