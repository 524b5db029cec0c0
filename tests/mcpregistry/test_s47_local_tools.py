"""Local tools, review s47 (the tools are defined here: this module is the binding).

1. A LangChain tool made with ``handle_tool_error=True`` (LangChain's documented way to tell the model a failure)
   returned its ``ToolException``'s message as its value: the gate audited the failure ``ok``, remembered it for
   the run and checked it as a result. It is the tool's ``tool:error`` now, its message as written.
2. A tool whose value is a Pydantic model, a dataclass or holds a set answered its Python ``repr`` as a text
   (``"name='홍길동' hired=datetime.date(2020, 1, 2)"``): the model read no object, and a contract's ``returns``
   refused it. It is its JSON object now, as FastMCP writes one.
3. A tool whose exception's own ``__str__`` fails was taken for the caller's interruption: the gate's
   ``unexpected`` (for a write: its outcome unknown) instead of the tool's ``tool:error``.
4. An argument its ``args_schema`` names by an alias (``from_: str = Field(alias="from")``: ``from`` is a Python
   keyword) was listed to the model as ``from_`` (LangChain's ``tool_call_schema`` drops aliases), which the tool
   refuses: the model, following the schema, failed every time with Pydantic's English dump. It is listed as
   ``from`` now, the name the tool reads.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.tools import StructuredTool, ToolException
from pydantic import BaseModel, Field

from audit.change_guard import change_scope
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.local_tools import LocalToolRunner, local_tool
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.conftest import discover_as_admin

MODULE = "tests.mcpregistry.test_s47_local_tools"
EXECUTED: dict[str, list[Any]] = defaultdict(list)


def _backend_down(asset: str) -> str:
    """자산 상태를 조회한다."""
    EXECUTED["handled"].append(asset)
    raise ToolException("자산 서버가 점검 중입니다")


async def _backend_down_async(asset: str) -> str:
    """자산 상태를 비동기로 조회한다."""
    EXECUTED["handled_async"].append(asset)
    raise ToolException("자산 서버가 점검 중입니다")


handled = StructuredTool.from_function(func=_backend_down, name="handled", handle_tool_error=True)
handled_async = StructuredTool.from_function(
    coroutine=_backend_down_async, name="handled_async", handle_tool_error=True
)


class Employee(BaseModel):
    name: str
    hired: datetime.date


@dataclasses.dataclass
class Seat:
    floor: int
    desk: str


@local_tool
def employee(name: str) -> Employee:
    """직원 정보를 조회한다."""
    return Employee(name=name, hired=datetime.date(2020, 1, 2))


@local_tool
def seat(name: str) -> dict[str, Any]:
    """직원의 자리와 소속 팀들을 조회한다."""
    return {"seat": Seat(floor=3, desk="3-12"), "teams": {"인사팀"}}


class UnreadableError(Exception):
    """An exception whose message cannot be read: its ``__str__`` fails (an attribute it reads was never set)."""

    def __str__(self) -> str:
        return str(self.response.text)  # type: ignore[attr-defined]


@local_tool
def unreadable(name: str) -> str:
    """오류 메시지를 읽을 수 없는 예외를 낸다."""
    EXECUTED["unreadable"].append(name)
    raise UnreadableError()


class PeriodArgs(BaseModel):
    from_: str = Field(alias="from", description="시작일 (YYYY-MM-DD)")
    to: str = Field(description="종료일 (YYYY-MM-DD)")


@local_tool(args_schema=PeriodArgs)
def leave_days(from_: str, to: str) -> str:
    """기간의 휴가 일수를 센다."""
    EXECUTED["leave_days"].append((from_, to))
    return f"{from_}~{to}: 3일"


@pytest.fixture(autouse=True)
def allowed_modules(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = [MODULE]
    EXECUTED.clear()


@pytest.fixture
def runner() -> Iterator[LocalToolRunner]:
    runner = LocalToolRunner(max_workers=2)
    yield runner
    runner._executor.shutdown(wait=True)


def bind(tool: str) -> McpServer:
    with change_scope(actor="tests", via="tests"):
        server = McpServer(
            mcp_id=f"s47-{tool}".replace("_", "-"),
            name=tool,
            transport=McpServer.Transport.LOCAL,
            args=[f"{MODULE}.{tool}"],
            timeout_s=5,
        )
        server.full_clean()
        server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).update(risk="read", memo=True)
    return server


def call(
    server: McpServer, tool: str, args: dict[str, Any], memo: dict[str, gate.ToolResult] | None = None
) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin", memo=memo))


# 1. handle_tool_error ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["handled", "handled_async"])
def test_a_langchain_tool_that_handles_its_own_errors_still_answers_an_error(
    runner: LocalToolRunner, tool: str
) -> None:
    out = runner.call_tool({"args": [f"{MODULE}.{tool}"]}, tool, {"asset": "A-1"}, timeout_s=5)
    assert (out.is_error, out.refused) == (True, "")
    assert out.text == "ToolException: 자산 서버가 점검 중입니다"
    assert EXECUTED[tool] == ["A-1"]


@pytest.mark.django_db
def test_a_handled_tool_error_is_audited_as_a_failure_and_not_remembered() -> None:
    server = bind("handled")
    memo: dict[str, gate.ToolResult] = {}
    first = call(server, "handled", {"asset": "A-1"}, memo)
    second = call(server, "handled", {"asset": "A-1"}, memo)
    assert (first.ok, first.error) == (False, "tool:error")
    assert "자산 서버가 점검 중입니다" in first.message
    assert (second.ok, second.error) == (False, "tool:error")
    assert EXECUTED["handled"] == ["A-1", "A-1"]  # a failure is not remembered: asked again, run again
    events = AuditEvent.objects.filter(tool="handled", action="tool.call")
    assert [event.ok for event in events] == [False, False]
    assert {event.reason for event in events} == {"tool:error"}
    assert memo == {}
    # The same memo keeps a success (the run's memo is at work here).
    assert call(bind("employee"), "employee", {"name": "홍길동"}, memo).ok
    assert len(memo) == 1


# 2. typed values ---------------------------------------------------------------------------------------------


def test_a_pydantic_model_or_a_dataclass_is_answered_as_its_json_object(runner: LocalToolRunner) -> None:
    model = runner.call_tool({"args": [f"{MODULE}.employee"]}, "employee", {"name": "홍길동"}, timeout_s=5)
    assert (model.is_error, model.text) == (False, '{"name": "홍길동", "hired": "2020-01-02"}')
    held = runner.call_tool({"args": [f"{MODULE}.seat"]}, "seat", {"name": "홍길동"}, timeout_s=5)
    assert (held.is_error, held.text) == (False, '{"seat": {"floor": 3, "desk": "3-12"}, "teams": ["인사팀"]}')


@pytest.mark.django_db
def test_a_pydantic_models_answer_passes_a_contract_that_names_its_fields() -> None:
    server = bind("employee")
    ToolContract.objects.filter(tool__server=server).update(returns={"required": ["name", "hired"]})
    result = call(server, "employee", {"name": "홍길동"})
    assert (result.ok, result.error) == (True, None)
    assert result.value == {"name": "홍길동", "hired": "2020-01-02"}


# 3. an exception whose message cannot be read ----------------------------------------------------------------


def test_an_exception_whose_message_cannot_be_read_is_the_tools_error(runner: LocalToolRunner) -> None:
    out = runner.call_tool({"args": [f"{MODULE}.unreadable"]}, "unreadable", {"name": "x"}, timeout_s=5)
    assert (out.is_error, out.refused) == (True, "")
    assert out.text == "UnreadableError: (its message could not be read)"


@pytest.mark.django_db
def test_the_gate_reads_an_unreadable_exception_as_a_tool_error_not_unexpected() -> None:
    server = bind("unreadable")
    result = call(server, "unreadable", {"name": "x"})
    assert (result.ok, result.error, result.attempts) == (False, "tool:error", 1)
    assert EXECUTED["unreadable"] == ["x"]


# 4. an argument named by an alias ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_argument_named_by_an_alias_is_listed_by_it_and_a_call_that_follows_the_listing_runs() -> None:
    server = bind("leave_days")
    listed = McpTool.objects.get(server=server, name="leave_days").input_schema
    assert sorted(listed["properties"]) == ["from", "to"]
    assert sorted(listed["required"]) == ["from", "to"]
    assert listed["properties"]["from"]["description"] == "시작일 (YYYY-MM-DD)"
    result = call(server, "leave_days", {"from": "2024-05-01", "to": "2024-05-03"})
    assert (result.ok, result.value) == (True, "2024-05-01~2024-05-03: 3일")
    assert EXECUTED["leave_days"] == [("2024-05-01", "2024-05-03")]


def test_an_aliased_argument_left_out_is_an_argument_refusal_by_its_alias(runner: LocalToolRunner) -> None:
    out = runner.call_tool({"args": [f"{MODULE}.leave_days"]}, "leave_days", {"to": "2024-05-03"}, timeout_s=5)
    assert (out.is_error, out.refused) == (True, "args:missing:from")
    assert "pydantic" not in out.text
    assert EXECUTED["leave_days"] == []
