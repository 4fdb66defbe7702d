"""What the reports show of a comparison's operators, as tables every report format shares: the full op table
(ops.csv, ops.parquet), its reading view (the columns a person reads), the rows past tolerance, the unmatched ones,
the worst N, and per-module totals; plus the emulation banners every report opens with.

Selects and shapes only: every number comes from compare.py. Vectorised over the op table; no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from verify.compare.align import MATCHED_STATUSES, AlignStatus
from verify.compare.metrics import TENSOR_METRICS
from verify.compare.runs import NODE_COLUMN, RANK_COLUMN, ComparisonResult
from verify.devices import title
from verify.record.schema import OP_COLUMNS, OP_KEY_PARTS, OP_SHARED_COLUMNS, OP_SIDE_COLUMNS, STAT_COLUMNS
from verify.record.store import Run, op_keys

# The full table: the pair's shared columns and verdict, each side's columns side by side (every per-side column of
# the schema, so a statistic added there reaches the reports), then compare's differences and metrics.
_VERDICT_COLUMNS = ["status", "passed", "judged_by"]
_LEADING_SIDE_COLUMNS = ["op", "dtype", "shape"]
_TRAILING_SIDE_COLUMNS = ["seq", "key"]
ONE_SIDED_STATUSES = (AlignStatus.ONLY_REF.value, AlignStatus.ONLY_ACTUAL.value)
ERROR_RATIO = "error_to_tolerance"  # stats_error / tolerance: above 1 is past tolerance

# Row colours by status (xlsx fills, html classes); a row past tolerance is red whatever its status.
STATUS_COLOURS = {"exact": "FFFFFF", "related": "DDEBF7", "sequence": "FFF2CC", "only_ref": "E7E6E6",
                  "only_actual": "FCE4D6", "failed": "F8CBAD"}


def both_sides(columns: list[str]) -> list[str]:
    return [f"{side}_{column}" for column in columns for side in ("ref", "actual")]


def op_report_columns(ops: pd.DataFrame) -> list[str]:
    side_columns = [c for c in OP_SIDE_COLUMNS if c not in (*_LEADING_SIDE_COLUMNS, *_TRAILING_SIDE_COLUMNS)]
    metric_columns = [c for c in ops.columns if not c.startswith(("ref_", "actual_"))
                      and c not in (*_rank(ops), *OP_SHARED_COLUMNS, *_VERDICT_COLUMNS, "note")]
    return [*_rank(ops), *OP_SHARED_COLUMNS, *_VERDICT_COLUMNS, *both_sides(_LEADING_SIDE_COLUMNS), "stats_error",
            "tolerance",
            *both_sides(side_columns), *(c for c in metric_columns if c not in ("stats_error", "tolerance")),
            *both_sides(_TRAILING_SIDE_COLUMNS), "note"]


def _rank(ops: pd.DataFrame) -> list[str]:
    """The rank column, where the table holds several ranks' rows, and its node's, across machines."""
    return [column for column in (RANK_COLUMN, NODE_COLUMN) if column in ops.columns]


def op_report_frame(result: ComparisonResult) -> pd.DataFrame:
    """The full ops table, every row and column, with each side's key (schema.op_key's format) rebuilt."""
    ops = result.ops
    keys = {f"{side}_key": _op_keys(ops, side).where(ops[f"{side}_op"].notna()) for side in ("ref", "actual")}
    ops = ops.assign(**keys)
    return ops.reindex(columns=op_report_columns(ops))


def _op_keys(ops: pd.DataFrame, side: str) -> pd.Series:
    """Each side's key: the parts a pair shares, then the side's own."""
    return op_keys({name: ops[name] if name in OP_SHARED_COLUMNS else ops[f"{side}_{name}"]
                    for name, _ in OP_KEY_PARTS})


# --- what a person reads -----------------------------------------------------------------------------------------


def reading_columns(ops: pd.DataFrame) -> list[str]:
    """The columns of an op row a person reads (html, xlsx): where, what, the verdict, each side's statistics."""
    statistics = [c for c in STAT_COLUMNS if OP_COLUMNS[c] == "float64"]
    return [*_rank(ops), "step", "phase", "module", "ref_op", "actual_op", "io", "status", "passed", "ref_dtype",
            "actual_dtype", "stats_error", "tolerance", *both_sides(statistics),
            *(metric.name for metric in TENSOR_METRICS if metric.in_op_tables), "ref_seq", "actual_seq", "note"]


def past_tolerance(ops: pd.DataFrame) -> pd.DataFrame:
    """Matched rows past tolerance, in execution order."""
    return ops.loc[(ops["passed"] == False).to_numpy(dtype=bool, na_value=False)]  # noqa: E712 (NA: unmatched)


def unmatched(ops: pd.DataFrame) -> pd.DataFrame:
    """One-sided rows, those nobody expected first (an autocast's cast says why in its note), in execution order."""
    one_sided = ops.loc[ops["status"].isin(ONE_SIDED_STATUSES)]
    return one_sided.iloc[np.argsort(one_sided["note"].notna().to_numpy(), kind="stable")]


