"""`verify determinism SCRIPT`: the same script twice with the same seed, and the operators whose results differ
(checklist C1: is the original a usable reference?). Writes determinism.json (with checklist item C1 for migrate)
beside the usual reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.markup import escape
from rich.table import Table

from verify.report import writers as reports
from verify.contract.checklist_items import TITLES, Status as ChecklistStatus
from verify.contract.files import DETERMINISM_JSON
from verify.compare.runs import RANK_COLUMN, ComparisonResult, compare_runs
from verify.compare.precision_policy import CompareOptions
from verify import devices
from verify.record import run_folders
import verify.cli.options as options  # `from verify.cli import` would import the package, which imports this module
from verify.cli.exits import exit_with
from verify.cli.options import Echo, echo_asked
from verify.launch.runner import RunOptions, check_options
from verify.cli.side_runs import RUN_ENDED_WELL, side_runner, stderr, stdout, write_reports
from verify.errors import PairError
from verify.record.schema import DumpMode, shown
from verify.errors import EXIT_FAILED, EXIT_OK

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


def determinism_record(result: ComparisonResult, differing: pd.DataFrame, deterministic: bool) -> dict[str, Any]:
    """determinism.json: the verdict, the loss difference, the differing ops, and checklist item C1 in the shape
    migrate's checklist.json uses (id, title, status, evidence, action)."""
    summary = result.summary()
    manifest = result.ref.manifest
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


def _rank_words(row: Any) -> str:
    """'rank 1: ' before a differing op of several ranks' runs."""
    return f"rank {getattr(row, RANK_COLUMN)}: " if hasattr(row, RANK_COLUMN) else ""


def print_determinism(result: ComparisonResult, differing: pd.DataFrame, deterministic: bool) -> None:
    if result.ref.manifest.emulated:
        stdout.print(f"[bold black on yellow] {result.ref.manifest.title} [/]")
    verdict = "DETERMINISTIC" if deterministic else "NOT DETERMINISTIC"
    stdout.print(f"[bold {'green' if deterministic else 'red'}]{verdict}[/]: two runs of {result.ref.manifest.title}, "
                 f"seed {result.ref.manifest.seed}, {result.ref.manifest.dump_mode} dump")
    loss = result.loss
    stdout.print(f"loss: {loss.steps_compared} steps, max abs diff {loss.max_abs_diff:.6g}, max rel diff "
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
        stdout.print(table)
    for note in result.notes:
        stdout.print(f"[dim]note: {escape(shown(note))}[/]")


def determinism(
    script: Annotated[Path, typer.Argument(help="The script to run twice, unmodified.", show_default=False)],
    script_args: options.script_args() = None,
    steps: options.steps("Optimizer steps per run.") = 5,
    seed: options.seed("The seed both runs get.") = 1234,
    device: options.device("As `verify run`.") = devices.Device.AUTO,
    dump: options.dump("md5: bit-exact per op; stats: equal within the dtype tolerances.") = DumpMode.MD5,
    no_dropout: options.no_dropout() = False,
    timeout: options.timeout("Kill a run after this many seconds.") = None,
    nproc_per_node: options.nproc_per_node(
        "Run the script as N ranks through torch.distributed.run, each rank compared with its twin; without it, as "
        "one process.") = None,
    emulated_devices: options.emulated_devices() = None,
    force: options.force() = False,
    out: options.out("Folder for the runs and the reports (default: verify-out/STEM-TIME-RANDOM beside SCRIPT).") = (
        None),
    quiet: options.quiet(options.QUIET_PAIRED) = False,
    verbose: options.verbose() = False,
) -> None:
    """Run SCRIPT twice with the same seed and list the operators whose results differ (checklist C1).

    Exit codes: 0 deterministic, 1 not deterministic, 2 error (also when a run did not end well: there is nothing
    to judge); 130/143/129 stopped by SIGINT/SIGTERM/SIGHUP. Writes determinism.json (with checklist item C1 for
    migrate) beside the usual reports.
    """
    options = RunOptions(steps=steps, seed=seed, device=device.value, dump=dump, no_dropout=no_dropout,
                         timeout=timeout, nproc_per_node=nproc_per_node or 0, devices=emulated_devices or 0,
                         force=force)
    out = out or run_folders.default_pair_dir(script)
    echo = echo_asked(quiet, verbose)
    exit_with(lambda: _determinism(script, list(script_args or []), options, out, echo),
              f"check whether {script} is deterministic", out)


def _determinism(script: Path, args: list[str], options: RunOptions, out: Path, echo: Echo) -> int:
    if not script.is_file():
        raise PairError(f"{script}: no such script")
    check_options(options)
    out = run_folders.claim(out)
    with side_runner(echo) as sides:
        first, second = (sides.run(f"run {n}", script, args, options, out / run_folders.determinism_run(n))
                         for n in (1, 2))
    for run in (first, second):
        if run.manifest.status not in RUN_ENDED_WELL:
            raise PairError(f"{run.root.name} ended '{run.manifest.status}': {run.manifest.message}")
    # Exact: the loss and the gradients of two runs of one script on one device must agree to the last bit.
    result = compare_runs(first, second, CompareOptions(loss_rtol=0.0))
    deterministic = result.verdict.passed
    differing = differing_ops(result)
    print_determinism(result, differing, deterministic)  # the verdict first, the report files after it
    write_reports(result, out, out, script.parent)
    reports.write_json(out / DETERMINISM_JSON, determinism_record(result, differing, deterministic))
    stderr.print(f"reports in {out}")
    return EXIT_OK if deterministic else EXIT_FAILED
