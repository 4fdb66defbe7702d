"""Small, pure, named metric functions over numpy arrays. No pandas logic, no I/O, no torch.

Statistics metrics take arrays of per-record statistics (one element per aligned record) and are vectorised.
Tensor metrics take the two full tensors of one record and return one float.
"""

from __future__ import annotations

from typing import Callable

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
    """Cosine similarity; two all-zero tensors are identical (1.0), one all-zero tensor is NaN (undefined)."""
    r, a = _flat(ref, actual)
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


TENSOR_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "cosine": cosine,
    "max_abs_error": max_abs_error,
    "max_relative_error": max_relative_error,
    "within_1e3": share_within(1e-3),
    "within_5e3": share_within(5e-3),
    "euclidean_distance": euclidean_distance,
}


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


OUTPUT_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "cosine": cosine,
    "max_abs_error": max_abs_error,
    "mean_abs_error": mean_abs_error,
    "top1_agreement": lambda ref, actual: topk_agreement(ref, actual, 1),
    "top5_agreement": lambda ref, actual: topk_agreement(ref, actual, 5),
}
