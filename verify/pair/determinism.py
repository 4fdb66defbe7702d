"""`verify determinism SCRIPT`'s runs: the same script twice with the same seed on one device, one after the other
(both start the same script in one folder, and a first run may download or prepare what the second reads), compared
exactly; their report is verify/report/determinism.py's, determinism.json beside the usual reports.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from verify.compare.precision_policy import CompareOptions
from verify.compare.runs import ComparisonResult, compare_runs
from verify.contract.files import DETERMINISM_JSON
from verify.errors import PairError
from verify.launch.runner import RunOptions, check_options
from verify.pair.judge import write_reports
from verify.pair.sides import RUN_ENDED_WELL, Echo, side_runner
from verify.record import run_folders
from verify.report import writers as reports
from verify.report.determinism import determinism_record


def run_twice(script: Path, args: list[str], options: RunOptions, out: Path, echo: Echo) -> ComparisonResult:
    """The two runs in the claimed folder `out`, compared: PairError (exit 2) where one did not end well, which leaves
    nothing to judge. Exact: the loss and the gradients of two runs of one script on one device must agree to the
    last bit."""
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
    return compare_runs(first, second, CompareOptions(loss_rtol=0.0))


def write_determinism_reports(result: ComparisonResult, differing: pd.DataFrame, out: Path, script: Path) -> None:
    """The reports `verify compare -o` writes (with migrate's checklist where it lies beside the script), and
    determinism.json."""
    write_reports(result, out, out, script.parent)
    reports.write_json(out / DETERMINISM_JSON, determinism_record(result, differing))
