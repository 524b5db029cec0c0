"""The statistics behind the A/B page: Wilson intervals and the two-proportion z-test, and its plain statement."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from django.utils import translation

from agents.experiments import ArmMetrics, arm_comparisons, two_proportion_z, welch_z, wilson


@pytest.fixture(autouse=True)
def _english() -> Iterator[None]:
    """The statements are checked in English, whatever language an earlier test left active."""
    with translation.override("en"):
        yield


def test_the_two_proportion_z_test_matches_the_textbook_value() -> None:
    z, p = two_proportion_z(60, 100, 40, 100)  # type: ignore[misc]
    assert z == pytest.approx(2.8284, abs=1e-3)
    assert p == pytest.approx(0.00468, abs=1e-4)
    assert two_proportion_z(5, 10, 0, 0) is None
    assert two_proportion_z(10, 10, 10, 10) is None  # no variance: undefined, never "significant"


def test_the_wilson_interval_stays_within_0_and_1_and_holds_the_rate() -> None:
    low, high = wilson(0, 10)  # type: ignore[misc]
    assert low == 0.0 and 0.2 < high < 0.35
    low, high = wilson(50, 100)  # type: ignore[misc]
    assert low < 0.5 < high and math.isclose(low + high, 1.0, abs_tol=1e-9)
    assert wilson(0, 0) is None


def test_a_significant_difference_is_said_plainly_and_a_small_sample_is_not_called_significant() -> None:
    a = ArmMetrics(arm="a", version=1, runs=200, succeeded=120, cited=100)
    b = ArmMetrics(arm="b", version=2, runs=200, succeeded=160, cited=101)
    success, citation, _feedback, _latency = arm_comparisons([a, b])
    assert success.significant and success.statement.startswith("Significant")
    assert "two-proportion z-test" in success.statement
    assert not citation.significant and citation.statement.startswith("No significant difference")
    small = arm_comparisons(
        [ArmMetrics(arm="a", version=1, runs=5, succeeded=0), ArmMetrics(arm="b", version=2, runs=5, succeeded=5)]
    )
    assert not small[0].significant and small[0].statement.startswith("Not enough data")


def test_the_feedback_interval_stays_on_the_minus_one_to_one_scale() -> None:
    metrics = ArmMetrics(arm="b", version=2, feedback=[1.0, 1.0, 0.5])
    low, high = metrics.feedback_interval()  # type: ignore[misc]
    assert high == 1.0 and -1.0 <= low < metrics.feedback_mean < high  # type: ignore[operator]
    low, high = ArmMetrics(arm="a", version=1, feedback=[-1.0, -1.0, -0.5]).feedback_interval()  # type: ignore[misc]
    assert low == -1.0 and high < 0


def test_welchs_test_matches_the_textbook_value_and_is_undefined_without_variance() -> None:
    z, p = welch_z([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0])  # type: ignore[misc]
    # means 2.5 and 5, variances 5/3 and 20/3: se = sqrt(5/12 + 20/12) = 1.4434
    assert z == pytest.approx(-1.7321, abs=1e-3)
    assert p == pytest.approx(0.0833, abs=1e-3)
    assert welch_z([1.0], [2.0, 3.0]) is None
    assert welch_z([1.0, 1.0], [1.0, 1.0]) is None


def test_feedback_and_latency_are_compared_with_welchs_test_and_said_plainly() -> None:
    happy = [1.0] * 25 + [0.5] * 15
    unhappy = [0.0] * 20 + [-0.5] * 20
    a = ArmMetrics(arm="a", version=1, runs=40, feedback=unhappy, latencies_ms=[100.0 + i % 7 for i in range(40)])
    b = ArmMetrics(arm="b", version=2, runs=40, feedback=happy, latencies_ms=[100.0 + (i * 3) % 8 for i in range(40)])
    by_metric = {c.metric: c for c in arm_comparisons([a, b])}
    feedback, latency = by_metric["feedback_mean"], by_metric["latency_mean"]
    assert feedback.significant and feedback.p is not None and feedback.p < 0.001
    assert feedback.statement.startswith("Significant: feedback mean of arm b (v2) 0.81 vs arm a (v1) -0.25")
    assert "Welch's test" in feedback.statement
    assert not latency.significant and latency.statement.startswith("No significant difference: mean latency")
    few = arm_comparisons(
        [ArmMetrics(arm="a", version=1, feedback=[-1.0] * 5), ArmMetrics(arm="b", version=2, feedback=[1.0] * 5)]
    )
    assert [c.statement.startswith("Not enough data") for c in few if c.metric == "feedback_mean"] == [True]
