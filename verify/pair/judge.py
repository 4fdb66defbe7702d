"""Judging a pair's runs (verify/pair/run.py): compared as `verify compare` compares two runs (verify/compare/runs.py),
with what the pair knows besides in every report's notes and in summary.json's `pair`: how the precision of the two
sides was matched, where each side's search path was changed, and the AMP effect (--amp-effect: the fp32 reference
against the reference under autocast, not part of the verdict). The command prints the verdict before the reports are
written: they take their time after it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify.compare.precision_policy import imposed_autocast_entered
from verify.compare.runs import ComparisonResult, compare_runs
from verify.contract.files import AMP_EFFECT, report_folder
from verify.launch.runner import search_path
from verify.pair.plan import PairPlan
from verify.pair.run import AUTOCAST_FLAGS, PairRuns
from verify.record import run_folders
from verify.record.store import Run
from verify.report import writers as reports
from verify.report.adaptation import write_adaptation


@dataclass
class PairComparison:
    result: ComparisonResult  # the port's run against the reference, its first note how they were compared
    how: dict[str, Any]  # summary.json's pair: the comparison's mode, its description, the reference's autocast
    effect: ComparisonResult | None = None  # --amp-effect: the fp32 reference against the reference under autocast
    amp_effect: dict[str, Any] | None = None  # what summary.json says of `effect`


def compare_pair(plan: PairPlan, runs: PairRuns) -> PairComparison:
    """Compares the pair as `verify compare` does, plus the comparison made and the AMP effect."""
    result = compare_runs(runs.ref, runs.actual, plan.compare, runs.calibrations)
    how = _comparison_made(plan, runs)
    result.notes.insert(0, how["description"])
    result.notes += _search_path_notes(plan)
    if plan.amp_effect and runs.ref_fp32 is None:
        result.notes.append("--amp-effect: nothing to measure, the port computes in fp32")
    effect = compare_runs(runs.ref_fp32, runs.ref) if runs.ref_fp32 else None
    return PairComparison(result, how, effect, _amp_effect(effect) if effect is not None else None)


def write_pair_reports(plan: PairPlan, compared: PairComparison) -> None:
    """The reports `verify compare -o` writes, with migrate's checklist where it lies beside the port (in its report
    folder), and what only the pair knows in summary.json; the AMP effect's in their own folder."""
    made_by = {"command": list(plan.command), "ran_in": str(Path.cwd())}  # adaptation.md, made again, says the same
    if plan.adaptation:
        write_adaptation(compared.result, plan.out, **made_by)
    write_reports(compared.result, plan.out, plan.out, report_folder(plan.ported), plan.original.parent,
                  summary={"pair": compared.how | {"amp_effect": compared.amp_effect} | made_by})
    if compared.effect is not None:
        write_reports(compared.effect, plan.out / AMP_EFFECT)


def write_reports(result: ComparisonResult, out: Path, *checklist_places: Path,
                  summary: dict[str, Any] | None = None) -> None:
    """A comparison's reports in `out` (verify/report/writers.py), with migrate's checklist where one lies in or beside
    a folder of `checklist_places`, and `summary`, what only the command knows, in summary.json."""
    reports.write_reports(result, out, checklist=reports.find_checklist(*checklist_places), summary=summary)


def _search_path_notes(plan: PairPlan) -> list[str]:
    """What each side's PYTHONPATH was where it took your folders of the other tree in its own (_in_its_tree)."""
    if plan.trees is None:
        return []
    yours = os.environ.get("PYTHONPATH", "")
    original, port = plan.trees
    return [f"{label} ran with PYTHONPATH={changed}: your PYTHONPATH's folders of {other} taken in {own}, so that it "
            "imports its own tree's modules"
            for label, own, other in (("the port", port, original), ("the reference", original, port))
            if (changed := search_path(yours, own, other)) != yours]


def _fp32_twin_words(twin: dict[str, Any]) -> str:
    """What the loss-scaler twin of an fp32 reference did, in words."""
    scaled = ("; the reference's loss was scaled as the port's GradScaler scaled it (exactly, in fp32)"
              if twin.get("twin") == "scale" else "")
    skipped = (f"; the updates the port's GradScaler skipped{_skipped_words(twin)} were skipped on the reference too, "
               "so both trained on the same updates" if twin.get("followed") else "")
    return scaled + skipped


