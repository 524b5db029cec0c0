"""Local tools: defects s29 local 1 and 3.

1. An ``async def`` local tool reported success but never ran: ``local_tool`` made it the tool's ``func``, so a call
   only made the coroutine, and that unawaited object was the answer ('"<coroutine object …>"'), an ok call the
   gate audited (for a write, one that never happened); LangChain's own async ``@tool`` was accepted at save and
   discovery but every call failed "StructuredTool does not support sync invocation". A coroutine tool is now
   awaited in its worker thread, with the call's deadline and the caller's interruptions: at either it is
   cancelled at its ``await`` (it does not run on as a function does).
3. A dotted path through an allowed module bound any tool that module merely imports (its function defined in a
   module not allowed), where binding the whole module lists only the tools defined in it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.local_tools import LocalToolError, LocalToolRunner, load_local_tools
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpTimeoutError
from tests import local_tool_async_fixtures as fixtures
from tests.conftest import discover_as_admin
from tests.mcpregistry.test_soft_time_limit import soft_time_limit_in

MODULE = "tests.local_tool_async_fixtures"
CONFIG = {"args": [MODULE]}


@pytest.fixture(autouse=True)
def allowed_modules(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = [MODULE]
    fixtures.EXECUTED.clear()


@pytest.fixture
def runner() -> Iterator[LocalToolRunner]:
    runner = LocalToolRunner(max_workers=2)
    yield runner
    runner._executor.shutdown(wait=True)


# --- 1. async tools ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_async_local_tool_is_discovered_and_its_call_through_the_gate_runs_it() -> None:
    server = McpServer(mcp_id="async-local", name="async-local", transport="local", args=[MODULE], timeout_s=5)
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    tools = {t.name: t for t in server.tools.select_related("contract")}
    assert set(tools) == {"async_lookup", "async_shout", "async_sleepy", "async_raise"}  # not the imported one
    assert tools["async_lookup"].description.startswith("재고 수량을 비동기로 조회한다")
    assert tools["async_lookup"].contract.args == {
        "sku": {"required": True, "type": "str"},
        "warehouse": {"required": False, "type": "int"},
    }
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    result = gate.call(server=server, tool_name="async_lookup", args={"sku": "A-1"}, who=gate.GateCall(source="admin"))
    expected = {"sku": "A-1", "warehouse": 1, "count": 7, "팀": "클라우드운영팀"}
    assert (result.ok, result.value) == (True, expected)
    assert fixtures.EXECUTED["async_lookup"] == ["started", {"sku": "A-1", "warehouse": 1}]
    event = AuditEvent.objects.get(tool="async_lookup", action="tool.call")
    assert (event.ok, event.reason) == (True, "")


def test_a_langchain_async_tool_is_awaited_not_refused_as_sync(runner: LocalToolRunner) -> None:
    outcome = runner.call_tool(CONFIG, "async_shout", {"text": "안녕 hi"}, timeout_s=5)
    assert (outcome.is_error, outcome.text) == (False, "안녕 HI")
    assert fixtures.EXECUTED["async_shout"] == ["안녕 hi"]


def test_an_async_tool_that_raises_is_its_own_error(runner: LocalToolRunner) -> None:
    outcome = runner.call_tool(CONFIG, "async_raise", {"reason": "디스크 가득"}, timeout_s=5)
    assert (outcome.is_error, outcome.text) == (True, "RuntimeError: backend exploded: 디스크 가득")


def test_an_async_tool_past_its_deadline_is_a_timeout_and_is_cancelled_at_its_await(runner: LocalToolRunner) -> None:
    started = time.monotonic()
    with pytest.raises(McpTimeoutError) as caught:
        runner.call_tool(CONFIG, "async_sleepy", {"seconds": 3}, timeout_s=0.3)
    assert caught.value.sent is True
    runner._executor.shutdown(wait=True)  # returns once the worker thread is free: the coroutine was cancelled
    assert time.monotonic() - started < 2
    assert fixtures.EXECUTED["async_sleepy"] == ["started"]  # never "finished"


def test_a_soft_time_limit_while_an_async_tool_awaits_is_raised_and_cancels_it(runner: LocalToolRunner) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    started = time.monotonic()
    with soft_time_limit_in(0.3), pytest.raises(SoftTimeLimitExceeded):
        runner.call_tool(CONFIG, "async_sleepy", {"seconds": 3}, timeout_s=10)
    runner._executor.shutdown(wait=True)
    assert time.monotonic() - started < 2
    assert fixtures.EXECUTED["async_sleepy"] == ["started"]


def test_an_async_tool_within_its_deadline_answers(runner: LocalToolRunner) -> None:
    outcome = runner.call_tool(CONFIG, "async_sleepy", {"seconds": 0.05}, timeout_s=5)
    assert (outcome.is_error, outcome.text) == (False, "slept 0.05")
    assert fixtures.EXECUTED["async_sleepy"] == ["started", "finished"]


# --- 3. a single tool's path --------------------------------------------------------------------------------------


def test_a_path_to_a_tool_an_allowed_module_only_imports_is_refused_naming_where_it_is_defined() -> None:
    with pytest.raises(LocalToolError) as caught:
        load_local_tools([f"{MODULE}.lookup_stock"], allowed_modules=[MODULE])
    assert str(caught.value) == (
        f"'{MODULE}.lookup_stock' is defined in 'tests.local_tool_fixtures', which is not under a module named in "
        f"PLATFORM_LOCAL_TOOL_MODULES ({MODULE})"
    )


@pytest.mark.django_db
def test_a_binding_to_a_tool_defined_outside_the_allowed_modules_is_refused_on_save() -> None:
    server = McpServer(mcp_id="imported", name="imported", transport="local", args=[f"{MODULE}.lookup_stock"])
    with pytest.raises(ValidationError) as caught:
        server.full_clean()
    assert "is defined in 'tests.local_tool_fixtures'" in str(caught.value.message_dict["args"])


def test_a_path_to_an_imported_tool_is_bound_where_its_own_module_is_allowed_too() -> None:
    tools = load_local_tools([f"{MODULE}.lookup_stock"], allowed_modules=[MODULE, "tests.local_tool_fixtures"])
    assert list(tools) == ["lookup_stock"]


def test_a_path_to_a_tool_defined_in_the_allowed_module_is_bound_async_or_not() -> None:
    tools = load_local_tools([f"{MODULE}.async_lookup", f"{MODULE}.async_shout"], allowed_modules=[MODULE])
    assert sorted(tools) == ["async_lookup", "async_shout"]
