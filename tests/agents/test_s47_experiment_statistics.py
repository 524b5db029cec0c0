"""The A/B page's figures read as their names say: a p50 is the median (as the benches compute it), a 95 %
interval of a few ratings is as wide as Student's t makes it, and a p-value is never shown rounded onto the other
side of 0.05 from where it lies."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest
from django.utils import translation

from agents.experiments import ArmMetrics, arm_comparisons, percentile
from bench._stats import percentile as bench_percentile


@pytest.fixture(autouse=True)
def _english() -> Iterator[None]:
    with translation.override("en"):
        yield


def test_the_latency_p50_of_an_arm_is_the_median_of_its_runs() -> None:
    assert ArmMetrics(arm="a", version=1, latencies_ms=[100.0, 200.0]).latency_p50 == 150.0
    assert ArmMetrics(arm="a", version=1, latencies_ms=[4.0, 1.0, 3.0, 2.0]).latency_p50 == 2.5
    assert ArmMetrics(arm="a", version=1, latencies_ms=[6.0, 1.0, 3.0, 2.0, 5.0, 4.0]).latency_p50 == 3.5


def test_the_arm_percentiles_are_the_benches_percentiles() -> None:
    latencies = [float(v) for v in (12, 3, 7, 41, 5, 9, 30, 2, 18, 11, 6, 14)]
    for q in (0.0, 0.25, 0.5, 0.9, 0.95, 1.0):
        assert percentile(latencies, q) == pytest.approx(bench_percentile(latencies, q))
    p95 = statistics.quantiles(latencies, n=20, method="inclusive")[18]
    assert ArmMetrics(arm="a", version=1, latencies_ms=latencies).latency_p95 == pytest.approx(p95)
    assert percentile([], 0.5) is None


def test_the_feedback_interval_of_two_ratings_is_students_t_interval_not_the_normal_one() -> None:
    ratings = [1.0, 0.6]
    mean, half = statistics.fmean(ratings), 12.706 * statistics.stdev(ratings) / 2**0.5  # t(0.975, 1 df) = 12.706
    low, high = ArmMetrics(arm="b", version=2, feedback=ratings).feedback_interval()  # type: ignore[misc]
    assert (low, high) == (pytest.approx(max(-1.0, mean - half)), 1.0)
    assert low == -1.0  # two ratings say little: the interval spans the scale's bottom, not [0.41, 1.00]


def test_the_feedback_interval_of_many_ratings_is_close_to_the_normal_one() -> None:
    ratings = [0.5, -0.5, 0.0, 1.0, -1.0] * 20  # 100 ratings: t(0.975, 99 df) = 1.984
    low, high = ArmMetrics(arm="b", version=2, feedback=ratings).feedback_interval()  # type: ignore[misc]
    half = 1.984 * statistics.stdev(ratings) / 10
    assert low == pytest.approx(-half, abs=1e-3) and high == pytest.approx(half, abs=1e-3)


def test_a_significant_p_value_just_under_0_05_is_not_shown_as_0_050() -> None:
    base = ArmMetrics(arm="a", version=1, runs=100, succeeded=14)
    other = ArmMetrics(arm="b", version=2, runs=100, succeeded=25)  # p = 0.04962
    success = next(c for c in arm_comparisons([base, other]) if c.metric == "success_rate")
    assert success.significant and success.p == pytest.approx(0.04962, abs=1e-5)
    assert success.statement == (
        "Significant: success rate of arm b (v2) 25.0% vs arm a (v1) 14.0%, p = 0.0496 (two-proportion z-test, "
        "p < 0.05)."
    )


def test_a_p_value_away_from_the_threshold_keeps_three_decimals() -> None:
    base = ArmMetrics(arm="a", version=1, runs=200, succeeded=120)
    other = ArmMetrics(arm="b", version=2, runs=200, succeeded=126)
    success = next(c for c in arm_comparisons([base, other]) if c.metric == "success_rate")
    assert not success.significant and f"p = {success.p:.3f} " in success.statement
