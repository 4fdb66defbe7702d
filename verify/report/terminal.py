"""The terminal's reports (rich): a comparison's verdict and findings, one run, how `verify run` ended.

`verify compare` and `verify ORIGINAL PORTED` print the verdict before they write the report files, so that what a
person waits for comes first. No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verify import devices
from verify.report.advice import advise
from verify.compare.findings import unwritten_words
from verify.compare.runs import ComparisonResult
from verify.report.tables import (cell_text, diverging_rows, emulation_banners, loss_line, ops_line,
                                   other_ranks_line, shown_rank_ops)
from verify.record.schema import UNWRITTEN_KEY, RunManifest, Status, shown
from verify.record.store import Run

_DIVERGING_COLUMNS = ("step", "phase", "module", "ref_op", "io", "status", "stats_error", "tolerance")


def print_summary(result: ComparisonResult, console: Console, max_rows: int = 10) -> None:
    for banner in emulation_banners(result):
        console.print(f"[bold black on yellow] {banner} [/]")
    colour = "green" if result.verdict.passed else "red"
    console.print(f"[bold {colour}]{escape(shown(result.verdict.reason))}[/]")
    console.print(f"comparison: {result.policy.description}")
    console.print(f"ref:    {escape(shown(result.ref.manifest.title))} ({result.ref.source})")
    console.print(f"actual: {escape(shown(result.actual.manifest.title))} ({result.actual.source})")
    if loss := loss_line(result):
        console.print(f"loss: {loss}")
    console.print(f"ops: {ops_line(result)}")
    if ranks := other_ranks_line(result):
        console.print(f"ranks: {ranks}")
    if result.first_divergent:
        console.print(_divergence_table(result.first_divergent))
    rows = diverging_rows(shown_rank_ops(result), max_rows)
    if len(rows):
        table = Table(title="ops past tolerance or unmatched", title_justify="left")
        for column in _DIVERGING_COLUMNS:
            table.add_column(column)
        for row in rows.itertuples(index=False):
            table.add_row(*(cell_text(getattr(row, c)) for c in _DIVERGING_COLUMNS))
        console.print(table)
    for finding in result.findings:
        console.print(f"- {escape(shown(finding.message))}")
    for n, item in enumerate(advise(result.findings, result.op_catalogue), 1):
        console.print(f"[bold]{n}.[/] {escape(shown(item.message))}")
    for note in result.notes:
        console.print(f"[dim]note: {escape(shown(note))}[/]")


def _divergence_table(first: dict[str, Any]) -> Table:
    table = Table(title=f"first divergent operator: {first['op']} ({first['module'] or 'top level'}, "
                        f"{first['phase']}, step {first['step']}, {first['io']})", title_justify="left")
    table.add_column("")
    for stat in first["ref"]:
        table.add_column(stat)
    for side in ("ref", "actual"):
        table.add_row(side, *(cell_text(value) for value in first[side].values()))
    return table


def print_run(run: Run, console: Console) -> None:
    manifest = run.manifest
    if manifest.emulated:
        console.print(f"[bold black on yellow] {escape(shown(manifest.title))} [/]")
    console.print(f"[bold]{escape(shown(manifest.title))}[/] ({run.source})")
    console.print(f"status {escape(shown(manifest.status))}, {manifest.steps_completed}/{manifest.steps_requested} "
                  f"steps, dump {escape(shown(manifest.dump_mode))}, {len(run.ops)} op records"
                  + (f": {escape(shown(manifest.message))}" if manifest.message else ""))
    if len(run.losses):
        table = Table("step", "micro_step", "loss", "loss_scale")
        for row in run.losses.itertuples(index=False):
            table.add_row(str(row.step), str(row.micro_step), cell_text(row.loss), cell_text(row.loss_scale))
        console.print(table)
    for note in run.notes:
        console.print(f"[dim]note: {escape(shown(note))}[/]")


_RUN_STYLES = {Status.OK.value: "bold green", Status.SHORT.value: "bold yellow"}


def print_run_ended(manifest: RunManifest, run_dir: Path, final_loss: str, console: Console) -> None:
    """How `verify run` ended: an emulated device named as the test double it is, the status, steps, final loss,
    device and run directory, and the traceback of what the script raised."""
    if manifest.emulated:
        console.print(f"[bold black on yellow] {devices.title(manifest.device, manifest.emulated_on)} [/] a test "
                      "double, not the device itself")
    table = Table.grid(padding=(0, 2))
    style = _RUN_STYLES.get(manifest.status, "bold red")
    table.add_row("status", f"[{style}]{escape(shown(manifest.status))}[/]  {escape(shown(manifest.message))}")
    table.add_row("steps", f"{manifest.steps_completed} / {manifest.steps_requested}")
    table.add_row("final loss", final_loss)
    table.add_row("device", (f"{manifest.device} ({manifest.device_name})" if manifest.device_name else manifest.device)
                  + manifest.ranks_words)
    table.add_row("run dir", str(run_dir))
    if unwritten := manifest.extra.get(UNWRITTEN_KEY):  # trained from whatever the memory held
        table.add_row("[bold yellow]warning[/]", escape(unwritten_words(unwritten)))
    console.print(table)
    if manifest.traceback:
        console.print(shown(manifest.traceback.rstrip(), tail=True), markup=False, highlight=False, style="red")
