"""How the precision of two runs decides their tolerances: the half dtype each computed its forward in, and the
policy a comparison takes from them (same precision, same AMP, or fp32 against AMP with widened tolerances, each from
verify/compare/tolerances.py). Pure computation over runs; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify.compare import tolerances
from verify.compare.op_catalogue import BUILT_IN, CARRIERS, OpCatalogue, read_catalogue
from verify.errors import CompareError
from verify.record.store import Run
from verify.record.schema import AUTOCAST_DTYPES, HALF_DTYPES


@dataclass(frozen=True)
class CompareOptions:
    loss_rtol: float | None = None  # None: the precision policy's default (tolerances.LOSS_RTOL or AMP_VS_FP32_...)
    op_catalogue: OpCatalogue = BUILT_IN  # with the user's op mapping files (op_catalogue.read_catalogue)

    def to_record(self) -> dict[str, Any]:
        """As summary.json keeps them (`options`), so that `verify report` compares again as the comparison did."""
        return {"loss_rtol": self.loss_rtol,
                "op_mapping": [str(Path(source).resolve()) for source in self.op_catalogue.sources]}

    @classmethod
    def from_record(cls, record: Any, where: Path) -> CompareOptions:
        """The options `record` (to_record's, read from the summary `where`) holds; CompareError where it is not
        that, VerifyFailure naming a mapping file that is gone or changed its form."""
        record = {} if record is None else record
        rtol, mapping = (record.get("loss_rtol"), record.get("op_mapping", [])) if isinstance(record, dict) else ("", "")
        if (not isinstance(rtol, (int, float, type(None))) or isinstance(rtol, bool) or not isinstance(mapping, list)
                or not all(isinstance(path, str) for path in mapping)):
            raise CompareError(f"{where}: its `options` are not the comparison options verify writes")
        return cls(loss_rtol=rtol, op_catalogue=read_catalogue([Path(path) for path in mapping]))


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


def amp_dtype(run: Run) -> str:
    """The half dtype a run computed its forward in: the autocast it was given, else what its ops show: its modules'
    forwards, or where they computed none in half precision, what it computed outside any module's forward (a model
    whose layers the script calls through .forward(), never as modules: pytorch/examples' mnist_forward_forward; a
    cast alone, data stored in half precision, is not a computation)."""
    imposed = AUTOCAST_DTYPES.get(run.manifest.autocast, run.manifest.autocast if run.manifest.autocast in HALF_DTYPES
                                  else "")
    if imposed:
        return imposed
    for phases in (["forward"], ["other"]):
        half = run.ops.loc[run.ops["phase"].isin(phases) & ~run.ops["op"].isin(list(CARRIERS)), "dtype"]
        seen = half[half.isin(HALF_DTYPES)]
        if len(seen):
            return str(seen.mode().iloc[0])
    return ""


def precision_cost(run: Run) -> dict[str, float | None]:
    """What a run's precision costs and buys, as summary.json gives it for each side (a fix's fix.md compares its
    rungs by them): the share of its forward and backward records of a floating dtype computed in half precision,
    and its median step time in ms (None where it recorded none)."""
    ops = run.ops.loc[run.ops["phase"].isin(["forward", "backward"]) & ~run.ops["op"].isin(list(CARRIERS)), "dtype"]
    floating = ops[ops.str.startswith(("float", "bfloat"), na=False)]
    wall_ms = run.losses["wall_ms"].dropna()
    return {"half_share": round(float(floating.isin(HALF_DTYPES).mean()), 4) if len(floating) else None,
            "step_ms": round(float(wall_ms.median()), 3) if len(wall_ms) else None}


def imposed_autocast_entered(run: Run) -> bool:
    """Whether the autocast verify gave the run (`manifest.autocast`) computed anything: around the whole script, or
    where it followed the port's scopes, in a call the port made under autocast. A port computing in half precision
    from its weights alone (PEFT's olora, a model loaded in float16 under a Trainer without fp16=) had autocast off
    in every call, and so had the reference that followed it."""
    follow = run.manifest.autocast_follow
    return bool(run.manifest.autocast) and (not follow or any(
        state in HALF_DTYPES for calls in follow.values() for state, _ in calls))


def _half_precision_words(dtype: str, *runs: Run) -> str:
    """'float16 autocast' where a side computed under autocast; the half dtype its weights or inputs are in
    (model.half(), a checkpoint loaded in float16) where both sides recorded their module calls' autocast and none
    was half; the dtype alone where a side recorded none (a run made before autocast_scopes: no word on it)."""
    under_autocast = any(imposed_autocast_entered(run) or any(
        state in HALF_DTYPES for calls in run.manifest.autocast_scopes.values() for state, _ in calls)
                         for run in runs)
    if under_autocast:
        return f"{dtype} autocast"
    recorded = all(run.manifest.autocast_scopes for run in runs)
    return f"{dtype} weights or inputs, no autocast" if recorded else dtype


def precision_policy(ref: Run, actual: Run, options: CompareOptions) -> PrecisionPolicy:
    ref_amp, actual_amp = amp_dtype(ref), amp_dtype(actual)
    if ref_amp == actual_amp:
        widen, loss_rtol = 1.0, tolerances.LOSS_RTOL
        description = (f"same-AMP policy ({_half_precision_words(ref_amp, ref, actual)} on both sides): dtype "
                       "tolerances" if ref_amp else "same precision (fp32 on both sides): dtype tolerances")
    else:
        widen, loss_rtol = tolerances.AMP_VS_FP32_OP_FACTOR, tolerances.AMP_VS_FP32_LOSS_RTOL
        description = (f"fp32-vs-AMP: ref {ref_amp or 'fp32'}, actual {actual_amp or 'fp32'}; op tolerances of the "
                       f"looser dtype widened x{widen:g}, loss rtol {loss_rtol:g}. This mixes AMP noise with porting "
                       "errors: rerun the reference under the same autocast to isolate the port")
    if options.loss_rtol is not None:
        loss_rtol = options.loss_rtol
    return PrecisionPolicy(ref_amp, actual_amp, widen, loss_rtol, description)
