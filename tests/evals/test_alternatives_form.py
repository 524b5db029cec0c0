"""A case's alternatives in the admin: refused as an import refuses them, their keys named on the page, the seed's
"in this order" path written as a line, and a stored ``ordered`` that is no boolean scored as not given.

Defect: the alternatives box stored what ``eval_set_apply`` refuses (``"orderd": true``, ``"ordered": "네"``,
``"ordered": "false"``), so the set's export no longer imported, and the scoring read ``"false"`` with ``bool()``:
in this order. The box fell back to JSON for the seed's own case (``"ordered": true``) without naming the keys.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from django.utils.translation import override

from agent_platform.errors import ApplicationError
from agents.models import Agent
from audit.models import AuditEvent
from evals.models import EvalCase, EvalCaseResult, EvalSet
from evals.services import eval_run_start, eval_set_apply, eval_set_create
from mcpregistry.models import McpServer, McpTool
from tests.evals.conftest import SEED_SET, bind_stock_server, scripted_agent
from tests.evals.test_case_editor import case, page_of, refused, sent_back
from tests.evals.test_eval_isolation import run_to_end, stock_set

SEED_ALTERNATIVES = json.loads(SEED_SET.read_text(encoding="utf-8"))["eval_sets"][0]["cases"][4]["alternatives"]
BACKUP = ["get_asset_status", "get_asset_status_backup"]


@pytest.fixture
def asset_set(db: Any) -> EvalSet:
    """A set whose agent binds a server with the seed's asset tools."""
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    server = McpServer.objects.create(mcp_id="company", name="company", command=sys.executable, args=[])
    for name in BACKUP:
        McpTool.objects.create(server=server, name=name, discovered_at=timezone.now())
    agent.servers.set([server])
    return eval_set_create(actor="test", via="tests", data={"name": "seed", "agent": agent})


def import_refusal(alternative: dict[str, Any]) -> str:
    """What ``eval_set_apply`` says of a case with ``alternative``, in Korean."""
    document = {"name": "imported", "cases": [{"query": "A-1001 상태?", "alternatives": [alternative]}]}
    with override("ko"), pytest.raises(ApplicationError) as refusal:
        eval_set_apply(document=document, actor="test", via="tests")
    return str(refusal.value.message)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("alternative", "problem"),
    [
        ({"tools": BACKUP, "orderd": True}, "alternatives.0.orderd: 알 수 없는 필드"),
        ({"tools": BACKUP, "ordered": "네"}, "alternatives.0.ordered: true 또는 false여야 합니다"),
        ({"tools": BACKUP, "ordered": "false"}, "alternatives.0.ordered: true 또는 false여야 합니다"),
        ({"tools": BACKUP, "note": 7}, "alternatives.0.note: 글이어야 합니다"),
    ],
)
def test_the_alternatives_box_refuses_what_an_import_refuses_in_its_words(
    admin_client: Client, asset_set: EvalSet, alternative: dict[str, Any], problem: str
) -> None:
    stored = case(asset_set, expected_tools=["get_asset_status"], alternatives=SEED_ALTERNATIVES)
    before = AuditEvent.objects.count()

    page = refused(admin_client, asset_set, **{"cases-0-alternatives": json.dumps([alternative])})

    assert problem in page
    assert problem in import_refusal(alternative)  # one rule, one wording
    stored.refresh_from_db()
    assert stored.alternatives == SEED_ALTERNATIVES and AuditEvent.objects.count() == before


