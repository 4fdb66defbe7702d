"""ops.xlsx: what a person reads of a comparison in a spreadsheet, styled. Sheets: the summary (verdict, comparison,
runs, loss, operators, first divergent operator, where the full table is, findings, advice, notes), the rows past
tolerance, the unmatched rows, the worst rows against their tolerance, and per-module totals.

The full op table is not here: ops.csv and ops.parquet hold every row and column (report.py). A sheet is cut at
SHEET_ROWS rows and says under its last row how many it left out and where they are; the summary sheet says it too.
Rows are coloured by conditional formatting (one rule per status over the sheet), not cell by cell: the colours
follow the rows when a person sorts or filters, and the cost does not grow with the cells. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.formatting.rule import FormulaRule
from openpyxl.styles import Font, PatternFill
from openpyxl.utils import get_column_letter

from verify.report.advice import Advice
from verify.compare.runs import ComparisonResult
from verify.compare.op_verdicts import op_label
from verify.report.tables import (ERROR_RATIO, STATUS_COLOURS, emulation_banners, loss_line, module_totals, ops_line,
                                  past_tolerance, reading_columns, unmatched, worst_rows)

# openpyxl writes about 120,000 plain cells a second on this project's 2-core machine (bench_compare.py prints the
# rate), styled one by one under half that: ops.xlsx held every op row so until issue 25, 2.7 million cells and 57 s
# for 57,461 records. 200 rows of 25 columns a sheet keep the workbook a small part of a comparison at any size.
SHEET_ROWS = 200
WORST_ROWS = 100
FULL_TABLE = "ops.csv and ops.parquet"
_WIDTHS = {"item": 24, "value": 120, "module": 36, "ref_op": 28, "actual_op": 28, "note": 60}


@dataclass(frozen=True)
class Sheet:
    name: str
    rows: pd.DataFrame  # every row that belongs here; the sheet shows the first SHEET_ROWS
    rest: str  # which rows of the full table these are, for the note on the rows left out

    @property
    def shown(self) -> pd.DataFrame:
        return self.rows.head(SHEET_ROWS)

    def left_out_note(self) -> str:
        left_out = len(self.rows) - len(self.shown)
        return f"{left_out:,} more rows ({self.rest}) are in {FULL_TABLE} beside this workbook" if left_out else ""


def op_sheets(result: ComparisonResult) -> list[Sheet]:
    ops, columns = result.ops, reading_columns(result.ops)
    after_tolerance = columns.index("tolerance") + 1
    with_ratio = [*columns[:after_tolerance], ERROR_RATIO, *columns[after_tolerance:]]
    return [Sheet("past tolerance", past_tolerance(ops)[columns], "passed is false"),
            Sheet("unmatched", unmatched(ops)[columns], "status only_ref or only_actual"),
            Sheet(f"worst {WORST_ROWS}", worst_rows(ops, WORST_ROWS)[with_ratio], f"{ERROR_RATIO}, largest first"),
            Sheet("modules", module_totals(ops), "grouped by module and phase")]


def write_xlsx(result: ComparisonResult, advice: Sequence[Advice], path: Path) -> None:
    workbook = Workbook(write_only=True)
    sheets = op_sheets(result)
    _write_table(workbook, "summary", pd.DataFrame(summary_rows(result, advice, sheets), columns=["item", "value"]))
    for sheet in sheets:
        _write_table(workbook, sheet.name, sheet.shown, sheet.left_out_note())
    workbook.save(path)


def summary_rows(result: ComparisonResult, advice: Sequence[Advice], sheets: Sequence[Sheet]) -> list[tuple[str, str]]:
    first = result.first_divergent
    held = "; ".join(f"{sheet.name}: {len(sheet.shown):,} of {len(sheet.rows):,} rows" for sheet in sheets)
    rows = [("verdict", result.verdict.reason), *(("emulation", banner) for banner in emulation_banners(result)),
            ("comparison", result.policy.description),
            *((side, f"{run.manifest.title} ({run.source}, {run.root})")
              for side, run in (("ref", result.ref), ("actual", result.actual))),
            ("loss", loss_line(result) or "no common loss steps"), ("operators", ops_line(result)),
            ("first divergent operator", op_label(first) if first else "none"),
            ("full table", f"every operator row ({len(result.ops):,}) and column is in {FULL_TABLE} beside this "
                           f"workbook; this workbook holds {held}")]
    rows += [("finding", finding.message) for finding in result.findings]
    rows += [(f"advice {n}", item.message) for n, item in enumerate(advice, 1)]
    return rows + [("note", note) for note in result.notes]


def _write_table(workbook: Workbook, name: str, frame: pd.DataFrame, left_out_note: str = "") -> None:
    sheet = workbook.create_sheet(name)
    sheet.freeze_panes = "A2"
    last_cell = f"{get_column_letter(len(frame.columns))}{len(frame) + 1}"
    sheet.auto_filter.ref = f"A1:{last_cell}"
    for index, column in enumerate(frame.columns, 1):
        sheet.column_dimensions[get_column_letter(index)].width = _WIDTHS.get(column, 12)
    if len(frame):
        _colour_rows(sheet, list(frame.columns), f"A2:{last_cell}")
    bold = Font(bold=True)
    sheet.append([_bold(sheet, column, bold) for column in frame.columns])
    for row in _plain_values(frame):  # openpyxl takes rows one by one; a sheet holds at most SHEET_ROWS
        sheet.append([_text(sheet, value) if isinstance(value, str) and value[:1] == "=" else value for value in row])
    if left_out_note:
        sheet.append([_text(sheet, left_out_note)])


def _bold(sheet: Any, value: str, font: Font) -> WriteOnlyCell:
    cell = _text(sheet, value)
    cell.font = font
    return cell


def _text(sheet: Any, value: str) -> WriteOnlyCell:
    """A string as text, never a formula: openpyxl makes one that starts with '=' a formula (a manifest's field, a
    script's or module's name, a message quoting them would compute in the reader's spreadsheet)."""
    cell = WriteOnlyCell(sheet, value=value)
    cell.data_type = "s"
    return cell


def _plain_values(frame: pd.DataFrame) -> list[list[Any]]:
    """The rows as openpyxl writes them: a missing value empty, an infinity as text (Excel has none)."""
    values = frame.astype(object)
    for column in frame.select_dtypes("float").columns:
        numbers = frame[column].to_numpy("float64")
        values[column] = np.where(np.isinf(numbers), numbers.astype(str), values[column].to_numpy())
    return values.where(frame.notna(), None).to_numpy().tolist()


def _colour_rows(sheet: Any, columns: list[str], cells: str) -> None:
    """Each row's fill from its status, red past tolerance (passed false; an empty cell is no verdict); the modules
    sheet's rows red where some of their records are past tolerance."""
    if "past_tolerance" in columns:
        failed = f"${get_column_letter(columns.index('past_tolerance') + 1)}2>0"
        sheet.conditional_formatting.add(cells, FormulaRule(formula=[failed], fill=_fill(STATUS_COLOURS["failed"])))
    if "status" not in columns:
        return
    passed, status = (f"${get_column_letter(columns.index(name) + 1)}2" for name in ("passed", "status"))
    sheet.conditional_formatting.add(cells, FormulaRule(formula=[f"AND(ISLOGICAL({passed}),NOT({passed}))"],
                                                        fill=_fill(STATUS_COLOURS["failed"]), stopIfTrue=True))
    for name, colour in STATUS_COLOURS.items():
        if name not in ("exact", "failed"):  # exact rows stay white
            sheet.conditional_formatting.add(cells, FormulaRule(formula=[f'{status}="{name}"'], fill=_fill(colour)))


def _fill(colour: str) -> PatternFill:
    return PatternFill("solid", start_color=colour, end_color=colour)
