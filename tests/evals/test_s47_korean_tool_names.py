"""A tool a server lists under a decomposed (NFD) Korean name, as one written on macOS does: a case expecting it
(stored composed, as every case's text is) is written in the admin and scored as met by the run's call, which the
audit records under the server's own name. The scoring compared the names as raw strings (every run failed
``tools:mismatch``) and the admin refused the name as "no server has a tool of this name".

This module is also the local tool module the test binds (``KOREAN_TOOL``)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from agents.engine import model_tool_names
from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from evals.models import EvalCaseResult, EvalRun
from evals.services import eval_run_refresh, eval_run_start, eval_set_apply, eval_set_create
from mcpregistry.local_tools import local_tool
from mcpregistry.models import McpServer, ToolContract
from tests.conftest import discover_as_admin
from tests.evals.conftest import scripted_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

COMPOSED = "직원검색"
DECOMPOSED = unicodedata.normalize("NFD", COMPOSED)
MODULE = __name__
EDITED = ("expected_tools", "forbidden_tools", "answer_checks", "alternatives", "context", "data")


@local_tool(name=DECOMPOSED)
def employee_lookup(name: str) -> dict[str, Any]:
    """직원을 이름으로 찾는다."""
    return {"name": name, "team": "클라우드 운영팀"}


@pytest.fixture
def server(settings: Any) -> Iterator[McpServer]:
    cache.clear()
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    server = McpServer(mcp_id="hangul", name="hangul", transport=McpServer.Transport.LOCAL, args=[MODULE])
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    assert list(server.tools.values_list("name", flat=True)) == [DECOMPOSED]
    yield server
    cache.clear()


def test_a_case_expecting_a_tool_listed_decomposed_passes_when_the_run_calls_it(server: McpServer) -> None:
    alias = model_tool_names([DECOMPOSED])[DECOMPOSED]  # the name the model is given (providers take no Hangul)
    script = [{"tool_calls": [{"name": alias, "args": {"name": "김하늘"}}]}, {"content": "클라우드 운영팀입니다."}]
    agent = scripted_agent(slug="hangul-agent", server=server, script=script)
    eval_set = eval_set_apply(
        document={
            "name": "hangul",
            "cases": [
                {"key": "k", "query": "김하늘 님 팀?", "type": "single_tool", "expected_tools": [COMPOSED]},
                {"key": "f", "query": "김하늘 님 팀?", "type": "no_answer", "forbidden_tools": [COMPOSED]},
            ],
        },
        actor="test",
        via="tests",
    ).eval_set
    assert eval_set.cases.get(key="k").expected_tools == [{"name": COMPOSED}]  # stored composed

    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test")
    for _round in range(10):
        for run_id in Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED).values_list(
            "id", flat=True
        ):
            run_execute(run_id=str(run_id))
        eval_run = eval_run_refresh(eval_run=eval_run, window=4)
        if eval_run.status == EvalRun.Status.FINISHED:
            break
    assert eval_run.status == EvalRun.Status.FINISHED
    assert set(AuditEvent.objects.filter(action="tool.call").values_list("tool", flat=True)) == {DECOMPOSED}

    expected = EvalCaseResult.objects.get(eval_run=eval_run, case__key="k")
    assert expected.passed, (expected.scores, expected.called_tools, expected.answer)
    assert (expected.scores["precision"], expected.scores["recall"]) == (1.0, 1.0)
    forbidden = EvalCaseResult.objects.get(eval_run=eval_run, case__key="f")
    assert forbidden.scores["forbidden_violations"] == 1
    assert "tools:forbidden" in forbidden.scores["failed_checks"]


def test_the_admin_takes_the_composed_name_of_a_tool_listed_decomposed(server: McpServer, admin_client: Client) -> None:
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "hangul"})
    data = {
        "name": "hangul",
        "description": "",
        "thresholds": "{}",
        "cases-TOTAL_FORMS": "1",
        "cases-INITIAL_FORMS": "0",
        "cases-0-key": "k",
        "cases-0-order": "0",
        "cases-0-case_type": "single_tool",
        "cases-0-query": "김하늘 님 팀?",
        "cases-0-expected_tools__lines": COMPOSED,
        "cases-0-forbidden_tools__lines": "",
        "cases-0-alternatives__lines": "",
        "cases-0-answer_checks__contains": "",
        "cases-0-answer_checks__regex": "",
        "cases-0-context__lines": "",
        "cases-0-data__lines": "",
        "cases-0-note": "",
        **{f"cases-0-{f}__editor": "1" for f in EDITED},
    }
    response = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="en")
    assert response.status_code == 302, response.context and [
        f.errors for f in response.context["inline_admin_formsets"][0].formset.forms
    ]
    assert eval_set.cases.get(key="k").expected_tools == [{"name": COMPOSED}]
