"""A comparison made again from the runs its summary.json names (`verify report`), with the options it was made
with: the verdict is the runs', never the summary's; runs gone from beside the summary are read where it names them
absolutely, and the result says so (verify/record/provenance.py). No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verify.compare.precision_policy import CompareOptions
from verify.compare.runs import ComparisonResult, compare_runs
from verify.record import provenance
from verify.record.evidence import read_calibrations, read_side


def judged_again(summary_file: Path, summary: dict[str, Any]) -> ComparisonResult:
    """The comparison a summary reports, made again from the runs it names (verify/record/provenance.py) with its
    options: the verdict is the runs', never the summary's."""
    named = provenance.runs_named(summary_file, summary)
    ref = read_side(named.ref)
    options = CompareOptions.from_record(summary.get("options"), summary_file)
    result = compare_runs(ref, read_side(named.actual), options, read_calibrations(ref, named.calibrations))
    if named.read_elsewhere:  # a copy of a pair's folder is judged from the original's runs: its reports say whose
        result.notes.insert(0, f"judged from runs read in {', '.join(map(str, named.read_elsewhere))}: the summary "
                               "names them there, and they are gone from beside it")
    return result
