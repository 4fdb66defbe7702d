"""`verify determinism SCRIPT`: the same script twice with the same seed, and the operators whose results differ
(checklist C1: is the original a usable reference?). Writes determinism.json (with checklist item C1 for migrate)
beside the usual reports. The runs are verify/pair/determinism.py's, the report verify/report/determinism.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from verify import devices
from verify.record import run_folders
import verify.cli.options as options  # `from verify.cli import` would import the package, which imports this module
from verify.cli.exits import exit_with
from verify.cli.options import echo_asked
from verify.launch.runner import RunOptions
from verify.pair.determinism import run_twice, write_determinism_reports
from verify.pair.sides import Echo
from verify.record.schema import DumpMode
from verify.report.determinism import differing_ops, print_determinism
from verify.errors import EXIT_FAILED, EXIT_OK

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


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
    launcher: options.launcher() = None,
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
                         timeout=timeout, nproc_per_node=nproc_per_node or 0,
                         launcher=launcher.value if launcher else "", devices=emulated_devices or 0,
                         force=force)
    out = out or run_folders.default_pair_dir(script)
    echo = echo_asked(quiet, verbose)
    exit_with(lambda: _determinism(script, list(script_args or []), options, out, echo),
              f"check whether {script} is deterministic", out)


def _determinism(script: Path, args: list[str], options: RunOptions, out: Path, echo: Echo) -> int:
    result = run_twice(script, args, options, out, echo)
    differing = differing_ops(result)
    print_determinism(result, differing, stdout)  # the verdict first, the report files after it
    write_determinism_reports(result, differing, out, script)
    stderr.print(f"reports in {out}")
    return EXIT_OK if result.verdict.passed else EXIT_FAILED
