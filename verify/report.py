"""The report files of a comparison, written by `verify compare -o` and `verify ORIGINAL PORTED`: summary.json,
ops.csv, ops.xlsx (verify/report_xlsx.py), advice.txt, report.html (verify/report_html.py), losses.csv. The terminal's
reports are verify/report_terminal.py's; the tables they share, verify/report_tables.py's.

Renders only: every number comes from compare.py. No torch.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from verify.advice import Advice, advise
from verify.checklist_items import CHECKLIST_JSON  # written by `migrate` (id, title, status, evidence, action)
from verify.compare import ComparisonResult
from verify.report_html import render_html
from verify.report_tables import op_report_frame
from verify.report_xlsx import write_xlsx

SUMMARY_JSON = "summary.json"


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


def write_reports(result: ComparisonResult, out: Path, checklist: list[dict[str, Any]] | None = None,
                  summary: dict[str, Any] | None = None) -> list[Path]:
    """Every report of a comparison; `summary`: sections only the caller knows (the pair's), in summary.json."""
    out.mkdir(parents=True, exist_ok=True)
    advice = advise(result.findings)
    frame = op_report_frame(result)
    summary = result.summary() | {"advice": [item.message for item in advice]} | (summary or {})
    paths = {name: out / name for name in
             (SUMMARY_JSON, "ops.csv", "ops.xlsx", "advice.txt", "report.html", "losses.csv")}
    write_json(paths[SUMMARY_JSON], summary)
    frame.to_csv(paths["ops.csv"], index=False)
    write_xlsx(frame, paths["ops.xlsx"])
    paths["advice.txt"].write_text(advice_text(result, advice), encoding="utf-8")
    result.loss.frame.to_csv(paths["losses.csv"], index=False)
    paths["report.html"].write_text(render_html(result, advice, checklist), encoding="utf-8")
    return list(paths.values())