@pytest.mark.django_db
def test_a_stored_alternative_an_import_would_refuse_is_shown_as_json_with_its_keys_and_refused_until_put_right(
    admin_client: Client, asset_set: EvalSet
) -> None:
    stored = case(asset_set, expected_tools=["get_asset_status"])
    EvalCase.objects.filter(pk=stored.pk).update(alternatives=[{"tools": BACKUP, "ordered": "false"}])  # an old row
    page = page_of(admin_client, asset_set)
    assert 'name="cases-0-alternatives"' in page and 'name="cases-0-alternatives__lines"' not in page
    note = _json_note(page)
    for key in ("tools", "note", "ordered"):
        assert f"“{key}”" in note or f'"{key}"' in note or f"&quot;{key}&quot;" in note, (key, note)

    page = refused(admin_client, asset_set)  # sent back as it is: to be put right, where it is shown
    assert "alternatives.0.ordered: true 또는 false여야 합니다" in page

    response = admin_client.post(
        f"/admin/evals/evalset/{asset_set.pk}/change/",
        sent_back(page_of(admin_client, asset_set), **{"cases-0-alternatives": json.dumps([{"tools": BACKUP}])}),
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    stored.refresh_from_db()
    assert stored.alternatives == [{"tools": BACKUP}]


def _json_note(page: str) -> str:
    """The note under the alternatives' JSON box."""
    after = page.split('name="cases-0-alternatives"', 1)[1]
    return after.split('<p class="help">', 1)[1].split("</p>", 1)[0]


@pytest.mark.django_db
def test_the_help_names_the_keys_and_the_line_syntax(admin_client: Client, asset_set: EvalSet) -> None:
    case(asset_set, expected_tools=["get_asset_status"])
    response = admin_client.get(f"/admin/evals/evalset/{asset_set.pk}/change/", HTTP_ACCEPT_LANGUAGE="en")
    page = response.content.decode()
    assert "separated by &gt; when they must be called in that order" in page
    assert (
        "&quot;tools&quot;: [tool names], &quot;note&quot;: &quot;text&quot;, &quot;ordered&quot;: true or false"
        in page
    )


@pytest.mark.django_db
def test_the_seeds_path_in_this_order_is_a_line_and_a_page_sent_back_unchanged_changes_nothing(
    admin_client: Client, asset_set: EvalSet
) -> None:
    stored = case(asset_set, expected_tools=["get_asset_status"], alternatives=SEED_ALTERNATIVES)
    before = AuditEvent.objects.count()
    page = page_of(admin_client, asset_set)
    line = f"get_asset_status &gt; get_asset_status_backup  # {SEED_ALTERNATIVES[0]['note']}</textarea>"
    assert line in page and 'name="cases-0-alternatives"' not in page  # lines, not JSON

    response = admin_client.post(f"/admin/evals/evalset/{asset_set.pk}/change/", sent_back(page))

    assert response.status_code == 302, response.content.decode()[-3000:]
    stored.refresh_from_db()
    assert stored.alternatives == SEED_ALTERNATIVES and AuditEvent.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("lines", "alternatives"),
    [
        ("get_asset_status > get_asset_status_backup  # 백업", [{"tools": BACKUP, "ordered": True, "note": "백업"}]),
        ("get_asset_status, get_asset_status_backup", [{"tools": BACKUP}]),  # as before: the case's own order
        ("get_asset_status_backup  # 백업 > 서버", [{"tools": ["get_asset_status_backup"], "note": "백업 > 서버"}]),
    ],
)
def test_tools_separated_by_a_greater_than_sign_are_an_alternative_in_this_order(
    admin_client: Client, asset_set: EvalSet, lines: str, alternatives: list[dict[str, Any]]
) -> None:
    stored = case(asset_set, expected_tools=["get_asset_status"])
    response = admin_client.post(
        f"/admin/evals/evalset/{asset_set.pk}/change/",
        sent_back(page_of(admin_client, asset_set), **{"cases-0-alternatives__lines": lines}),
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    stored.refresh_from_db()
    assert stored.alternatives == alternatives


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ([{"tools": BACKUP, "ordered": False}], False),  # no line says "in any order" against the case's box
        ([{"tools": ["get_asset_status"], "ordered": True}], False),  # one tool: no ">" to write
        ([{"tools": ["a>b"]}], False),  # would read back as two tools
        ([{"tools": BACKUP, "ordered": True}], True),
    ],
)
def test_only_what_a_line_reads_back_as_itself_is_shown_as_lines(
    admin_client: Client, asset_set: EvalSet, stored: list[dict[str, Any]], shown: bool
) -> None:
    case(asset_set, alternatives=stored)
    before = AuditEvent.objects.count()
    page = page_of(admin_client, asset_set)
    assert ('name="cases-0-alternatives__lines"' in page) is shown
    assert admin_client.post(f"/admin/evals/evalset/{asset_set.pk}/change/", sent_back(page)).status_code == 302
    assert EvalCase.objects.get(eval_set=asset_set).alternatives == stored and AuditEvent.objects.count() == before


@pytest.mark.django_db
def test_commas_and_greater_than_signs_on_one_line_are_refused_naming_the_line(
    admin_client: Client, asset_set: EvalSet
) -> None:
    case(asset_set, expected_tools=["get_asset_status"])
    lines = "get_asset_status_backup\nget_asset_status, get_asset_status_backup > get_asset_status"
    page = refused(admin_client, asset_set, **{"cases-0-alternatives__lines": lines})
    assert "2번째 줄:" in page
    assert f"{lines}</textarea>" in page.replace("&gt;", ">")  # shown again as typed


# ---- scoring a row stored before the box refused it ----------------------------------------------------------

TWO_CALLS = [
    {"tool_calls": [{"name": "lookup_stock", "args": {"sku": "X-1"}}]},
    {"tool_calls": [{"name": "shout", "args": {"text": "재고"}}]},
    {"content": "7개 있습니다"},
]


@pytest.fixture
def server(settings: Any) -> Iterator[McpServer]:
    cache.clear()
    yield bind_stock_server(settings)
    cache.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("ordered", "passed"), [("false", True), ("네", True), (True, False), (False, True)])
def test_a_stored_ordered_that_is_no_boolean_is_scored_as_not_given(
    server: McpServer, ordered: Any, passed: bool
) -> None:
    """The case's own ``ordered`` is off: the alternative, in the other order than the run's calls, passes unless it
    truly says in this order (``bool("false")`` said it did)."""
    agent = scripted_agent(slug="stock-agent", server=server, script=copy.deepcopy(TWO_CALLS))
    eval_set = stock_set({"key": "a", "query": "X-1 재고?", "expected_tools": ["explode"]})
    EvalCase.objects.filter(eval_set=eval_set).update(
        alternatives=[{"tools": ["shout", "lookup_stock"], "ordered": ordered}]
    )

    eval_run = run_to_end(eval_run_start(eval_set=eval_set, agent=agent, actor="test"))

    result = EvalCaseResult.objects.get(eval_run=eval_run)
    assert [c["name"] for c in result.called_tools] == ["lookup_stock", "shout"]
    assert result.passed is passed
