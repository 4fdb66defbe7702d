"""Running the sides of a paired command (verify ORIGINAL PORTED, verify determinism) one after the other under one
rich progress display, and writing a comparison's reports with what lies beside the scripts (migrate's checklist).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from verify.report import writers as reports
from verify.compare.runs import ComparisonResult
from verify.cli.compare_cmd import read_side
from verify import devices
from verify.launch.runner import RunOptions, run_script
from verify.record.store import Run
from verify.record.schema import Status
from verify.errors import PairError


stdout = Console(highlight=False, soft_wrap=True)


stderr = Console(stderr=True, highlight=False, soft_wrap=True)


RUN_ENDED_WELL = (Status.OK.value, Status.SHORT.value)  # a side that ran its steps, or ended by itself




class SideRunner:
    """Runs the sides one after the other under one rich progress display (stderr), echoing their output."""

    def __init__(self, progress: Progress, quiet: bool) -> None:
        self.progress = progress
        self.quiet = quiet

    def run(self, label: str, script: Path, args: list[str], options: RunOptions, run_dir: Path) -> Run:
        task = self.progress.add_task(f"{label}: {script.name}", total=options.steps)
        echo = None if self.quiet else (
            lambda line: self.progress.console.print(f"[{label}] {line}", markup=False, style="dim"))
        run_script(script, args, options, run_dir, on_output=echo,
                   on_progress=lambda done: self.progress.update(task, completed=done))
        run = read_side(run_dir)
        if run.manifest.verify_error:
            raise PairError(f"{label} run: {run.manifest.verify_error}")
        self.progress.update(task, description=f"{label}: {script.name} on {device_words(run)} "
                                               f"({run.manifest.status})")
        return run


@contextlib.contextmanager
def side_runner(quiet: bool) -> Iterator[SideRunner]:
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr) as progress:
        yield SideRunner(progress, quiet)


def device_words(run: Run) -> str:
    return devices.title(run.manifest.device, run.manifest.emulated_on)


def write_reports(result: ComparisonResult, out: Path, *checklist_places: Path,
                   summary: dict[str, Any] | None = None) -> None:
    """The reports `verify compare -o` writes, with migrate's checklist when one lies beside the scripts, and what
    only the pair knows in summary.json."""
    reports.write_reports(result, out, checklist=reports.find_checklist(*checklist_places), summary=summary)
