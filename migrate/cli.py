"""`migrate`: port GPU training scripts to Ascend NPUs.

Exit codes: 0 done or nothing to do; 1 changes pending (--check, --diff); 2 usage, parse or internal error, or a
port changed since migrate wrote it (named with its lines; nothing is written: --force keeps it as NAME.bak and ports).
Diffs go to stdout; the summary, progress and errors go to stderr, errors first. Where a stream is not a terminal
(a pipe, a file), tables become plain lines, one record each, never cut to a width.
"""

from __future__ import annotations

import inspect
import os
import shlex
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from migrate import __version__, checklist, collector, ownership
from migrate.files import Job, PlanError, plan, run_jobs, shown_path
from migrate.project import Project
from migrate.report import REPORT_FILES, Summary, finding_text, write_reports
from migrate.types import FileResult, FileStatus
from rules import Action, AmpPolicy, Mode, RuleError, Settings, Severity, all_rules, rule_by_code, select_rules
from verify.contract.files import FIX_MD, PORT_SUFFIX, WRITTEN_JSON, port_name, report_folder

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)  # one error, one line: grep-able

app = typer.Typer(
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    help=__doc__,
)


class ExitCode(IntEnum):
    OK = 0
    PENDING = 1
    ERROR = 2


def _version(value: bool) -> None:
    if value:
        stdout.print(f"npu-port migrate {__version__}")
        raise typer.Exit()


def _codes(value: Optional[str]) -> list[str]:
    return [code for code in (value or "").replace(" ", ",").split(",") if code]


