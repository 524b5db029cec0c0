"""Local tools, defects s43 localtools (the tools are defined here: this module is the binding).

1. A business rule on a local tool's ``args_schema`` (a Pydantic ``field_validator``) was not checked before the
   call: LangChain's ``tool_call_schema`` is a copy without validators. The function's own parsing then refused the
   arguments as a ``tool:error`` "do not retry" with Pydantic's English dump (its URL too), never counted by the
   self-correction cap: the model repeated it until ``max_iterations``. The rule is now an ``args:*`` refusal with
   the author's own words, and the cap withdraws the tool. ``calculate``'s refusals of an expression as written
   (``1000 + 10%``, which says how to write it) are ``args:*`` refusals too (``ArgumentRefused``).
2. A local tool's texts were English under a Korean agent: the worker thread did not have the caller's language.
3. An unexpected exception's message carried internal addresses, ports and file paths to the model, the end user
   and the API caller: they are left out now (``mask_internal_locations``); an error raised on purpose keeps its text.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import translation
from langchain_core.tools import ToolException
from pydantic import BaseModel, Field, field_validator

from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from audit.change_guard import change_scope
from audit.masking import mask_internal_locations
from mcpregistry import gate
from mcpregistry.local_tools import LocalToolRunner, local_tool
from mcpregistry.models import McpServer, ToolContract
from tests.conftest import discover_as_admin, make_agent

MODULE = "tests.mcpregistry.test_local_tools_s43"
EXECUTED: dict[str, list[Any]] = defaultdict(list)
RULE = "허용되지 않은 테이블 '{table}' 접근 시도입니다. 허용 테이블: ['users', 'orders']"
LEAK = (
    "could not connect to 10.0.3.17:5432 via /srv/platform/internal/db.py line 42; "
    "dsn=postgresql://app:S3cr3t-Pa55@10.0.3.17:5432/hr password=S3cr3t-Pa55"
)


class QueryArgs(BaseModel):
    table_name: str = Field(description="조회 대상 테이블 이름")
    limit: int = Field(default=10, ge=1, le=100)

    @field_validator("table_name")
    @classmethod
    def allowed(cls, value: str) -> str:
        if value.strip().lower() not in ["users", "orders"]:
            raise ValueError(RULE.format(table=value))
        return value


@local_tool(args_schema=QueryArgs)
def query_db(table_name: str, limit: int = 10) -> str:
    """테이블을 조회한다."""
    EXECUTED["query_db"].append(table_name)
    return "[]"


@local_tool
def leaky(name: str) -> str:
    """백엔드를 부른다."""
    raise ConnectionError(LEAK)


@local_tool
def on_purpose(name: str) -> str:
    """일부러 실패한다."""
    raise ToolException("자산 서버 10.0.3.17 은 점검 중입니다")


@local_tool
async def says_in_language(name: str) -> str:
    """호출한 쪽의 언어로 말한다."""
    return translation.gettext("must be a whole number")


@pytest.fixture(autouse=True)
def allowed_modules(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    EXECUTED.clear()


@pytest.fixture
def runner() -> Iterator[LocalToolRunner]:
    runner = LocalToolRunner(max_workers=2)
    yield runner
    runner._executor.shutdown(wait=True)


def bind(paths: list[str], mcp_id: str = "local-s43") -> McpServer:
    with change_scope(actor="tests", via="tests"):
        server = McpServer(mcp_id=mcp_id, name=mcp_id, transport=McpServer.Transport.LOCAL, args=paths, timeout_s=5)
        server.full_clean()
        server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    return server


def call(server: McpServer, tool: str, args: dict[str, Any]) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin"))


def local(runner: LocalToolRunner, path: str, tool: str, args: dict[str, Any]) -> Any:
    return runner.call_tool({"args": [path]}, tool, args, timeout_s=5)


# 1. business rules and calculate's refusals ------------------------------------------------------------------


def test_a_business_rule_of_the_args_schema_refuses_the_arguments_before_the_call(runner: LocalToolRunner) -> None:
    out = local(runner, f"{MODULE}.query_db", "query_db", {"table_name": "passwords"})
    assert (out.is_error, out.refused) == (True, "args:type:table_name")
    assert out.text == "'table_name' " + RULE.format(table="passwords")
    assert "pydantic" not in out.text
    assert EXECUTED["query_db"] == []
    assert local(runner, f"{MODULE}.query_db", "query_db", {"table_name": "users"}).text == "[]"


@pytest.mark.django_db
def test_the_gate_tells_the_model_to_fix_a_business_rules_refusal() -> None:
    server = bind([f"{MODULE}.query_db"])
    refused = call(server, "query_db", {"table_name": "passwords"})
    assert (refused.ok, refused.error) == (False, "args:type:table_name")
    assert "Fix the argument as the details say and call it again." in refused.message
    assert "허용되지 않은 테이블" in refused.message and "errors.pydantic.dev" not in refused.message
    assert EXECUTED["query_db"] == []


@pytest.mark.django_db
def test_a_model_repeating_a_business_rules_refusal_has_the_tool_withdrawn() -> None:
    server = bind([f"{MODULE}.query_db"])
    bad = {"tool_calls": [{"name": "query_db", "args": {"table_name": "passwords"}}]}
    agent = make_agent(
        slug="s43-repeat", servers=[server], provider="scripted", with_demo_rules=False, script=[bad] * 12
    )
    with change_scope(actor="tests", via="tests"):
        Agent.objects.filter(pk=agent.pk).update(language="ko", max_iterations=6)
    run = Run.objects.create(agent=agent, query="passwords 테이블 보여줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    errors = [m.get("error") for m in run.messages if m.get("type") == "tool"]
    assert errors[:3] == ["args:type:table_name"] * 3
    assert [m for m in run.messages if m.get("type") == "tool_withdrawn"]
    assert EXECUTED["query_db"] == []


def test_calculates_refusal_of_an_expression_as_written_is_an_argument_refusal(runner: LocalToolRunner) -> None:
    path = "mcpregistry.builtin_tools.calculate"
    ambiguous = local(runner, path, "calculate", {"expression": "1000 + 10%"})
    assert (ambiguous.is_error, ambiguous.refused) == (True, "args:type:expression")
    assert "1000 * 1.1" in ambiguous.text and not ambiguous.text.startswith("ArgumentRefused")
    for expression in ("import os", "abs(1)", "15 % - 1000"):
        assert local(runner, path, "calculate", {"expression": expression}).refused == "args:type:expression"
    # What fails in computing a well-written expression stays the tool's error.
    zero = local(runner, path, "calculate", {"expression": "1 / 0"})
    assert (zero.is_error, zero.refused, zero.text) == (True, "", "ValueError: division by zero")


@pytest.mark.django_db
def test_calculates_fixable_refusal_in_a_run_asks_the_model_to_fix_it() -> None:
    server = bind(["mcpregistry.builtin_tools.calculate"], mcp_id="calc-s43")
    agent = make_agent(
        slug="s43-calc",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": "calculate", "args": {"expression": "1000 + 10%"}}]}, {"content": "끝"}],
    )
    with change_scope(actor="tests", via="tests"):
        Agent.objects.filter(pk=agent.pk).update(language="ko")
    run = Run.objects.create(agent=agent, query="1000원에 10% 더하면?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    [message] = [m for m in run.messages if m.get("type") == "tool"]
    assert message["error"] == "args:type:expression"
    assert "지금은 다시 시도하지 말고" not in json.dumps(message, ensure_ascii=False)


# 2. the caller's language ------------------------------------------------------------------------------------


def test_a_local_tools_texts_are_in_the_callers_language(runner: LocalToolRunner) -> None:
    with translation.override("ko"):
        limit = local(runner, f"{MODULE}.query_db", "query_db", {"table_name": "users", "limit": "ten"})
        syntax = local(runner, "mcpregistry.builtin_tools.calculate", "calculate", {"expression": "import os"})
    assert "'limit'" in limit.text and "정수여야 합니다" in limit.text and "whole number" not in limit.text
    assert "산술식이 아닙니다" in syntax.text and "arithmetic" not in syntax.text
    with translation.override("ko"):
        awaited = local(runner, f"{MODULE}.says_in_language", "says_in_language", {"name": "x"})
    assert awaited.text == "정수여야 합니다"  # a coroutine tool too


# 3. internal locations ---------------------------------------------------------------------------------------


def test_an_unexpected_exception_leaves_out_internal_addresses_and_paths(runner: LocalToolRunner) -> None:
    out = local(runner, f"{MODULE}.leaky", "leaky", {"name": "김하늘"})
    assert out.is_error and not out.refused
    assert out.text.startswith("ConnectionError: could not connect to [internal address] via [path];")
    for leaked in ("10.0.3.17", "5432", "/srv/platform", "line 42"):
        assert leaked not in out.text
    # An error raised on purpose is the author's text, as written.
    kept = local(runner, f"{MODULE}.on_purpose", "on_purpose", {"name": "x"})
    assert kept.text == "ToolException: 자산 서버 10.0.3.17 은 점검 중입니다"


@pytest.mark.django_db
def test_a_failed_rules_answer_and_the_api_leave_out_internal_locations() -> None:
    from agents.api.serializers import RunOutputSerializer

    server = bind([f"{MODULE}.leaky"])
    agent = make_agent(slug="s43-leaky", servers=[server], provider="offline", with_demo_rules=False)
    with change_scope(actor="tests", via="tests"):
        DeterministicRule.objects.create(
            agent=agent,
            server=server,
            name="r",
            order=1,
            tool_name="leaky",
            when={"any_keywords": ["소속"]},
            params={"name": "{query}"},
        )
    run = Run.objects.create(agent=agent, query="김하늘 소속?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    shown = json.dumps(
        [run.error_message, run.answer, dict(RunOutputSerializer(run).data)], ensure_ascii=False, default=str
    )
    assert "could not connect to [internal address]" in shown
    for leaked in ("10.0.3.17", "/srv/platform", "line 42", "S3cr3t-Pa55"):
        assert leaked not in shown


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (
            LEAK,
            LEAK.replace("10.0.3.17:5432", "[internal address]").replace(
                "/srv/platform/internal/db.py line 42", "[path]"
            ),
        ),
        ('File "/srv/app/x.py", line 42, in f', 'File "[path]", in f'),
        ("/srv/app/x.py:42: boom", "[path]: boom"),
        (
            "[::1]:8000 refused; fd00::1 down; localhost:5432",
            "[internal address] refused; [internal address] down; [internal address]",
        ),
        ("http://192.168.1.5:8080/api/v1", "http://[internal address]/api/v1"),
        ("C:\\app\\db.py line 3", "[path]"),
    ],
)
def test_internal_locations_are_masked(text: str, masked: str) -> None:
    assert mask_internal_locations(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "8.8.8.8:53 down",
        "version 1.2.3.4.5",
        "at 12:30:45",
        "1 / 2 / 3",
        "a/b/c",
        "https://example.com/api/v1/x",
        "csv line 3 is bad",
        "부서/팀/직급",
        "not an arithmetic expression: invalid syntax",
    ],
)
def test_what_is_no_internal_location_stays(text: str) -> None:
    assert mask_internal_locations(text) == text
