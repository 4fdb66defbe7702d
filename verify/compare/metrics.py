"""Small, pure, named metric functions over numpy arrays. No pandas logic, no I/O, no torch.

Statistics metrics take arrays of per-record statistics (one element per aligned record) and are vectorised.
Tensor metrics take the two full tensors of one record and return one float; the `Metric` tables (TENSOR_METRICS for
op records in tensor mode, OUTPUT_METRICS for inference outputs) say which are computed, how each is judged and how
the reports name it: adding a metric is one row there (and its limit in tolerances.py if it is judged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from verify.compare import tolerances
from verify.record.statistics import COMPARED, Comparison

STAT_NAMES = tuple(statistic.column for statistic in COMPARED)  # the nan/inf counts are compared as flags
# The statistics that are elements of the tensor: the largest magnitude of theirs scales the others' differences.
_EXTREMES = tuple(statistic.column for statistic in COMPARED if statistic.comparison is Comparison.EXTREME)
TINY = 1e-30  # guards divisions; far below any fp16/bf16 subnormal, so it never hides a real difference


def difference(ref: np.ndarray, actual: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # inf - inf is nan: both overflowed, judged by the nan/inf counts
        return actual - ref


def relative_difference(ref: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """|actual - ref| / |ref|; 0 where both are equal (zeros included), inf where only ref is zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        result = np.abs(actual - ref) / np.abs(ref)
        equal = actual == ref
    return np.where(equal, 0.0, result)


