"""The offline commands of `verify`: compare, report, export. Plain functions, registered by verify/cli/:

    app.command("compare")(compare_cli.compare)
    app.command("report")(compare_cli.report)
    app.command("export")(compare_cli.export)

Exit codes: 0 PASS, 1 FAIL, 2 the inputs could not be read or compared, or verify's own error (verify/errors.py).
None of this imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from verify.record import msprobe
from verify.record.evidence import read_calibrations, read_run_directory, read_side
from verify.report import writers as reports
from verify.record import run_folders
from verify.report.adaptation import adaptation_or_why_not, write_adaptation
from verify.compare.again import judged_again
from verify.compare.runs import ComparisonResult, compare_runs
from verify.compare.op_catalogue import read_catalogue
from verify.contract.files import SUMMARY_JSON
from verify.compare.precision_policy import CompareOptions
from verify.report.terminal import print_run, print_summary
import verify.cli.options as options  # `from verify.cli import` would import the package, which imports this module
from verify.cli.options import command_line
from verify.cli.exits import exit_with
from verify.errors import EXIT_OK, VerifyFailure

# The commands whose output folder holds only what they write there, which they may write again
# (run_folders.claim's rewriter).
COMPARE, EXPORT = "verify compare", "verify export"

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# Shared by `verify compare` and the pair command.
OpMappingOption = Annotated[Optional[list[Path]], typer.Option(
    "--op-mapping", help="A JSON file mapping the port's kernels (an NPU fused kernel) to the reference's ops they "
                         "compute, so that they pair; repeatable. Format: verify/compare/op_catalogue.py.",
    metavar="FILE", show_default=False)]


def compare_options(loss_rtol: float | None, op_mapping: list[Path] | None) -> CompareOptions:
    """The comparison's options from the command line; VerifyFailure (exit 2) naming a bad mapping file."""
    return CompareOptions(loss_rtol=loss_rtol, op_catalogue=read_catalogue(op_mapping))


def compare(
    context: typer.Context,
    ref_run: Annotated[Path, typer.Argument(help="The reference run directory (or msprobe dump).")],
    actual_run: Annotated[Path, typer.Argument(help="The ported run directory (or msprobe dump).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the reports here.")] = None,
    loss_rtol: options.loss_rtol("Relative loss tolerance per step (default 0.01; 0.05 for an fp32-vs-AMP pair).") = (
        None),
    max_rows: options.max_rows("Divergent op rows shown on the terminal.") = 10,
    adaptation_report: Annotated[bool, typer.Option(
        "--adaptation-report", help="Also write adaptation.md into OUT (needs -o).")] = False,
    op_mapping: OpMappingOption = None,
) -> None:
    """Compare two runs offline: verdict, first divergent operator, advice. Exit 0 PASS, 1 FAIL, 2 error."""
    command = tuple(command_line(context))
    exit_with(lambda: _compare(ref_run, actual_run, out, compare_options(loss_rtol, op_mapping), max_rows,
                               adaptation_report, command),
              f"compare {ref_run} with {actual_run}", out)


def _compare(ref_run: Path, actual_run: Path, out: Path | None, options: CompareOptions, max_rows: int,
             adaptation_report: bool, command: tuple[str, ...]) -> int:
    if adaptation_report and out is None:
        raise VerifyFailure("--adaptation-report writes adaptation.md into the -o folder: give one")
    if out is not None:
        run_folders.claim(out, rewriter=COMPARE)
    try:
        with adaptation_or_why_not(adaptation_report):
            ref = read_side(ref_run)
            result = compare_runs(ref, read_side(actual_run), options, read_calibrations(ref))
        print_summary(result, stdout, max_rows=max_rows)  # the verdict first: the report files take their time after
        if out is not None:
            _write_reports(result, out, adaptation_report, command, ref_run, actual_run)
    finally:
        if out is not None:
            run_folders.release(out)
    return result.verdict.exit_code


