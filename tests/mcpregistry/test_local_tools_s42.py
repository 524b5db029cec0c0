"""Local tools, defects s42 localtools 2 and 3. The tools are defined here (this module is the binding).

2. A local tool that returned ``None`` answered the text ``null``: it passed ``returns.non_empty`` and was remembered,
   where the same function under FastMCP gives no content (``result:empty``). ``None`` is now an answer with no
   content and no structured content.
3. Pydantic constraints the pre-filled contract left out reached the tool: ``Field(gt=0)`` and ``min_length`` had no
   contract key, so ``amount=0`` of a write went to a person's approval and then failed, and the tool's own refusal
   (pydantic's English) was ``tool:error``, "do not retry". The contract now reads an exclusive bound as the
   ``min``/``max`` that lets the same values through and ``minLength`` as its own key, ``min_length``; arguments the
   tool's own schema refuses are not run and come back as the ``args:*`` refusal they are, in the reader's language,
   with guidance to fix the argument. The reason travels beside the text (``ToolCallOutcome.refused``, set by the
   local runner only): a server's error text that opens like a reason code is its ``tool:error``.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, Field

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.contracts import argument_constraints, classify_tool_error
from mcpregistry.local_tools import LocalToolRunner, local_tool
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import tool_contract_update
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file

MODULE = "tests.mcpregistry.test_local_tools_s42"
EXECUTED: dict[str, list[Any]] = defaultdict(list)


@local_tool
def find_user(name: str) -> dict[str, Any] | None:
    """사용자를 이름으로 찾는다. 없으면 아무것도 돌려주지 않는다."""
    EXECUTED["find_user"].append(name)
    return {"name": name, "팀": "IT지원팀"} if name == "김하늘" else None


@local_tool
def refund(amount: int = Field(gt=0), reason: str = Field(min_length=2)) -> str:
    """주문 금액을 환불한다."""
    EXECUTED["refund"].append({"amount": amount, "reason": reason})
    return f"refunded {amount}"


class _Backend(BaseModel):
    count: int


@local_tool
def read_backend(key: str) -> int:
    """백엔드 값을 읽는다."""
    EXECUTED["read_backend"].append(key)
    return _Backend.model_validate({"count": "many"}).count  # the backend's data fails: the tool's own error


@pytest.fixture(autouse=True)
def allowed_modules(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    EXECUTED.clear()


@pytest.fixture
def runner() -> Iterator[LocalToolRunner]:
    runner = LocalToolRunner(max_workers=2)
    yield runner
    runner._executor.shutdown(wait=True)


def bind(paths: list[str], mcp_id: str = "local-s42") -> McpServer:
    server = McpServer(mcp_id=mcp_id, name=mcp_id, transport=McpServer.Transport.LOCAL, args=paths, timeout_s=5)
    server.full_clean()
    server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    return server


def call(server: McpServer, tool: str, args: dict[str, Any], **who: Any) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin", **who))


# --- 2. None -----------------------------------------------------------------------------------------------------


def test_none_is_an_answer_with_no_content(runner: LocalToolRunner) -> None:
    outcome = runner.call_tool({"args": [f"{MODULE}.find_user"]}, "find_user", {"name": "없는사람"}, timeout_s=5)
    assert (outcome.is_error, outcome.text, outcome.structured, outcome.content) == (False, "", None, [])


@pytest.mark.django_db
def test_none_fails_returns_non_empty_and_is_not_remembered() -> None:
    server = bind([f"{MODULE}.find_user"])
    ToolContract.objects.filter(tool__server=server).update(risk="read", returns={"non_empty": True}, memo=True)
    memo: dict[str, Any] = {}
    for _ in range(2):
        result = call(server, "find_user", {"name": "없는사람"}, memo=memo)
        assert (result.ok, result.error) == (False, "result:empty")
    assert EXECUTED["find_user"] == ["없는사람", "없는사람"]  # asked again: nothing was remembered
    found = call(server, "find_user", {"name": "김하늘"}, memo=memo)
    assert (found.ok, found.value) == (True, {"name": "김하늘", "팀": "IT지원팀"})


# --- 3. constraints the contract had no key for --------------------------------------------------------------------


def test_exclusive_bounds_and_min_length_become_the_contract_keys_that_hold_them() -> None:
    schema = {
        "properties": {
            "count": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10.5},
            "rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "exclusiveMaximum": 2},
            "old": {"type": "number", "minimum": 5, "exclusiveMinimum": True},
            "stricter": {"type": "integer", "minimum": 3, "exclusiveMinimum": 0},
            "reason": {"type": "string", "minLength": 2},
            "code": {"type": "string", "minLength": 3, "pattern": r"^\d+$"},
            "empty_ok": {"type": "string", "minLength": 0},
        }
    }
    assert argument_constraints(schema) == {
        "count": {"required": False, "type": "int", "min": 1, "max": 10},
        "rate": {"required": False, "type": "float", "min": 5e-324, "max": 1},
        "old": {"required": False, "type": "float", "min": 5.000000000000001},
        "stricter": {"required": False, "type": "int", "min": 3},
        "reason": {"required": False, "type": "str", "min_length": 2},
        "code": {"required": False, "type": "str", "min_length": 3, "pattern": r"^\d+$"},
        "empty_ok": {"required": False, "type": "str"},
    }


@pytest.mark.django_db
def test_a_write_whose_arguments_its_schema_refuses_is_refused_before_anyone_is_asked() -> None:
    server = bind([f"{MODULE}.refund"])
    tool_contract = ToolContract.objects.get(tool__server=server, tool__name="refund")
    assert tool_contract.risk == "write"
    assert tool_contract.args == {
        "amount": {"required": True, "type": "int", "min": 1},
        "reason": {"required": True, "type": "str", "min_length": 2},
    }
    agent = make_agent(
        slug="refunder",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "refund", "args": {"amount": 0, "reason": "x"}}]},
            {"content": "환불하지 못했습니다."},
        ],
    )
    run = Run.objects.create(agent=agent, query="0원 환불해 줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.approvals.count() == 0
    assert list(AuditEvent.objects.filter(tool="refund", action="tool.call").values_list("reason", flat=True)) == [
        "args:range:amount"
    ]
    assert EXECUTED["refund"] == []


@pytest.mark.django_db
def test_arguments_the_tools_own_schema_refuses_are_an_argument_refusal_not_a_tool_error() -> None:
    server = bind([f"{MODULE}.refund", "mcpregistry.builtin_tools.calculate"])
    # Contracts that hold none of the schema's bounds (stored before they were read, or cleared by an admin).
    ToolContract.objects.filter(tool__server=server).update(risk="read", args={})
    refused = call(server, "refund", {"amount": 0, "reason": "x"})
    assert (refused.ok, refused.error) == (False, "args:range:amount")
    assert "'amount' must be more than 0; 'reason' must be at least 2 characters" in refused.message
    assert "Fix the argument as the details say and call it again." in refused.message
    assert "validation error" not in refused.message and "Do not retry" not in refused.message
    assert EXECUTED["refund"] == []  # the function never ran
    empty = call(server, "calculate", {"expression": ""})
    assert (empty.ok, empty.error) == (False, "args:range:expression")
    assert "'expression' must be at least 1 characters" in empty.message
    assert call(server, "refund", {"amount": 3, "reason": "파손"}).value == "refunded 3"


@pytest.mark.django_db
def test_a_validation_error_the_function_raises_itself_stays_its_own_error() -> None:
    server = bind([f"{MODULE}.read_backend"])
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    result = call(server, "read_backend", {"key": "k"})
    assert (result.ok, result.error) == (False, "tool:error")
    assert EXECUTED["read_backend"] == ["k"]


# A FastMCP server whose tool answers with its own error, the text it is given.
ERROR_TEXT_SERVER = """
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

