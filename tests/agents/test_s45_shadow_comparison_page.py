"""A shadow comparison's page reads at a glance (review s45): the verdict and what differs, the candidate linked,
the similarity as a percentage, the latency and token differences with their units, and the two runs side by side,
each linked, with its answer (masked as stored, escaped, Korean as written) and its tool calls (each tool with its
masked arguments as one line of JSON). It showed every stored field as is: the tools as a JSON list, no answer."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils.html import escape

from agents.execution import run_execute
from agents.models import Agent, Run, ShadowComparison
from tests.agents.test_shadow import live_run, with_candidate
from tests.conftest import logged_in
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db

TOOL = "sds-company-data.get_asset_status"


@pytest.fixture
def comparison(demo_agent: Agent) -> ShadowComparison:
    """A live run on v1 and its shadow on v2 (the real demo server), whose asset answers differ."""
    with_candidate(demo_agent, "후보 답변: {result.asset_id} 자산")
    run = live_run(demo_agent)
    run_execute(run_id=str(Run.objects.get(shadow_of=run).id))
    return ShadowComparison.objects.select_related("live_run", "shadow_run", "candidate").get(live_run=run)


def page(client: Client, comparison: ShadowComparison) -> str:
    response = client.get(f"/admin/agents/shadowcomparison/{comparison.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


def side(html: str, number: int) -> str:
    found = re.search(rf'<section class="shadow-side" id="shadow-side-{number}">(.*?)</section>', html, re.S)
    assert found is not None, f"no run {number} on the page"
    return found.group(1)


def test_the_page_sets_the_two_answers_and_tool_calls_side_by_side_with_links_to_both_runs(
    admin_client: Client, comparison: ShadowComparison
) -> None:
    live, shadow = comparison.live_run, comparison.shadow_run
    assert live.answer and shadow.answer == "후보 답변: A-1001 자산"

    html = page(admin_client, comparison)

    live_side, shadow_side = side(html, 1), side(html, 2)
    assert escape(live.answer) in live_side and f'href="/admin/agents/run/{live.pk}/change/"' in live_side
    assert "후보 답변: A-1001 자산" in shadow_side and f'href="/admin/agents/run/{shadow.pk}/change/"' in shadow_side
    # Each tool call by name, with its masked arguments as one line of JSON (Korean and quotes escaped, not \\u).
    for one in (live_side, shadow_side):
        assert f"<code>{TOOL}</code>" in one
        assert escape('{"asset_id": "A-1001"}') in one
    # The verdict, what differs, the candidate linked, the similarity as a percentage, the units.
    figures = re.sub(r"<[^>]+>", " ", html[html.index('id="shadow-verdict"') : html.index('class="shadow-pair"')])
    assert "differs" in figures and "answer" in figures
    assert f'href="/admin/agents/agentversion/{comparison.candidate_id}/change/"' in html
    assert f"{100 * comparison.answer_similarity:.1f} %" in figures
    assert re.search(r"[+-][0-9.]+ ms", figures) and re.search(r"[+-][0-9]+ tokens", figures)
    # No stored field as is: neither tools list as JSON.
    assert "field-live_tools" not in html and "field-shadow_tools" not in html
    assert f'["{TOOL}"]' not in html and escape(f'["{TOOL}"]') not in html


def test_an_answer_is_escaped_keeps_its_korean_and_a_long_one_is_whole(
    admin_client: Client, comparison: ShadowComparison
) -> None:
    answer = '<script>alert("x")</script> 한국어 답변 ' + "긴답변" * 400
    Run.objects.filter(pk=comparison.shadow_run_id).update(answer=answer)

    shadow_side = side(page(admin_client, comparison), 2)

    assert "<script>" not in shadow_side and escape(answer) in shadow_side


def test_the_answers_and_arguments_are_for_whoever_may_view_runs(comparison: ShadowComparison) -> None:
    reviewer = logged_in(staff("vera", perms=("agents.view_shadowcomparison",)))
    html = page(reviewer, comparison)
    assert comparison.live_run.answer not in html and "후보 답변" not in html
    assert "A-1001" not in html and f"<code>{TOOL}</code>" in side(html, 1)  # the stored names, no arguments
    assert "/admin/agents/run/" not in html

    reader = logged_in(staff("rita", perms=("agents.view_shadowcomparison", "agents.view_run")))
    html = page(reader, comparison)
    assert (
        "후보 답변: A-1001 자산" in side(html, 2)
        and f'href="/admin/agents/run/{comparison.live_run_id}/change/"' in html
    )


def test_a_run_that_no_longer_exists_is_said_to_be_gone(admin_client: Client, comparison: ShadowComparison) -> None:
    # Its row deleted past the cascade while the page is read (the foreign keys are checked when the test ends, by
    # which time it is back).
    gone = Run.objects.get(pk=comparison.shadow_run_id)
    Run.objects.filter(pk=gone.pk)._raw_delete(connection.alias)
    try:
        html = page(admin_client, comparison)
    finally:
        Run.objects.bulk_create([gone])

    assert escape(comparison.live_run.answer) in side(html, 1)
    shadow_side = side(html, 2)
    assert "This run no longer exists." in shadow_side and str(comparison.shadow_run_id)[:8] in shadow_side
    assert f"<code>{TOOL}</code>" in shadow_side  # the stored names
    assert f"/admin/agents/run/{comparison.shadow_run_id}/" not in html


def test_the_page_reads_in_korean(admin_client: Client, comparison: ShadowComparison) -> None:
    admin_client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ko"
    html = page(admin_client, comparison)
    assert "후보 답변: A-1001 자산" in side(html, 2)
    assert "field-live_tools" not in html
