"""A/B arms compared: per-arm metrics of live runs, confidence intervals, and whether a difference is significant.

An arm moved to another version mid-experiment has a row per version (``arm_metrics``): each row is one version's
runs. Proportions (success rate, tool-citation rate) get a 95 % Wilson interval and are compared with the first row
by a **two-proportion z-test** (pooled standard error, two-sided); means (feedback, latency) get a
95 % interval from Student's t (``t975``: with a handful of ratings the normal one was several times too narrow)
and are compared by **Welch's test** (unequal variances, two-sided, the normal approximation: it is only applied
from ``MIN_RUNS`` observations per arm, where it holds). "Significant" means p < 0.05; with fewer than ``MIN_RUNS``
observations in either arm nothing is called significant. A p-value is shown to three decimals, or as many more as
keep it on its side of 0.05 (``p_text``). Percentiles interpolate between the closest ranks, as the benches' do
(``bench._stats.percentile``): a p50 is the median.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext as _

from agents.models import Agent, Run

Z95 = 1.959963984540054
MIN_RUNS = 30
ALPHA = 0.05

# Student's t 0.975 quantiles for 1 to 30 degrees of freedom (the tables' values, to three decimals).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` degrees of freedom: the table to 30, beyond it the Cornish-Fisher
    expansion around ``Z95`` (within 0.001 of the exact value there)."""
    if df <= len(_T975):
        return _T975[max(df, 1) - 1]
    z = Z95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass
