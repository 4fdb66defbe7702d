"""The report files of a comparison, written by `verify compare -o` and `verify ORIGINAL PORTED`: summary.json,
advice.txt, report.html (verify/report/html.py), ops.xlsx (verify/report/xlsx.py, what a person reads in a
spreadsheet), ops.csv and ops.parquet (the full op table, every row and column), losses.csv. The terminal's reports are
verify/report/terminal.py's; the tables they share, verify/report/tables.py's.

Renders only: every number comes from compare.py. No torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet

from verify.report.advice import Advice, advise
from verify.contract.checklist_items import Status as ChecklistStatus
from verify.contract.files import (ADVICE_TXT, CHECKLIST_JSON, LOSSES_CSV, OPS_CSV, OPS_PARQUET, OPS_XLSX, REPORT_HTML,
                                   SUMMARY_JSON)
from verify.compare.runs import ComparisonResult
from verify.record import provenance
from verify.report.html import render_html
from verify.report.tables import op_report_frame
from verify.report.xlsx import write_xlsx


def find_checklist(*places: Path | None) -> list[dict[str, Any]] | None:
    """migrate's checklist.json next to (in, or beside) a run or report folder, first found wins."""
    for place in places:
        if place is None:
            continue
        for folder in (place, place.parent):
            candidate = folder / CHECKLIST_JSON
            try:
                items = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(items, list):
                return [item for item in items if isinstance(item, dict)]
    return None


def advice_text(result: ComparisonResult, advice: Sequence[Advice]) -> str:
    lines = [result.verdict.reason, f"Comparison: {result.policy.description}", ""]
    lines += [f"- {finding.message}" for finding in result.findings]
    lines += ["", "What to do:"] if advice else ["", "Nothing to do."]
    lines += [f"{n}. {item.message}" + (f" [checklist {', '.join(item.checklist)}]" if item.checklist else "")
              for n, item in enumerate(advice, 1)]
    return "\n".join(lines) + "\n"


def json_data(value: Any) -> Any:
    """Plain JSON data: numpy and pandas scalars as Python numbers and bools, NaN, inf and NA as null, sequences and
    arrays as lists, enums and paths as their text. Every JSON file verify writes goes through it (write_json)."""
    if isinstance(value, dict):
        return {str(key): json_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray, pd.Series, pd.Index)):
        return [json_data(item) for item in value]
    if isinstance(value, Enum):
        return json_data(value.value)
    if isinstance(value, np.generic):
        value = value.item()  # numpy bool, int, float, str -> Python's
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if pd.isna(value):  # pd.NA, NaT
        return None
    return str(value)  # a path, a timestamp: their text rather than a report lost to a TypeError


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(json_data(data), indent=1, allow_nan=False), encoding="utf-8")


def report_writers(result: ComparisonResult, checklist: list[dict[str, Any]] | None = None,
                   summary: dict[str, Any] | None = None) -> dict[str, Callable[[Path], None]]:
    """Each report file of a comparison -> what writes it; `summary`: sections only the caller knows (the pair's), in
    summary.json. What several share (the advice, the full op table) is made here, once."""
    advice = advise(result.findings, result.op_catalogue)
    checklist = with_run_time_sharding(checklist, result)
    summary = result.summary() | {"advice": [item.message for item in advice]} | (summary or {})
    # pyarrow writes both files of the full table several times faster than pandas' own writers: to_csv formats
    # every float in Python, about 1 s for 60,000 rows of ~60 columns (tests/perf/bench_compare.py).
    full_table = pa.Table.from_pandas(op_report_frame(result), preserve_index=False)
    return {
        SUMMARY_JSON: lambda path: write_json(path, summary | judged_from(result, path.parent)),
        ADVICE_TXT: lambda path: path.write_text(advice_text(result, advice), encoding="utf-8"),
        REPORT_HTML: lambda path: path.write_text(render_html(result, advice, checklist), encoding="utf-8"),
        OPS_XLSX: lambda path: write_xlsx(result, advice, path),
        OPS_CSV: lambda path: write_csv(full_table, path),
        OPS_PARQUET: lambda path: write_parquet(full_table, path),
        LOSSES_CSV: lambda path: result.loss.frame.to_csv(path, index=False),
    }


def judged_from(result: ComparisonResult, folder: Path) -> dict[str, Any]:
    """summary.json's `runs` and `options`: what `verify report` judges again from, in `folder`
    (verify/record/provenance.py)."""
    return {"runs": provenance.named_runs(result.ref, result.actual, result.calibrations, folder),
            "options": result.options.to_record()}


# The checklist items whose run-time evidence is the data each rank read (verify/compare/sharding.py).
SHARDING_ITEMS = ("C6", "C7")


def with_run_time_sharding(checklist: list[dict[str, Any]] | None,
                           result: ComparisonResult) -> list[dict[str, Any]] | None:
    """migrate's checklist with C6 and C7 judged on what the ranks read at run time, where verify checked it: Passed
    or Failed, the sharding evidence first among the item's evidence."""
    sharding = result.ranks.get("sharding", {})
    if not checklist or not sharding.get("checked"):
        return checklist
    status = ChecklistStatus.PASSED if sharding["passed"] else ChecklistStatus.FAILED
    return [item | {"status": status.value, "evidence": [f"verify (run time): {sharding['message']}",
                                                         *item.get("evidence", [])]}
            if item.get("id") in SHARDING_ITEMS else item for item in checklist]


def write_csv(table: pa.Table, path: Path) -> None:
    """ops.csv: pyarrow quotes every text cell, and its header too; the header stays plain column names, as awk, cut
    and `head -1` read them (ours need no quotes)."""
    with path.open("wb") as sink:
        sink.write((",".join(table.column_names) + "\n").encode())
        pyarrow.csv.write_csv(table, sink, pyarrow.csv.WriteOptions(include_header=False))


def write_parquet(table: pa.Table, path: Path) -> None:
    """ops.parquet: dictionaries for the text and integer columns only (a statistic rarely repeats, and encoding the
    floats as dictionaries is most of the default writer's time); zstd, smaller and faster than the default snappy."""
    repeating = [column.name for column in table.schema if not pa.types.is_floating(column.type)]
    pyarrow.parquet.write_table(table, path, use_dictionary=repeating, compression="zstd")


def write_reports(result: ComparisonResult, out: Path, checklist: list[dict[str, Any]] | None = None,
                  summary: dict[str, Any] | None = None) -> list[Path]:
    """Every report file of a comparison (report_writers), in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    writers = report_writers(result, checklist, summary)
    for name, write in writers.items():
        write(out / name)
    return [out / name for name in writers]
