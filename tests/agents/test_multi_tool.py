"""Seed 001's ``multi_tool`` eval question ("'프린터가 고장 났어요' 문의 부서를 분류하고 48건이 12% 늘면 몇 건인지
계산해줘.", expected tools ``classify_request, calculate``) end to end on the demo setup: by the model (scripted
turns) and by the demo's deterministic rules, both through the gate.

``classify_request`` reads its table in the local runner's worker thread, on that thread's own database
connection: these tests commit their data (``transaction=True``) as production does.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from agents.execution import run_execute
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry.builtin_tools import calculate
from mcpregistry.models import McpServer, RequestCategory
from mcpregistry.services import request_category_update
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "'프린터가 고장 났어요' 문의 부서를 분류하고 48건이 12% 늘면 몇 건인지 계산해줘."


@pytest.fixture
def demo() -> McpServer:
    """``seed_demo`` without starting the demo MCP server: the local tools are bound and listed all the same."""
    call_command("seed_demo", "--no-discover", stdout=io.StringIO())
    return McpServer.objects.get(mcp_id="local")


def tools_called(run: Run) -> list[tuple[str, bool]]:
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call", attempt__gte=1).order_by("id")
    return list(calls.values_list("tool", "ok"))


def test_the_demo_agent_binds_the_local_tools_beside_its_mcp_server(demo) -> None:
    agent = Agent.objects.get(slug="company-assistant")
    assert set(agent.servers.values_list("mcp_id", flat=True)) == {"sds-company-data", "local"}
    assert set(demo.tools.values_list("name", flat=True)) == {"calculate", "classify_request"}
    assert set(demo.tools.values_list("contract__risk", flat=True)) == {"read"}


def test_the_demo_agents_answer_when_no_rule_matched_says_what_it_answers(demo) -> None:
    """Seed 001's no-tool question got "ask otherwise" and nothing of what the demo answers."""
    from agents.management.commands.seed_demo import NO_MATCH_ANSWER

    run = Run.objects.create(agent=Agent.objects.get(slug="company-assistant"), query="어떤 일을 도와줄 수 있어?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, NO_MATCH_ANSWER)


@pytest.mark.parametrize("query", ["'프린터가 고장 났어요' 문의 부서 분류해줘", "48건이 12% 늘면 몇 건인지 계산해줘"])
def test_the_local_examples_the_no_match_answer_gives_are_answered_by_the_rules(demo, query: str) -> None:
    from agents.management.commands.seed_demo import NO_MATCH_ANSWER

    assert f"({query})" in NO_MATCH_ANSWER
    run = Run.objects.create(agent=Agent.objects.get(slug="company-assistant"), query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.deterministic_results, (run.error_message, run.answer)
    # A run no key submitted acts as the platform, by its purpose: "local" read as the local tools' server.
    assert set(AuditEvent.objects.filter(run_id=run.id).values_list("actor", flat=True)) == {"system:live"}


def test_the_multi_tool_question_is_answered_by_the_demo_rules_with_both_local_tools(demo) -> None:
    run = Run.objects.create(agent=Agent.objects.get(slug="company-assistant"), query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert tools_called(run) == [("classify_request", True), ("calculate", True)]
    assert "IT지원팀" in run.answer
    assert "53.76" in run.answer
    results = {r["tool"]: r for r in run.deterministic_results}
    assert results["classify_request"]["value"] == {"department": "IT지원팀", "matched": ["프린터", "고장"]}
    assert results["calculate"]["args"] == {"expression": "48 * (1 + 12 / 100)"}


def test_the_multi_tool_question_is_answered_by_the_model_calling_both_local_tools(demo) -> None:
    agent = make_agent(
        slug="multi-tool",
        servers=[demo],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {
                "tool_calls": [
                    {"name": "classify_request", "args": {"request": "프린터가 고장 났어요"}},
                    {"name": "calculate", "args": {"expression": "48 * 1.12"}},
                ]
            },
            {"content": "분류와 계산 결과: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert sorted(tools_called(run)) == [("calculate", True), ("classify_request", True)]
    assert "53.76" in run.answer
    sources = set(AuditEvent.objects.filter(run_id=run.id, action="tool.call").values_list("source", flat=True))
    assert sources == {"agent"}


def test_an_admin_edit_of_the_category_table_changes_the_classification(demo) -> None:
    printers = RequestCategory.objects.get(department="IT지원팀")
    request_category_update(category=printers, actor="admin:kim", via="admin", data={"keywords": ["노트북"]})
    run = Run.objects.create(agent=Agent.objects.get(slug="company-assistant"), query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    results = {r["tool"]: r for r in run.deterministic_results}
    assert results["classify_request"]["value"]["department"] == "미분류"
    assert AuditEvent.objects.filter(action="config.request_category.update").count() == 1


def test_the_question_typed_in_full_width_digits_is_calculated_not_told_to_try_later(demo) -> None:
    """A Korean input method in full-width mode types "４８건이 １２% 늘면": the demo rule's ``\\d`` matches those
    digits and sent them to ``calculate``, which refused them ("invalid character"), and the user read that the
    information could not be had right now. Full-width ASCII is read as the ASCII it stands for; nothing else is
    (a superscript "²" is no digit 2)."""
    typed = QUESTION.replace("48", "４８").replace("12", "１２")
    run = Run.objects.create(agent=Agent.objects.get(slug="company-assistant"), query=typed)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert tools_called(run) == [("classify_request", True), ("calculate", True)]
    assert "53.76" in run.answer
    assert calculate.func("（４８　＋　２）＊２") == "100"
    with pytest.raises(ValueError):
        calculate.func("3²")