mcp = FastMCP("error-text")

@mcp.tool(description="Answers with the error text it is given.")
def fail(x: int, text: str) -> str:
    raise ToolError(text)

mcp.run(transport="stdio", show_banner=False)
"""


def test_no_text_is_read_as_an_argument_refusal() -> None:
    assert classify_tool_error("args:range:amount: 'amount' must be more than 0.") == ("tool:error", None)
    assert classify_tool_error("args:missing: 'x' is required.") == ("tool:error", None)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_servers_error_text_that_opens_like_a_reason_code_is_its_tool_error() -> None:
    server = McpServer.objects.create(
        mcp_id="error-text-s42",
        name="error-text-s42",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[script_file(ERROR_TEXT_SERVER)],
        timeout_s=10,
    )
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    result = call(server, "fail", {"x": 1, "text": "args:range:x: nope"})
    assert (result.ok, result.error) == (False, "tool:error")
    assert "the tool reported an error" in result.message and "args:range:x: nope" in result.message
    assert list(AuditEvent.objects.filter(tool="fail", action="tool.call").values_list("reason", flat=True)) == [
        "tool:error"
    ]


@pytest.mark.django_db
def test_a_local_tools_refusal_of_a_bound_the_contract_does_not_hold_tells_the_model_to_fix_it() -> None:
    server = bind([f"{MODULE}.refund"])
    contract = ToolContract.objects.get(tool__server=server, tool__name="refund")
    tool_contract_update(
        contract=contract,
        actor="test-admin",
        via="tests",
        data={"risk": "read", "args": {"amount": {"required": True, "type": "int"}, "reason": {"type": "str"}}},
    )
    refused = call(server, "refund", {"amount": 0, "reason": "파손"})
    assert (refused.ok, refused.error) == (False, "args:range:amount")
    assert refused.message.startswith(
        "Tool 'refund' was not called: its arguments were refused [args:range:amount]. Fix the argument as the "
        "details say and call it again."
    )
    assert "'amount' must be more than 0" in refused.message
    assert "args:range:amount: " not in refused.message  # the code is beside the text, not in it
    assert EXECUTED["refund"] == []
