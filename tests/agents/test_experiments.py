"""The statistics behind the A/B page: Wilson intervals and the two-proportion z-test, and its plain statement."""

from __future__ import annotations

import math

import pytest

from agents.experiments import ArmMetrics, arm_comparisons, two_proportion_z, wilson


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
    success, citation = arm_comparisons([a, b])
    assert success.significant and success.statement.startswith("Significant")
    assert "two-proportion z-test" in success.statement
    assert not citation.significant and citation.statement.startswith("No significant difference")
    small = arm_comparisons(
        [ArmMetrics(arm="a", version=1, runs=5, succeeded=0), ArmMetrics(arm="b", version=2, runs=5, succeeded=5)]
    )
    assert not small[0].significant and small[0].statement.startswith("Not enough runs")


def test_the_feedback_interval_stays_on_the_minus_one_to_one_scale() -> None:
    metrics = ArmMetrics(arm="b", version=2, feedback=[1.0, 1.0, 0.5])
    low, high = metrics.feedback_interval()  # type: ignore[misc]
    assert high == 1.0 and -1.0 <= low < metrics.feedback_mean < high  # type: ignore[operator]
    low, high = ArmMetrics(arm="a", version=1, feedback=[-1.0, -1.0, -0.5]).feedback_interval()  # type: ignore[misc]
    assert low == -1.0 and high < 0
