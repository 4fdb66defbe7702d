"""Metric functions and tolerance lookups, on real numbers."""

import numpy as np
import pandas as pd
import pytest

from verify.compare import metrics
from verify.compare import tolerances


def test_relative_difference_handles_zeros():
    ref = np.array([0.0, 0.0, 2.0, -4.0])
    actual = np.array([0.0, 1e-9, 2.2, -4.0])
    assert metrics.relative_difference(ref, actual).tolist() == [0.0, np.inf, pytest.approx(0.1), 0.0]


def test_stats_error_scales_mean_by_magnitude_and_ignores_missing():
    ref = {"min": np.array([-3.0]), "max": np.array([3.0]), "mean": np.array([1e-6]), "l2_norm": np.array([100.0])}
    actual = {"min": np.array([-3.0]), "max": np.array([3.0]), "mean": np.array([2e-6]), "l2_norm": np.array([101.0])}
    # the mean doubled (relative 100%) but moved by 3e-7 of the largest element; the norm moved 1/101
    assert metrics.stats_error(ref, actual)[0] == pytest.approx(1 / 101)
    actual["l2_norm"] = np.array([np.nan])  # msprobe 26.2 writes null norms for some dtypes
    assert metrics.stats_error(ref, actual)[0] == pytest.approx(1e-6 / 3)


def test_stats_error_weighs_the_extremes_single_elements_less():
    ref = {"min": np.array([-3.0]), "max": np.array([3.0]), "mean": np.array([0.5]), "l2_norm": np.array([100.0])}
    actual = {"min": np.array([-3.0]), "max": np.array([3.3]), "mean": np.array([0.5]), "l2_norm": np.array([100.0])}
    # the max moved 0.3 of the largest magnitude 3.3: one element, counted at EXTREME_WEIGHT
    assert metrics.stats_error(ref, actual)[0] == pytest.approx(0.3 / 3.3 * tolerances.EXTREME_WEIGHT)


def test_tensor_metrics():
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    actual = np.array([1.0, 2.0, 3.0, 4.03])
    assert metrics.cosine(ref, ref) == pytest.approx(1.0)
    assert metrics.cosine(np.zeros(3), np.zeros(3)) == 1.0 and np.isnan(metrics.cosine(np.zeros(3), np.ones(3)))
    assert metrics.max_abs_error(ref, actual) == pytest.approx(0.03)
    assert metrics.max_relative_error(ref, actual) == pytest.approx(0.0075)
    by_name = {metric.name: metric.function for metric in metrics.TENSOR_METRICS}
    assert by_name["within_1e3"](ref, actual) == 0.75
    assert by_name["within_5e3"](ref, actual) == 0.75
    assert metrics.euclidean_distance(ref, actual) == pytest.approx(0.03)


def test_every_judged_metric_names_a_limit_the_verdict_holds():
    op_limits = set(tolerances.FIELDS)
    for table, limits in ((metrics.TENSOR_METRICS, op_limits), (metrics.OUTPUT_METRICS, op_limits
                                                                  | set(tolerances.OUTPUT_LIMITS))):
        names = [metric.name for metric in table]
        assert len(names) == len(set(names))
        for metric in table:
            assert metric.threshold is None or metric.threshold in limits, metric
            assert metric.unless is None or metric.unless in names, metric


def test_equal_tensors_have_a_cosine_of_exactly_one():
    """Regression: identical int64 labels (randint) had a cosine of 1 - 2e-16, under an exact dtype's limit of 1.0."""
    labels = np.array([2, 0, 1, 2, 2, 1, 1, 2])
    assert metrics.cosine(labels, labels.copy()) == 1.0
    assert metrics.cosine(np.zeros(0), np.zeros(0)) == 1.0  # as before: two empty tensors are identical
    assert metrics.cosine(labels, labels + 1) < 1.0


def test_tensor_rule_fails_a_low_cosine_and_a_large_error_unless_nearly_all_elements_are_close():
    values = {"cosine": np.array([0.5, 1.0, 1.0, 1.0, 1.0]),
              "max_abs_error": np.array([0.0, 5.0, 5.0, 0.0, np.nan]),
              "within_5e3": np.array([1.0, 0.995, 0.5, 0.0, 0.0])}
    values |= {metric.name: np.zeros(5) for metric in metrics.TENSOR_METRICS if metric.name not in values}
    limits = tolerances.pair_tolerances(pd.Series(["float32"] * 5), pd.Series(["float32"] * 5))
    # a low cosine; outliers in a tensor mostly within 0.5%; a large error elsewhere; a share alone judges nothing;
    # a metric not computed (NaN) is never past its limit
    assert metrics.within_limits(metrics.TENSOR_METRICS, values, limits).tolist() == [False, True, False, True, True]


def test_topk_agreement():
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    actual = np.array([[0.9, 0.1, 0.0], [0.8, 0.1, 0.1]])
    assert metrics.topk_agreement(ref, actual, 1) == 0.5
    assert metrics.topk_agreement(ref, actual, 2) == 1.0
    assert np.isnan(metrics.topk_agreement(ref[0], actual[0], 1))


def test_md5_equal():
    assert metrics.md5_equal(np.array(["a", "b"]), np.array(["a", "c"])).tolist() == [True, False]


def test_tolerances_take_the_looser_dtype_and_widen():
    ref = pd.Series(["float32", "float32", "int64", "float8_e4m3fn"])
    actual = pd.Series(["float32", "float16", "int64", "float32"])
    limits = tolerances.pair_tolerances(ref, actual)
    assert limits["stats_rtol"].tolist() == [2.0**-13, 2.0**-10, 0.0, 2.0**-13]  # the devices' accuracy standard
    widened = tolerances.pair_tolerances(ref, actual, widen=5)
    assert widened["stats_rtol"].tolist()[1] == pytest.approx(5 * 2.0**-10)
    assert widened["cosine_min"].tolist()[1] == pytest.approx(0.995)


def test_every_tolerance_has_a_comment():
    source = open(tolerances.__file__, encoding="utf-8").read()
    table = source.split("OP_TOLERANCES: dict")[1].split("\n}\n")[0]
    entries = [line for line in table.splitlines() if "OpTolerance(" in line]
    comments = [line for line in table.splitlines() if line.strip().startswith("#")]
    assert len(entries) == 4 and len(comments) >= len(entries)