def diverging_rows(ops: pd.DataFrame, limit: int) -> pd.DataFrame:
    """Rows past tolerance, in execution order, then unmatched rows without an expected-one-side note."""
    failing = past_tolerance(ops)
    unexpected = unmatched(ops)
    unexpected = unexpected.loc[unexpected["note"].isna()]
    return pd.concat([failing.head(limit), unexpected.head(max(0, limit - len(failing)))])


def shown_rank(result: ComparisonResult) -> int | None:
    """The rank whose comparison the verdict, findings and first divergent op are (None: two single processes)."""
    return result.ranks.get("shown_rank") if RANK_COLUMN in result.ops.columns else None


def shown_rank_ops(result: ComparisonResult) -> pd.DataFrame:
    """The op rows of the rank the verdict names (every row, for two single processes)."""
    rank = shown_rank(result)
    return result.ops if rank is None else result.ops.loc[result.ops[RANK_COLUMN] == rank]


def shown_rank_first(result: ComparisonResult) -> pd.DataFrame:
    """Every op row, the rank the verdict names first, then the others in rank order."""
    rank = shown_rank(result)
    if rank is None:
        return result.ops
    return result.ops.iloc[np.argsort((result.ops[RANK_COLUMN] != rank).to_numpy(), kind="stable")]


def other_ranks_line(result: ComparisonResult) -> str:
    """Where the other ranks' op rows are, with the rows past tolerance of each rank, by node across machines ("" for
    single processes)."""
    rank = shown_rank(result)
    if rank is None or result.ops.empty:
        return ""
    failed = (result.ops["passed"] == False).to_numpy(dtype=bool, na_value=False)  # noqa: E712
    counts = result.ops.assign(failed=failed).groupby(RANK_COLUMN)["failed"].sum()
    by_node = result.actual.ranks_by_node() or {None: list(counts.index)}
    per_rank = "; ".join(("" if node is None else f"node {node}: ")
                         + ", ".join(f"rank {other} {int(counts[other])}" for other in ranks if other in counts)
                         for node, ranks in by_node.items())
    return (f"{result.actual.rank_name(rank)}'s ops shown; every rank's rows are in ops.csv, ops.parquet, ops.xlsx and "
            f"report.html (column {RANK_COLUMN}); past tolerance: {per_rank}")


def error_ratio(ops: pd.DataFrame) -> pd.Series:
    """stats_error / tolerance: inf for any error where none is tolerated (integers), NaN where nothing was judged;
    where the calibration run that computes as the port does judged a row too, the larger of that and
    calibrated_error / calibrated_tolerance."""
    ratio = ops["stats_error"].astype("float64") / ops["tolerance"].astype("float64")
    if "calibrated_tolerance" not in ops:
        return ratio
    calibrated = ops["calibrated_error"].astype("float64") / ops["calibrated_tolerance"].astype("float64")
    return ratio.where(ops["judged_by"].astype(str) != "calibration", np.fmax(ratio, calibrated))


def worst_rows(ops: pd.DataFrame, count: int) -> pd.DataFrame:
    """The `count` matched rows closest to or furthest past their tolerance, worst first, with their ratio."""
    matched = ops.loc[ops["status"].isin(MATCHED_STATUSES)]
    return matched.assign(**{ERROR_RATIO: error_ratio(matched)}).nlargest(count, ERROR_RATIO)


def module_totals(ops: pd.DataFrame) -> pd.DataFrame:
    """Per module and phase: its records, those past tolerance and unmatched, its worst error against tolerance and
    the first step where it broke its tolerance; the modules with the most rows past tolerance first."""
    failed = (ops["passed"] == False).to_numpy(dtype=bool, na_value=False)  # noqa: E712
    rows = pd.DataFrame({
        **{column: ops[column] for column in _rank(ops)},
        "module": ops["module"].astype("string").replace("", "(top level)"), "phase": ops["phase"],
        "records": 1, "past_tolerance": failed, "unmatched": ops["status"].isin(ONE_SIDED_STATUSES),
        ERROR_RATIO: error_ratio(ops),
        "first_step_past_tolerance": ops["step"].where(failed)})
    totals = rows.groupby([*_rank(ops), "module", "phase"], sort=False, observed=True).agg(
        {"records": "sum", "past_tolerance": "sum", "unmatched": "sum", ERROR_RATIO: "max",
         "first_step_past_tolerance": "min"}).reset_index()
    totals["first_step_past_tolerance"] = totals["first_step_past_tolerance"].astype("Int64")
    return totals.sort_values(["past_tolerance", ERROR_RATIO], ascending=False, kind="stable")


# --- lines -------------------------------------------------------------------------------------------------------


def loss_line(result: ComparisonResult) -> str:
    """The loss comparison in one line ("" when no step was compared)."""
    loss = result.loss
    if not loss.steps_compared:
        return ""
    first = loss.first_step_past_tolerance
    return (f"{loss.steps_compared} steps, max rel diff {loss.max_rel_diff:.3%}, mean {loss.mean_rel_diff:.3%}, "
            f"tolerance {loss.rtol:.2%}, first step past tolerance: {first if first is not None else 'none'}")


def ops_line(result: ComparisonResult) -> str:
    """The operators' statuses in one line, or why they were not compared."""
    if result.ops_not_compared:
        return f"not compared, {result.ops_not_compared}"
    return ", ".join(f"{status} {count}" for status, count in result.status_counts().items())


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