@app.command()
def migrate(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Python files or folders to port.")] = None,
    out: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="Output file or folder (default: NAME_npu beside it).")
    ] = None,
    in_place: Annotated[bool, typer.Option("--in-place", help="Overwrite the originals.")] = False,
    mode: Annotated[Mode, typer.Option(help="transfer: runtime patching; explicit: rewrite every cuda API.")] = (
        Mode.TRANSFER
    ),
    diff: Annotated[bool, typer.Option("--diff", help="Print the diff, write nothing; exit 1 if a port is needed.")] = (
        False
    ),
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if a port is needed.")] = False,
    select: Annotated[Optional[str], typer.Option(help="Only these rule codes or prefixes (comma-separated).")] = None,
    ignore: Annotated[Optional[str], typer.Option(help="Skip these rule codes or prefixes.")] = None,
    unsafe_fixes: Annotated[bool, typer.Option("--unsafe-fixes", help="Also apply unsafe rewrites.")] = False,
    amp: Annotated[AmpPolicy, typer.Option(help="Mixed precision to add to fp32 training.")] = AmpPolicy.FP16,
    seed: Annotated[Optional[int], typer.Option(help="Seed to fix at the start of the entry point.")] = None,
    deterministic: Annotated[bool, typer.Option(help="Also switch on deterministic algorithms.")] = False,
    suffix: Annotated[str, typer.Option(
        help="What the port's name adds to the original's (train.py -> train_npu.py, src/ -> src_npu/).")] = (
        PORT_SUFFIX
    ),
    report_dir: Annotated[
        Optional[Path], typer.Option(help="Where the reports go (default: OUTPUT_report beside the output).")
    ] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace ports changed since migrate wrote them, each kept first as NAME.bak.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=0, help="Worker processes (0: one per core).")] = 1,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print errors only.")] = False,
    fix_from: Annotated[Optional[Path], typer.Option(
        "--fix-from", metavar="PAIR", help="Fix PORT from what the verify pair in folder PAIR measured: write "
        "PORT_fixed.py, verify it again, repeat while a round fixes something; a precision FAIL climbs a ladder of "
        "fixes, each verified before the next (fix.md names each rung).")] = None,
    fix_rounds: Annotated[int, typer.Option(
        "--fix-rounds", min=0, max=10, help="With --fix-from: at most this many fix-and-verify rounds (0: fix once, "
        "verify nothing).")] = 6,
    no_bf16: Annotated[bool, typer.Option(
        "--no-bf16", help="With --fix-from: the target NPU computes no bf16 (the Atlas training series, 910A): the "
        "fix's ladder climbs past its bf16 rung.")] = False,
    list_rules: Annotated[bool, typer.Option("--list-rules", help="List every rule and exit.")] = False,
    explain: Annotated[Optional[str], typer.Option(help="Print one rule's manual and exit.", metavar="CODE")] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Port PATHS to the NPU; write NAME_npu.py (or FOLDER_npu/) and a report beside it."""
    try:
        if list_rules:
            return _list_rules()
        if explain:
            return _explain(explain)
        if not paths:
            raise PlanError("give at least one file or folder to port (or --list-rules, --explain CODE)")
        if fix_from is not None:
            return _fix(paths, fix_from, fix_rounds, quiet, bf16=not no_bf16)
        if not suffix or any(separator in suffix for separator in ("/", os.sep)) or suffix.strip(".") == "":
            raise PlanError(f"--suffix {suffix!r}: give a name part such as _npu (no path separator)")
        rules = select_rules(_codes(select), _codes(ignore))
        settings = Settings(mode=mode, unsafe_fixes=unsafe_fixes, amp=amp, seed=seed, deterministic=deterministic)
        writes = not (diff or check)
        if writes and out is None and not in_place:
            ownership.refuse_ports(paths, suffix, report_dir)
        # The report folder of several files is the first's: its report.md names the others' earlier ports.
        directory = report_dir or _default_report_dir(paths[0], out, in_place, suffix)
        left_out: list[str] = []
        planned = plan(paths, settings, out=out, in_place=in_place, write=writes, suffix=suffix,
                       report_dir=directory, left_out=left_out)
        project = Project.read(paths, planned)
        planned = project.settle(planned)
        planned, kept = _guard_edits(planned, rules, directory, force, quiet)
    except (PlanError, RuleError) as error:
        for line in str(error).splitlines():  # one error, one line
            stderr.print(f"[red]error:[/] {escape(line)}")
        raise typer.Exit(ExitCode.ERROR) from None
    for line in left_out if not quiet else ():
        stderr.print(f"[yellow]left out:[/] {escape(line)}")
    results = _run(planned, rules, jobs or os.cpu_count() or 1, quiet)
    for result in results:  # first: what follows (diffs, checklist, summary) is about the files that were read
        if result.error:
            stderr.print(f"[red]error:[/] {escape(result.error)}")
    if diff:
        for result in results:
            stdout.out(result.diff, end="")
    report = None
    # A run that read no file has nothing to report on: no report folder, no checklist.
    if writes and any(result.status is not FileStatus.ERROR for result in results):
        original, ported = _first_port(results, project)
        items = checklist.build(results, settings, rules, _verify_command(original, ported), original, project)
        try:
            title = f"npu-port migrate report ({mode.value} mode)"
            reports = write_reports(results, directory, title, items, kept)
            ownership.write_record(directory, planned, results, reports, kept.get(directory / WRITTEN_JSON))
            report = next(iter(reports))
        except OSError as error:
            where = shown_path(error.filename or directory)
            stderr.print(f"[red]error:[/] cannot write the report: {escape(where)}: {error.strerror}")
            raise typer.Exit(ExitCode.ERROR) from None
        if not quiet:
            _print_checklist(items)
    raise typer.Exit(_exit_code(results, writes, quiet, report))


def _fix(paths: list[Path], pair: Path, rounds: int, quiet: bool, bf16: bool) -> None:
    """--fix-from (migrate/fix.py): exit 0 when the fixed port passed its last round, 1 when it did not."""
    from migrate import fix

    if len(paths) != 1 or not paths[0].is_file():
        raise PlanError("--fix-from PAIR fixes one port: give its file (migrate train_npu.py --fix-from PAIR)")
    passed, folder = fix.run(paths[0], pair, rounds, lambda line: None if quiet else stderr.print(escape(line)),
                             bf16=bf16)
    outcome = ("written, not verified" if rounds == 0 else "PASS") if passed else "not fixed"
    stderr.print(f"{outcome}: report in {escape(shown_path(folder / FIX_MD))}")
    raise typer.Exit(ExitCode.OK if passed else ExitCode.PENDING)


def _guard_edits(planned: list[Job], rules, directory: Path, force: bool,
                 quiet: bool) -> tuple[list[Job], dict[Path, Path]]:
    """PlanError naming every port changed since migrate wrote it and every file of the report folder it did not
    write; under --force, the jobs that keep each port first, and where each report folder file is kept."""
    edits = ownership.edits(planned, rules, directory)
    if any(job.write for job in planned):
        edits += ownership.report_edits(directory, REPORT_FILES)
    if edits and not force:
        raise PlanError("\n".join(edit.refusal() for edit in edits))
    for edit in edits if not quiet else ():
        why = "changed since migrate wrote it" if edit.recorded or not edit.report else "not written by migrate"
        stderr.print(f"--force: {escape(shown_path(edit.target))} {why}; kept as {escape(shown_path(edit.backup))}")
    return ownership.keeping_backups(planned, edits), ownership.backups_of(edits)


def _run(planned, rules, workers: int, quiet: bool) -> list[FileResult]:
    collector.startup_done()
    if quiet or len(planned) < 20:
        return run_jobs(planned, rules, workers)
    with Progress(console=stderr, transient=True) as progress:
        task = progress.add_task("Porting", total=len(planned))
        return run_jobs(planned, rules, workers, on_result=lambda _: progress.advance(task))


def _default_report_dir(first: Path, out: Optional[Path], in_place: bool, suffix: str) -> Path:
    base = first if in_place else (out or (port_name(first, suffix) if first.is_file() else None))
    if base is None:
        resolved = first.resolve()
        base = resolved.with_name(f"{resolved.name}{suffix}")  # a folder: its whole name, dots included
    return report_folder(base)


def _exit_code(results: list[FileResult], writes: bool, quiet: bool, report: Optional[Path]) -> int:
    summary = Summary.of(results)
    if not quiet:
        _print_findings(results)
        stderr.print(_summary_line(summary, writes))
        if report is not None:
            stderr.print(f"Report: {escape(shown_path(report))}")
    if summary.errors:
        return ExitCode.ERROR
    return ExitCode.PENDING if not writes and summary.changed else ExitCode.OK


def _print_findings(results: list[FileResult]) -> None:
    for result in results:
        if result.inference:
            stderr.print(f"{escape(result.source)}: {checklist.INFERENCE_NOTE}", style="dim")
        for finding in result.findings:
            if finding.action is not Action.CHANGED and finding.severity is not Severity.INFO:
                colour = "red" if finding.severity is Severity.ERROR else "yellow"
                stderr.print(f"[{colour}]{escape(finding_text(finding))}[/]")
                if finding.suggestion:
                    stderr.print(f"    {escape(finding.suggestion)}", style="dim")


_SEVERITY_COLOURS = {Severity.ERROR.value: "red", Severity.WARNING.value: "yellow", Severity.INFO.value: "cyan"}


def _summary_line(summary: Summary, writes: bool) -> str:
    """One line: `npu-port: 3 files: 1 ported, 1 unchanged, 1 error | findings: 2 errors, 5 warnings, 9 info`."""
    files = [f"{summary.changed} {'ported' if writes else 'would be ported'}", f"{summary.unchanged} unchanged"]
    if summary.errors:
        files.append(f"[red]{_plural(summary.errors, 'error')}[/]")
    if summary.skipped:
        files.append(f"{summary.skipped} copied")
    findings = [
        f"[{_SEVERITY_COLOURS[severity]}]{count} {severity if count == 1 or severity == 'info' else severity + 's'}[/]"
        for severity, count in reversed(summary.by_severity.items())
        if count
    ]
    line = f"[bold]npu-port:[/] {_plural(summary.files, 'file')}: {', '.join(files)}"
    line += f" | findings: {', '.join(findings) or 'none'}"
    if summary.pending:
        line += f" | {_plural(summary.pending, 'unsafe fix', 'unsafe fixes')} held back (--unsafe-fixes)"
    return line


def _plural(count: int, word: str, words: str = "") -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


def _first_port(results: list[FileResult], project: Project) -> tuple[str, str]:
    """The original and ported paths of the first ported script, an entry point of the project where the files
    named are one, which the checklist's commands name (placeholders when nothing was ported)."""
    ported_files = [r for r in results if r.facts is not None and r.target]
    entries = [r for r in ported_files if project.is_entry(r.source)]
    ported = next(iter(entries or ported_files), None)
    return (ported.source, ported.target) if ported else ("ORIGINAL", "PORTED")