def _comparison_made(plan: PairPlan, runs: PairRuns) -> dict[str, Any]:
    """Which comparison the pair made, for summary.json and the notes of every report."""
    twin = runs.ref.manifest.loss_scaler if "twin" in runs.ref.manifest.loss_scaler else {}
    if runs.imposed != "off":
        mode = "same-amp-imposed"
        scales = runs.ref.losses["loss_scale"].dropna()
        whose = ("by its own loss scaler, as the port's scaled it" if "script_scaler" in twin
                 else "as the port's GradScaler scaled it")
        scaled = (f", its loss scaled by {scales.iloc[0]:g} and on {whose}, step for step, "
                  f"skipping the updates the port skipped{_skipped_words(twin)}"
                  if twin.get("twin") == "scale" and len(scales) else "")
        description = (f"the port computes in {runs.port_amp}, so the reference ran under {runs.imposed} autocast "
                       f"{_how_imposed(runs.ref)} {_where_imposed(runs.ref)} (on the CPU with the NPU's op casts)"
                       f"{scaled}: the comparison isolates the port")
        if not imposed_autocast_entered(runs.ref):
            description = (f"the port computes in {runs.port_amp} under no autocast (its weights or inputs are "
                           f"{runs.port_amp}), and the reference, held to the port's autocast, computed under none "
                           f"either{scaled}: the comparison isolates the port")
    elif plan.ref_run is not None:
        mode = "given-reference"
        description = f"the reference is the given run {plan.ref_run}, compared as it is"
    elif runs.port_amp:
        mode = "amp-vs-fp32-unmatched" if runs.unmatched_amp else "amp-vs-fp32"
        why = (f"the reference could not run under the port's {AUTOCAST_FLAGS[runs.port_amp]} autocast "
               f"({runs.unmatched_amp}; that run is kept in {run_folders.REF_UNDER_AUTOCAST}/), so it"
               if runs.unmatched_amp else "--no-match-amp: the reference")
        description = (f"{why} ran as written against a port computing in {runs.port_amp}; "
                       f"AMP noise and porting errors are judged together with the wider fp32-vs-AMP tolerances"
                       f"{_fp32_twin_words(twin)}")
    else:
        mode = "as-written"
        description = f"both scripts ran as written (the port computes in fp32){_fp32_twin_words(twin)}"
    return {"mode": mode, "description": description, "ref_autocast": "" if runs.imposed == "off" else runs.imposed}


def _how_imposed(ref: Run) -> str:
    """Whose the reference's autocast is: its own where its script scales its loss itself (a GradScaler of its own,
    its framework's: Lightning's 16-mixed, accelerate's fp16), held to the port's scopes; else verify's."""
    if "script_scaler" in ref.manifest.loss_scaler or ref.manifest.loss_scaler.get("init_scale"):
        return "of its own (its own loss scaler: the same mixed precision on both sides), held by verify"
    return "imposed from outside"


def _where_imposed(ref: Run) -> str:
    """Where the reference's autocast was: the port's scopes it followed (verify/capture/precision_scopes.py)."""
    follow = ref.manifest.autocast_follow
    if not follow:
        return "around the whole script"
    outside = sorted(path for path, calls in follow.items() if any(state == "off" for state, _ in calls))
    shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
    exceptions = f" (not in some or all calls of {shown}, as in the port)" if outside else ""
    return "where the port computed under it" + exceptions


def _skipped_words(twin: dict[str, Any]) -> str:
    steps = twin.get("followed", [])
    return f" (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})" if steps else ""


def _amp_effect(effect: ComparisonResult) -> dict[str, Any]:
    """The reference in fp32 against the reference under autocast (compared by compare_pair): what AMP alone does to the
    loss curve, judged by compare's documented fp32-vs-AMP tolerances (verify/compare/tolerances.py), since one side
    computes in half precision. Its reports go into the pair's AMP_EFFECT folder."""
    loss = effect.summary()["loss"]
    return {"passed": effect.verdict.passed, "reason": effect.verdict.reason, "comparison": effect.policy.description,
            "loss_rtol": effect.loss.rtol, "max_rel_diff": loss["max_rel_diff"], "mean_rel_diff": loss["mean_rel_diff"],
            "reports": AMP_EFFECT}