def stats_error(ref: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> np.ndarray:
    """The judged statistics error of each record: the largest of its compared statistics' scaled differences, each
    scaled as its row in verify/record/statistics.py says (Comparison).

    min, max and mean are divided by the tensor's largest magnitude rather than by themselves: a mean near zero
    (a centred activation, a gradient) has a huge relative difference for a difference that is invisible next to its
    elements, which is msprobe's most common false warning. l2_norm is divided by itself. min and max are single
    elements: their differences count tolerances.EXTREME_WEIGHT of theirs.
    """
    with np.errstate(invalid="ignore"):  # inf - inf: both sides overflowed, judged by their nan/inf counts
        return _stats_error(ref, actual)


def _stats_error(ref: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> np.ndarray:
    magnitude = np.maximum.reduce([np.abs(side[name]) for side in (ref, actual) for name in _EXTREMES])
    magnitude = np.maximum(magnitude, TINY)
    errors = []
    for statistic in COMPARED:
        name = statistic.column
        if statistic.comparison is Comparison.RELATIVE:
            scale = np.maximum(np.maximum(np.abs(ref[name]), np.abs(actual[name])), TINY)
            errors.append(np.abs(actual[name] - ref[name]) / scale)
        elif statistic.comparison is Comparison.EXTREME:
            errors.append(np.abs(actual[name] - ref[name]) / magnitude * tolerances.EXTREME_WEIGHT)
        else:
            errors.append(np.abs(actual[name] - ref[name]) / magnitude)
    return np.fmax.reduce(errors)  # fmax: a statistic a writer left empty (NaN) does not hide the others


def md5_equal(ref: np.ndarray, actual: np.ndarray) -> np.ndarray:
    return ref == actual


# --- tensor mode: one pair of full tensors -------------------------------------------------------------------------


def _flat(ref: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ref.astype(np.float64).ravel(), actual.astype(np.float64).ravel()


def cosine(ref: np.ndarray, actual: np.ndarray) -> float:
    """Cosine similarity; two all-zero tensors are identical (1.0), one all-zero tensor is NaN (undefined). Equal
    tensors are 1.0 exactly: the dot product over the norms rounds to 1 - 2e-16, which an exact dtype's limit (1.0)
    failed (two runs' identical randint labels, in tensor mode)."""
    r, a = _flat(ref, actual)
    if np.array_equal(r, a):
        return 1.0
    norms = np.linalg.norm(r) * np.linalg.norm(a)
    if norms == 0.0:
        return 1.0 if not r.any() and not a.any() else float("nan")
    return float(np.dot(r, a) / norms)


def max_abs_error(ref: np.ndarray, actual: np.ndarray) -> float:
    r, a = _flat(ref, actual)
    return float(np.max(np.abs(a - r), initial=0.0))


def _element_relative_error(ref: np.ndarray, actual: np.ndarray) -> np.ndarray:
    r, a = _flat(ref, actual)
    return relative_difference(r, a)


def max_relative_error(ref: np.ndarray, actual: np.ndarray) -> float:
    return float(np.max(_element_relative_error(ref, actual), initial=0.0))


def share_within(rtol: float) -> Callable[[np.ndarray, np.ndarray], float]:
    """The share of elements whose relative error is below `rtol` (msprobe's One/Five Thousandth Err Ratio)."""

    def metric(ref: np.ndarray, actual: np.ndarray) -> float:
        errors = _element_relative_error(ref, actual)
        return float(np.mean(errors < rtol)) if errors.size else 1.0

    return metric


def euclidean_distance(ref: np.ndarray, actual: np.ndarray) -> float:
    r, a = _flat(ref, actual)
    return float(np.linalg.norm(a - r))


# --- inference outputs ---------------------------------------------------------------------------------------------


def mean_abs_error(ref: np.ndarray, actual: np.ndarray) -> float:
    r, a = _flat(ref, actual)
    return float(np.mean(np.abs(a - r))) if r.size else 0.0


def topk_agreement(ref: np.ndarray, actual: np.ndarray, k: int) -> float:
    """Mean over samples of |top-k(ref) ∩ top-k(actual)| / k, over the last axis; k=1 is top-1 agreement.

    NaN when the output is not a batch of scores (fewer than two dimensions, or fewer than k classes).
    """
    if ref.ndim < 2 or ref.shape[-1] < k or ref.shape != actual.shape:
        return float("nan")
    r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    a = actual.reshape(-1, actual.shape[-1]).astype(np.float64)
    top_ref = np.argpartition(-r, k - 1, axis=1)[:, :k]
    top_actual = np.argpartition(-a, k - 1, axis=1)[:, :k]
    shared = (top_ref[:, :, None] == top_actual[:, None, :]).any(axis=2).sum(axis=1)
    return float(np.mean(shared / k))


def top1_agreement(ref: np.ndarray, actual: np.ndarray) -> float:
    return topk_agreement(ref, actual, 1)


TOP_K = 5


def top_k(classes: int) -> int:
    """The k of the "top-5" agreement of an output with `classes` scores a sample: 5, or all of them where fewer (top-5
    of 3 classes is undefined; the reports name it top-3)."""
    return min(TOP_K, classes)


def top5_agreement(ref: np.ndarray, actual: np.ndarray) -> float:
    return topk_agreement(ref, actual, top_k(ref.shape[-1]) if ref.ndim else TOP_K)


# --- the metric tables ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One figure comparing the two full tensors of a record: a row of a metric table."""

    name: str  # the column it fills (ops.csv and ops.parquet, the outputs table, summary.json's outputs)
    function: Callable[[np.ndarray, np.ndarray], float]
    label: str  # how the reports name it to a person (adaptation.md's columns)
    higher_is_better: bool  # cosine and shares within a tolerance; errors and distances are better low
    # The key of its limit among the tolerances the verdict holds it to (an OpTolerance field, or a key of
    # tolerances.OUTPUT_LIMITS); None: computed and shown, never judged.
    threshold: str | None = None
    # A metric whose holding its own limit excuses this one past its limit; the excusing metric judges nothing alone.
    unless: str | None = None
    fmt: str = ".3g"  # how a report prints one value of it
    in_op_tables: bool = False  # the reports' op tables (report.html, ops.xlsx) show it; ops.csv holds every metric

    @property
    def worst(self) -> str:
        """The pandas reduction that gives its worst value over several (steps, outputs)."""
        return "min" if self.higher_is_better else "max"

    def past(self, values: np.ndarray, limit: Any) -> np.ndarray:
        """Whether each value is past the limit; NaN (not computed) never is."""
        values, limit = np.asarray(values, "float64"), np.asarray(limit, "float64")
        return values < limit if self.higher_is_better else values > limit


COSINE = Metric("cosine", cosine, "cosine", higher_is_better=True, threshold="cosine_min", fmt=".6f",
                in_op_tables=True)
# Tensor mode judges by msprobe's rule with our dtype limits: a low cosine fails; a large error fails unless nearly all
# elements are close (a few outliers in a big tensor).
TENSOR_METRICS: tuple[Metric, ...] = (
    COSINE,
    Metric("max_abs_error", max_abs_error, "max abs error", higher_is_better=False, threshold="max_abs_error",
           unless="within_5e3"),
    Metric("max_relative_error", max_relative_error, "max relative error", higher_is_better=False),
    Metric("within_1e3", share_within(1e-3), "share within 0.1%", higher_is_better=True, fmt=".2%"),
    Metric("within_5e3", share_within(5e-3), "share within 0.5%", higher_is_better=True, threshold="within_5e3_min",
           fmt=".2%"),
    Metric("euclidean_distance", euclidean_distance, "euclidean distance", higher_is_better=False),
)
# Inference outputs: the figures of Ascend adaptation reports, judged by cosine and top-k agreement.
OUTPUT_METRICS: tuple[Metric, ...] = (
    COSINE,
    Metric("max_abs_error", max_abs_error, "max abs error", higher_is_better=False),
    Metric("mean_abs_error", mean_abs_error, "mean abs error", higher_is_better=False),
    Metric("top1_agreement", top1_agreement, "top-1", higher_is_better=True, threshold="top1_agreement_min",
           fmt=".2%"),
    Metric("top5_agreement", top5_agreement, "top-5", higher_is_better=True, threshold="top5_agreement_min",
           fmt=".2%"),
)


def within_limits(table: tuple[Metric, ...], values: Mapping[str, np.ndarray], limits: Any) -> np.ndarray:
    """Per row, whether the table's judged metrics hold their limits (`limits[metric.threshold]`, one per row or one
    for all): a metric past its limit fails the row unless the metric it names in `unless` holds its own."""
    by_name = {metric.name: metric for metric in table}
    excusing = {metric.unless for metric in table}
    within = np.ones(len(next(iter(values.values()))), dtype=bool)
    for metric in table:
        if metric.threshold is None or metric.name in excusing:
            continue
        past = metric.past(values[metric.name], limits[metric.threshold])
        if metric.unless:
            excuse = by_name[metric.unless]
            past &= excuse.past(values[excuse.name], limits[excuse.threshold])
        within &= ~past
    return within
