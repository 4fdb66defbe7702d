"""The determinism report (`verify determinism`, checklist C1: is the original a usable reference?): the ops whose
results differ between two runs of one script, determinism.json (with checklist item C1 in the shape of migrate's
checklist.json) and what the terminal shows of them. Renders only; no torch.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verify.compare.runs import RANK_COLUMN, ComparisonResult
from verify.contract.checklist_items import TITLES, Status as ChecklistStatus
from verify.record.schema import shown

DIFFERING_OPS_SHOWN = 15


def differing_ops(result: ComparisonResult) -> pd.DataFrame:
    """The ops whose results differ between the two runs, in execution order (the first is the first divergent one);
    of several ranks, rank by rank."""
    ops = result.ops
    differing = ops.loc[(ops["passed"] == False)]  # noqa: E712 (nullable boolean: NA rows are unmatched)
    columns = [*([RANK_COLUMN] if RANK_COLUMN in ops.columns else []), "step", "phase", "module", "ref_op", "io",
               "ref_dtype", "ref_seq", "judged_by"]
    return differing[columns].rename(columns={"ref_op": "op", "ref_dtype": "dtype", "ref_seq": "seq"}).astype(
        {"phase": str, "module": str, "op": str, "io": str, "dtype": str, "judged_by": str}).reset_index(drop=True)


def determinism_record(result: ComparisonResult, differing: pd.DataFrame) -> dict[str, Any]:
    """determinism.json: the verdict, the loss difference, the differing ops, and checklist item C1 in the shape
    migrate's checklist.json uses (id, title, status, evidence, action)."""
    summary = result.summary()
    manifest = result.ref.manifest
    deterministic = result.verdict.passed
    evidence = [result.verdict.reason.replace("PASS: ", "").replace("FAIL: ", "")]
    evidence += [f"{_rank_words(row)}step {row.step} {row.phase} {row.module or 'top level'}: {row.op} {row.io}"
                 for row in differing.head(DIFFERING_OPS_SHOWN).itertuples()]
    action = "" if deterministic else (
        "Make the original constant before comparing a port with it: seed every generator, "
        "torch.use_deterministic_algorithms(True), cudnn.deterministic=True, and no dropout for the comparison "
        "(verify --no-dropout); start from the first operator listed.")
    return {
        "deterministic": deterministic,
        "script": manifest.script, "argv": manifest.argv, "seed": manifest.seed, "device": manifest.device,
        "dump": manifest.dump_mode, "steps": summary["loss"]["steps_compared"],
        "loss": summary["loss"],
        "first_divergent": summary["first_divergent"],
        "differing_ops": differing.to_dict("records"),
        "checklist": {"id": "C1", "title": TITLES["C1"],
                      "status": (ChecklistStatus.PASSED if deterministic else ChecklistStatus.FAILED).value,
                      "evidence": evidence, "action": action},
    }


def print_determinism(result: ComparisonResult, differing: pd.DataFrame, console: Console) -> None:
    """The verdict, the loss difference and the first differing ops, on the terminal."""
    deterministic = result.verdict.passed
    if result.ref.manifest.emulated:
        console.print(f"[bold black on yellow] {result.ref.manifest.title} [/]")
    verdict = "DETERMINISTIC" if deterministic else "NOT DETERMINISTIC"
    console.print(f"[bold {'green' if deterministic else 'red'}]{verdict}[/]: two runs of {result.ref.manifest.title}, "
                 f"seed {result.ref.manifest.seed}, {result.ref.manifest.dump_mode} dump")
    loss = result.loss
    console.print(f"loss: {loss.steps_compared} steps, max abs diff {loss.max_abs_diff:.6g}, max rel diff "
                 f"{loss.max_rel_diff:.3g}, first step that differs: "
                 f"{'none' if loss.first_step_past_tolerance is None else loss.first_step_past_tolerance}")
    if len(differing):
        table = Table(title=f"{len(differing)} op results differ; the first is where the randomness enters",
                      title_justify="left")
        for column in ("step", "phase", "module", "op", "io", "dtype"):
            table.add_column(column)
        for row in differing.head(DIFFERING_OPS_SHOWN).itertuples():
            table.add_row(str(row.step), row.phase, _rank_words(row) + (row.module or "(top level)"), row.op, row.io,
                          row.dtype)
        console.print(table)
    for note in result.notes:
        console.print(f"[dim]note: {escape(shown(note))}[/]")


def _rank_words(row: Any) -> str:
    """'rank 1: ' before a differing op of several ranks' runs."""
    return f"rank {getattr(row, RANK_COLUMN)}: " if hasattr(row, RANK_COLUMN) else ""
