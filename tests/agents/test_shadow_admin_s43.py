"""The shadow comparisons' list reads per candidate (seed 002 §11: compare before switching): a candidate filter,
and a summary above the list of each candidate's comparisons as filtered (how many, the share that agrees, mean
similarity, Δ latency and Δ tokens), for anyone who may view the list."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents.models import Agent, AgentVersion, Run, ShadowComparison
from tests.conftest import logged_in
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db

URL = "/admin/agents/shadowcomparison/"


def _compared(
    candidate: AgentVersion, *, agrees: bool, similarity: float, latency: float | None, tokens: int | None
) -> None:
    agent = candidate.agent
    live = Run.objects.create(agent=agent, query="q", status="succeeded")
    shadow = Run.objects.create(agent=agent, query="q", status="succeeded", purpose=Run.Purpose.SHADOW)
    ShadowComparison.objects.create(
        live_run=live,
        shadow_run=shadow,
        agent=agent,
        candidate=candidate,
        agrees=agrees,
        same_status=True,
        same_tools=agrees,
        same_args=True,
        answer_similarity=similarity,
        latency_delta_ms=latency,
        tokens_delta=tokens,
    )


@pytest.fixture
def two_candidates() -> tuple[AgentVersion, AgentVersion]:
    agent = Agent.objects.create(slug="helper", name="helper")
    first = AgentVersion.objects.create(agent=agent, number=1, content={}, digest="1" * 64)
    second = AgentVersion.objects.create(agent=agent, number=2, content={}, digest="2" * 64)
    _compared(first, agrees=True, similarity=1.0, latency=10.0, tokens=5)
    _compared(first, agrees=True, similarity=0.9, latency=20.0, tokens=-1)
    _compared(first, agrees=False, similarity=0.2, latency=None, tokens=2)
    _compared(second, agrees=False, similarity=0.5, latency=-30.0, tokens=None)
    return first, second


def _summary(client: Client, query: dict[str, Any] | None = None) -> list[list[str]]:
    response = client.get(URL, query or {})
    assert response.status_code == 200
    table = re.search(r'<table id="shadow-summary".*?</table>', response.content.decode(), re.S)
    assert table is not None, "no summary above the list"
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(0).split("<tbody>", 1)[1], re.S)
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<t[hd][^>]*>.*?</t[hd]>", row, re.S)]
        for row in rows
    ]


def test_the_list_sums_up_each_candidates_comparisons(admin_client: Client, two_candidates: Any) -> None:
    with CaptureQueriesContext(connection) as queries:
        rows = _summary(admin_client)
    assert rows == [
        ["helper v1", "3", "66.7 %", "0.70", "+15.0 ms", "+2.0"],
        ["helper v2", "1", "0.0 %", "0.50", "-30.0 ms", "—"],
    ]
    # One aggregate query, however many comparisons there are.
    assert len([q for q in queries.captured_queries if "AVG(" in q["sql"].upper()]) == 1


def test_the_summary_follows_the_filters_and_the_candidate_is_one(admin_client: Client, two_candidates: Any) -> None:
    first, second = two_candidates
    page = admin_client.get(URL).content.decode()
    # The candidate filter offers each compared version.
    assert f"candidate__id__exact={first.pk}" in page and f"candidate__id__exact={second.pk}" in page
    assert _summary(admin_client, {"candidate__id__exact": second.pk}) == [
        ["helper v2", "1", "0.0 %", "0.50", "-30.0 ms", "—"]
    ]
    assert _summary(admin_client, {"agrees__exact": "1"}) == [["helper v1", "2", "100.0 %", "0.95", "+15.0 ms", "+2.0"]]


def test_a_user_who_may_only_view_the_list_sees_the_summary(two_candidates: Any) -> None:
    viewer = logged_in(staff("vera", perms=("agents.view_shadowcomparison",)))
    assert [row[:3] for row in _summary(viewer)] == [["helper v1", "3", "66.7 %"], ["helper v2", "1", "0.0 %"]]
