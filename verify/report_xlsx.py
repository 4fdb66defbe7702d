"""ops.xlsx: the ops table with a bold header, each row filled by its status (STATUS_COLOURS). No torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.styles import Font, PatternFill

from verify.report_tables import STATUS_COLOURS

XLSX_MAX_ROWS = 200_000  # openpyxl writes ~20k styled rows/s; ops.csv always has every row


def _row_colour(status: str, passed: Any) -> str:
    return STATUS_COLOURS["failed"] if passed is False else STATUS_COLOURS.get(status, "FFFFFF")


def write_xlsx(frame: pd.DataFrame, path: Path) -> None:
    workbook = Workbook(write_only=True)
    sheet = workbook.create_sheet("ops")
    sheet.freeze_panes = "A2"
    bold = Font(bold=True)
    sheet.append([_styled(sheet, name, font=bold) for name in frame.columns])
    fills = {colour: PatternFill("solid", start_color=colour) for colour in STATUS_COLOURS.values()}
    shown = frame.head(XLSX_MAX_ROWS)
    status_at, passed_at = shown.columns.get_loc("status"), shown.columns.get_loc("passed")
    for values in shown.astype(object).where(shown.notna(), None).itertuples(index=False, name=None):
        fill = fills[_row_colour(values[status_at], values[passed_at])]
        sheet.append([_styled(sheet, value, fill=fill) for value in values])
    if len(frame) > XLSX_MAX_ROWS:
        sheet.append([f"{len(frame) - XLSX_MAX_ROWS} more rows in ops.csv"])
    workbook.save(path)


def _styled(sheet: Any, value: Any, **style: Any) -> WriteOnlyCell:
    if isinstance(value, float) and not np.isfinite(value):
        value = str(value)  # Excel has no inf/nan
    cell = WriteOnlyCell(sheet, value=value)
    for name, setting in style.items():
        setattr(cell, name, setting)
    return cell