def _write_reports(result: ComparisonResult, out: Path, adaptation_report: bool, command: tuple[str, ...],
                   *checklist_places: Path) -> None:
    """compare's reports in `out`, recorded as its own output (run_folders.record_written: written again next time)."""
    if adaptation_report:
        stderr.print(f"wrote {write_adaptation(result, out, list(command), str(Path.cwd()))}")
    for path in reports.write_reports(result, out, checklist=reports.find_checklist(*checklist_places, out)):
        stderr.print(f"wrote {path}")
    run_folders.record_written(out, COMPARE)


def report(
    context: typer.Context,
    run_or_result: Annotated[Path, typer.Argument(help="A run directory, or a folder written by `compare -o` or a "
                                                       "pair.")],
    adaptation_report: Annotated[bool, typer.Option(
        "--adaptation-report", help="Write adaptation.md into a pair's folder (its ref/ and actual/ compared).")] = (
        False),
) -> None:
    """Print a run's manifest and loss curve, or judge a comparison again from the runs its summary.json names."""
    command = tuple(command_line(context))
    exit_with(lambda: _report(run_or_result, adaptation_report, command), f"report on {run_or_result}")


def _report(run_or_result: Path, adaptation_report: bool, command: tuple[str, ...]) -> int:
    summary_file = run_or_result / SUMMARY_JSON
    if not summary_file.is_file():
        if adaptation_report:
            return _adaptation_of_pair(run_or_result, command)
        print_run(read_side(run_or_result), stdout)
        return EXIT_OK
    summary = _read_json(summary_file)
    if not isinstance(summary, dict):
        raise VerifyFailure(f"{summary_file} is not a comparison's summary: it holds a JSON {type(summary).__name__}, "
                            "not the object `verify compare -o` writes")
    with adaptation_or_why_not(adaptation_report):
        result = judged_again(summary_file, summary)
    print_summary(result, stdout)
    if adaptation_report:  # the pair's own command: the report says the same
        made_by = {"command": list(command), "ran_in": str(Path.cwd())}
        pair = summary.get("pair")
        made_by |= {key: value for key, value in pair.items() if key in made_by} if isinstance(pair, dict) else {}
        stderr.print(f"wrote {write_adaptation(result, run_or_result, **made_by)}")
    return result.verdict.exit_code


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise VerifyFailure(f"{path} is not valid JSON: {error}") from None


def _adaptation_of_pair(folder: Path, command: tuple[str, ...]) -> int:
    """adaptation.md for a pair's folder that holds no summary (a pair stopped before its reports), from its two runs
    compared again."""
    sides = [folder / run_folders.REF, folder / run_folders.ACTUAL]
    if not all(side.is_dir() for side in sides):
        raise VerifyFailure(f"{folder} is not a pair's folder: --adaptation-report needs its {run_folders.REF}/ and "
                            f"{run_folders.ACTUAL}/ run directories")
    with adaptation_or_why_not(True):
        ref = read_side(sides[0])
        result = compare_runs(ref, read_side(sides[1]), calibrations=read_calibrations(ref))
    stderr.print(f"wrote {write_adaptation(result, folder, list(command), str(Path.cwd()))}")
    return result.verdict.exit_code


def export(
    run: Annotated[Path, typer.Argument(help="A verify run directory.")],
    out: Annotated[Path, typer.Argument(help="Folder for the msprobe dump (step*/proc0/dump.json ...).")],
    msprobe_format: Annotated[bool, typer.Option("--msprobe", help="Write msprobe's dump layout (required).")] = False,
    layout: Annotated[msprobe.Layout, typer.Option(help="proc: msprobe 26.x; rank: msprobe 8.x.")] = (
        msprobe.Layout.PROC),
) -> None:
    """Export a run's operator records as an msprobe dump that `msprobe compare` accepts."""
    exit_with(lambda: _export(run, out, msprobe_format, layout), f"export {run} to {out}", out)


def _export(run: Path, out: Path, msprobe_format: bool, layout: msprobe.Layout) -> int:
    if not msprobe_format:
        raise VerifyFailure("name the format to export: --msprobe (the only one so far)")
    run_folders.claim(out, rewriter=EXPORT)
    try:
        written = msprobe.write_dump(read_run_directory(run), out, layout)
        run_folders.record_written(out, EXPORT)
    finally:
        run_folders.release(out)
    stderr.print(f"wrote {len(written)} msprobe step folder(s) under {out}")
    return EXIT_OK