def _verify_command(original: str, ported: str) -> str:
    # Quoted: the command is meant to be pasted into a shell, and paths may hold spaces.
    return f"verify {shlex.quote(original)} {shlex.quote(ported)} -- ARGS"


def _print_checklist(items: list[checklist.Item]) -> None:
    """One line per item with its first piece of evidence: cut to the width of a terminal, whole in a pipe."""
    colours = {checklist.Status.PASSED: "green", checklist.Status.FAILED: "red", checklist.Status.NOT_CHECKED: "yellow"}
    rows = []
    for item in items:
        evidence = item.evidence[0] if item.evidence else item.action
        more = f" (+{len(item.evidence) - 1} more)" if len(item.evidence) > 1 else ""
        rows.append((item.id, item.status.value.lower(), f"{item.title}: {evidence}{more}"))
    if not stderr.is_terminal:
        stderr.out("Accuracy checklist", highlight=False)
        _print_plain(stderr, rows)
        return
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True, min_width=2)
    grid.add_column(no_wrap=True, min_width=11)
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for (item_id, status, text), item in zip(rows, items):
        grid.add_row(item_id, f"[{colours[item.status]}]{status}[/]", escape(text))
    stderr.print("[bold]Accuracy checklist[/]")
    stderr.print(grid)


def _list_rules() -> None:
    columns = ("code", "name", "safety", "modes", "checklist", "summary")
    rows = [
        (
            rule.CODE,
            rule.name(),
            rule.SAFETY.value,
            ",".join(sorted(mode.value for mode in rule.MODES)),
            " ".join(rule.CHECKLIST) or "-",
            rule.summary(),
        )
        for rule in all_rules()
    ]
    if not stdout.is_terminal:  # one rule a line, whole, for grep, cut and less (as ruff does)
        return _print_plain(stdout, rows)
    table = Table(title="npu-port rules")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*map(escape, row))
    stdout.print(table)


def _print_plain(console: Console, rows: list[tuple[str, ...]]) -> None:
    """Rows as lines, every column but the last padded to its widest value; nothing is cut, nothing is markup."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)] if rows else []
    for row in rows:
        console.out(" ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]), highlight=False)


def _explain(code: str) -> None:
    rule = rule_by_code(code)
    # Printed as is: a manual's `[i]` or `[CODE]` is text, not rich markup, and a pipe gets every line whole.
    stdout.out(f"# {rule.name()} ({rule.CODE}) - {rule.SAFETY.value}", highlight=False)
    stdout.out(inspect.cleandoc(rule.__doc__ or ""), highlight=False)


def main() -> None:
    app()


__all__ = ["ExitCode", "app", "main"]
