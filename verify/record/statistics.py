"""The statistics of a tensor: one row each, the only place that lists them. Everything else is built from this table:
the columns of the ops, grads and outputs tables (verify/record/schema.py), the capture's computation of them
(verify/capture/tensor_stats.py: the C one-pass path for the rows marked `one_pass`, each other row by its `torch`
functions, every value placed by name), the judged statistics error (verify/compare/metrics.py) and the msprobe export
and import (verify/record/msprobe.py).

To add a statistic, add a row: say how torch computes it from a tensor, how it is compared, and its msprobe name if
msprobe has one. tests/verify/test_schema_owner.py adds one to a copy of verify and finds it in a real run's records
and in every report. No torch here: run folders are read and compared on any laptop.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Comparison(str, Enum):
    """How a statistic's two sides are compared (verify/compare/metrics.py stats_error)."""

    # An element of the tensor (min, max): its difference over the tensor's largest magnitude, which the extremes of
    # both sides give, times tolerances.EXTREME_WEIGHT (a single element moves more than a sum over all of them).
    EXTREME = "extreme"
    # A value on the elements' own scale (mean): its difference over the tensor's largest magnitude, so that a mean
    # near zero is not judged by its relative difference (msprobe's most common false warning).
    MAGNITUDE = "magnitude"
    # A sum over all elements (L2 norm): its difference over itself.
    RELATIVE = "relative"
    # A count of NaN or inf: compared as present or absent on both sides, outside the statistics error.
    PRESENCE = "presence"


@dataclass(frozen=True)
class Statistic:
    """One statistic of a tensor, as every table that has statistics (ops, grads, outputs) records it."""

    column: str  # its column name
    dtype: str  # its pandas dtype, "float64" or "int64": float64 whatever the tensor's dtype keeps fp32 extremes exact
    # How torch computes it: functions applied in turn to the tensor in its accumulation dtype (float32; float64 for
    # float64 and integer tensors), by their names in the torch namespace: ("abs", "mean") is torch.abs, then mean.
    torch: tuple[str, ...]
    # Computed in one pass over a CPU tensor by verify/capture/_stats.c (its STATISTICS names what it computes) and by
    # the capture's batched reductions; False: by `torch`, tensor by tensor, on every path.
    one_pass: bool
    comparison: Comparison
    msprobe: str = ""  # its field in an msprobe dump.json ("Max"); "": msprobe records none


STATISTICS: tuple[Statistic, ...] = (
    Statistic("min", "float64", ("amin",), True, Comparison.EXTREME, "Min"),
    Statistic("max", "float64", ("amax",), True, Comparison.EXTREME, "Max"),
    Statistic("mean", "float64", ("mean",), True, Comparison.MAGNITUDE, "Mean"),
    Statistic("l2_norm", "float64", ("linalg.vector_norm",), True, Comparison.RELATIVE, "Norm"),
    Statistic("nan_count", "int64", ("isnan", "sum"), True, Comparison.PRESENCE),
    Statistic("inf_count", "int64", ("isinf", "sum"), True, Comparison.PRESENCE),
)

STATISTIC_COLUMNS: dict[str, str] = {statistic.column: statistic.dtype for statistic in STATISTICS}
"""Column name -> pandas dtype, in the table's order: the statistics' columns of ops, grads and outputs."""

COMPARED = tuple(statistic for statistic in STATISTICS if statistic.comparison is not Comparison.PRESENCE)
"""The statistics that the statistics error weighs (the NaN and inf counts are compared as flags)."""