class ArmMetrics:
    arm: str
    version: int | None
    runs: int = 0
    succeeded: int = 0
    cited: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    model_calls: list[int] = field(default_factory=list)
    feedback: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The arm and the version its runs ran, as the page and the statements name a row: ``b (v3)``."""
        return self.arm if self.version is None else f"{self.arm} (v{self.version})"

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.runs if self.runs else None

    @property
    def citation_rate(self) -> float | None:
        return self.cited / self.runs if self.runs else None

    def success_interval(self) -> tuple[float, float] | None:
        return wilson(self.succeeded, self.runs)

    def citation_interval(self) -> tuple[float, float] | None:
        return wilson(self.cited, self.runs)

    def latency(self, q: float) -> float | None:
        return percentile(self.latencies_ms, q)

    @property
    def latency_p50(self) -> float | None:
        return self.latency(0.5)

    @property
    def latency_p95(self) -> float | None:
        return self.latency(0.95)

    @property
    def tokens_per_run(self) -> float | None:
        return statistics.fmean(self.tokens) if self.tokens else None

    @property
    def model_calls_per_run(self) -> float | None:
        return statistics.fmean(self.model_calls) if self.model_calls else None

    @property
    def feedback_mean(self) -> float | None:
        return statistics.fmean(self.feedback) if self.feedback else None

    def feedback_interval(self) -> tuple[float, float] | None:
        if len(self.feedback) < 2:
            return None
        half = t975(len(self.feedback) - 1) * statistics.stdev(self.feedback) / math.sqrt(len(self.feedback))
        mean = statistics.fmean(self.feedback)
        # Scores are on -1..1: the interval is cut to the scale.
        return max(-1.0, mean - half), min(1.0, mean + half)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0 to 1) of ``values``, interpolated linearly between the closest ranks (as
    ``statistics.quantiles(method="inclusive")`` and the benches read it); None without values. It was the value at
    the rounded rank, and Python rounds halves to even: the p50 of 100 and 200 ms read 100, of four runs the upper
    middle one, of six the lower."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def p_text(p: float) -> str:
    """``p`` to three decimals, or to as many more as keep the text on the side of ``ALPHA`` that ``p`` is on:
    0.0496 read "p = 0.050" in a statement that called it significant (p < 0.05)."""
    for digits in range(3, 12):
        text = f"{p:.{digits}f}"
        if (float(text) < ALPHA) == (p < ALPHA):
            return text
    return repr(p)


def wilson(successes: int, n: int) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of a proportion (None without observations)."""
    if n == 0:
        return None
    p = successes / n
    denominator = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denominator
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float] | None:
    """(z, two-sided p) of the two-proportion z-test with the pooled standard error; None when undefined."""
    if n1 == 0 or n2 == 0:
        return None
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return None
    z = (x1 / n1 - x2 / n2) / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def welch_z(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """(z, two-sided p) of Welch's test of ``mean(a) == mean(b)`` (normal approximation); None when undefined
    (fewer than two observations in an arm, or no variance in either and equal means: nothing to tell apart).

    Without variance in either arm and different means (every rating -1 in one, +1 in the other) the result is
    (±inf, 0), the limit as the variances shrink: every observation of one arm differs from every one of the
    other by the same amount, the clearest difference there is. It was None, and the page said "no significant
    difference" of arms that disagreed on every run."""
    if len(a) < 2 or len(b) < 2:
        return None
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    difference = statistics.fmean(a) - statistics.fmean(b)
    if se == 0:
        return None if difference == 0 else (math.copysign(math.inf, difference), 0.0)
    z = difference / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def _cited(run: Run) -> bool:
    """The answer is backed by a successful tool result: a deterministic call or a model's tool call that
    succeeded, in a run that succeeded."""
    if run.status != Run.Status.SUCCEEDED:
        return False
    if any(r.get("ok") for r in run.deterministic_results or []):
        return True
    return any(
        m.get("type") in {"tool", "flow_call"} and (m.get("status") == "success" or m.get("ok") is True)
        for m in run.messages or []
    )


def arm_metrics(*, agent: Agent) -> list[ArmMetrics]:
    """Metrics of the agent's finished live runs that ran under an arm, one row per arm and version: an arm moved
    to another version has a row for each, never one that pools two versions' runs. In arm name order, each arm's
    versions oldest first (runs of a deleted version last)."""
    arms: dict[tuple[str, int | None], ArmMetrics] = {}
    runs = (
        Run.objects.filter(agent=agent, purpose=Run.Purpose.LIVE, status__in=[Run.Status.SUCCEEDED, Run.Status.FAILED])
        .exclude(arm="")
        .select_related("version")
        .only(
            "arm",
            "version__number",
            "status",
            "deterministic_results",
            "messages",
            "timings",
            "token_usage",
            "feedback_score",
        )
    )
    for run in runs.iterator():
        number = run.version.number if run.version else None
        metrics = arms.setdefault((run.arm, number), ArmMetrics(arm=run.arm, version=number))
        metrics.runs += 1
        metrics.succeeded += run.status == Run.Status.SUCCEEDED
        metrics.cited += _cited(run)
        total_ms = (run.timings or {}).get("total_ms")
        if total_ms is not None:
            metrics.latencies_ms.append(float(total_ms))
        usage: dict[str, Any] = run.token_usage or {}
        metrics.tokens.append(int(usage.get("total_tokens") or 0))
        metrics.model_calls.append(int(usage.get("model_calls") or 0))
        if run.feedback_score is not None:
            metrics.feedback.append(float(run.feedback_score))
    return sorted(arms.values(), key=lambda m: (m.arm, m.version is None, m.version or 0))


@dataclass
class Comparison:
    metric: str
    arm: str
    baseline: str
    z: float | None
    p: float | None
    significant: bool
    statement: str


def _statement(*, enough: bool, significant: bool, values: dict[str, Any]) -> str:
    if not enough:
        return (
            _(
                "Not enough data to tell: %(metric)s of arm %(arm)s %(a)s vs arm %(base)s %(b)s (fewer than %(min)s "
                "observations in an arm; %(test)s)."
            )
            % values
        )
    if significant:
        return (
            _("Significant: %(metric)s of arm %(arm)s %(a)s vs arm %(base)s %(b)s, p = %(p)s (%(test)s, p < 0.05).")
            % values
        )
    return (
        _(
            "No significant difference: %(metric)s of arm %(arm)s %(a)s vs arm %(base)s %(b)s, p = %(p)s (%(test)s, "
            "p ≥ 0.05)."
        )
        % values
    )


def arm_comparisons(arms: list[ArmMetrics]) -> list[Comparison]:
    """Each row (an arm and a version) against the first: success and citation rates (two-proportion z-test),
    feedback mean and mean latency (Welch's test), each with a plain statement of the result naming the rows by
    arm and version."""
    if len(arms) < 2:
        return []
    base = arms[0]
    found = []
    for other in arms[1:]:
        tests: list[tuple[str, str, tuple[float, float] | None, int, str, str, str]] = []
        for metric, label, x1, x2 in (
            ("success_rate", _("success rate"), other.succeeded, base.succeeded),
            ("citation_rate", _("tool-citation rate"), other.cited, base.cited),
        ):
            tests.append(
                (
                    metric,
                    label,
                    two_proportion_z(x1, other.runs, x2, base.runs),
                    min(other.runs, base.runs),
                    f"{x1 / other.runs:.1%}" if other.runs else "-",
                    f"{x2 / base.runs:.1%}" if base.runs else "-",
                    _("two-proportion z-test"),
                )
            )
        for metric, label, a, b, unit in (
            ("feedback_mean", _("feedback mean"), other.feedback, base.feedback, ""),
            ("latency_mean", _("mean latency"), other.latencies_ms, base.latencies_ms, " ms"),
        ):
            tests.append(
                (
                    metric,
                    label,
                    welch_z(a, b),
                    min(len(a), len(b)),
                    f"{statistics.fmean(a):.2f}{unit}" if a else "-",
                    f"{statistics.fmean(b):.2f}{unit}" if b else "-",
                    _("Welch's test"),
                )
            )
        for metric, label, test, observed, shown_a, shown_b, test_name in tests:
            enough = observed >= MIN_RUNS
            significant = bool(test and enough and test[1] < ALPHA)
            values = {
                "metric": label,
                "arm": other.label,
                "base": base.label,
                "a": shown_a,
                "b": shown_b,
                "p": p_text(test[1]) if test else "-",
                "min": MIN_RUNS,
                "test": test_name,
            }
            found.append(
                Comparison(
                    metric=metric,
                    arm=other.arm,
                    baseline=base.arm,
                    z=test[0] if test else None,
                    p=test[1] if test else None,
                    significant=significant,
                    statement=_statement(enough=enough, significant=significant, values=values),
                )
            )
    return found
