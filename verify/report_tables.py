"""What the reports show of a comparison's operators, as tables several report formats share: the full op table
(ops.csv, ops.xlsx) and the rows past tolerance or unmatched; plus the emulation banners every report opens with and
how a cell reads.

Selects and shapes only: every number comes from compare.py. No torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from verify.align import AlignStatus
from verify.compare import ComparisonResult
from verify.devices import title
from verify.schema import OP_KEY_PARTS, OP_SHARED_COLUMNS, OP_SIDE_COLUMNS
from verify.store import Run, op_keys

# The full table: the pair's shared columns and verdict, each side's columns side by side (every per-side column of
# the schema, so a statistic added there reaches the reports), then compare's differences and metrics.
_VERDICT_COLUMNS = ["status", "passed", "judged_by"]
_LEADING_SIDE_COLUMNS = ["op", "dtype", "shape"]
_TRAILING_SIDE_COLUMNS = ["seq", "key"]

# Row colours by status (xlsx fills, html classes); a row past tolerance is red whatever its status.
STATUS_COLOURS = {"exact": "FFFFFF", "related": "DDEBF7", "sequence": "FFF2CC", "only_ref": "E7E6E6",
                  "only_actual": "FCE4D6", "failed": "F8CBAD"}


def both_sides(columns: list[str]) -> list[str]:
    return [f"{side}_{column}" for column in columns for side in ("ref", "actual")]


def op_report_columns(ops: pd.DataFrame) -> list[str]:
    side_columns = [c for c in OP_SIDE_COLUMNS if c not in (*_LEADING_SIDE_COLUMNS, *_TRAILING_SIDE_COLUMNS)]
    metric_columns = [c for c in ops.columns if not c.startswith(("ref_", "actual_"))
                      and c not in (*OP_SHARED_COLUMNS, *_VERDICT_COLUMNS, "note")]
    return [*OP_SHARED_COLUMNS, *_VERDICT_COLUMNS, *both_sides(_LEADING_SIDE_COLUMNS), "stats_error", "tolerance",
            *both_sides(side_columns), *(c for c in metric_columns if c not in ("stats_error", "tolerance")),
            *both_sides(_TRAILING_SIDE_COLUMNS), "note"]


def op_report_frame(result: ComparisonResult) -> pd.DataFrame:
    """The ops table as written to ops.csv/xlsx, with each side's key (schema.op_key's format) rebuilt."""
    ops = result.ops
    keys = {f"{side}_key": _op_keys(ops, side).where(ops[f"{side}_op"].notna()) for side in ("ref", "actual")}
    ops = ops.assign(**keys)
    return ops.reindex(columns=op_report_columns(ops))


def _op_keys(ops: pd.DataFrame, side: str) -> pd.Series:
    """Each side's key: the parts a pair shares, then the side's own."""
    return op_keys({name: ops[name] if name in OP_SHARED_COLUMNS else ops[f"{side}_{name}"]
                    for name, _ in OP_KEY_PARTS})


def diverging_rows(result: ComparisonResult, limit: int) -> pd.DataFrame:
    """Rows past tolerance, in execution order, then unmatched rows (those without an expected-one-side note)."""
    ops = result.ops
    failing = ops.loc[ops["passed"] == False]  # noqa: E712 (nullable boolean: NA rows are unmatched, not failing)
    one_sided = ops["status"].isin([AlignStatus.ONLY_REF.value, AlignStatus.ONLY_ACTUAL.value])
    unmatched = ops.loc[one_sided & ops["note"].isna()]
    return pd.concat([failing.head(limit), unmatched.head(max(0, limit - len(failing)))])


# --- runs --------------------------------------------------------------------------------------------------------


def emulation(run: Run) -> str:
    """"EMULATED NPU", "EMULATED CUDA": what a run's device stood in for."""
    return title(run.manifest.device, run.manifest.emulated_on).split(" (")[0]


def emulation_banners(result: ComparisonResult) -> list[str]:
    return [f"{side.upper()} RAN ON AN {emulation(run)}: {run.manifest.title}"
            for side, run in (("ref", result.ref), ("actual", result.actual)) if run.manifest.emulated]


def cell_text(value: Any) -> str:
    """A table cell as a person reads it: numbers to 6 significant digits, nothing for a missing value."""
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
