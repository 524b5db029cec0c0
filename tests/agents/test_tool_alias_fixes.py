"""Two tools or two resources that the model must tell apart. Defects: a Korean tool name listed composed (NFC) by
one server and decomposed (NFD, as text written on macOS arrives) by another passed the name conflict check (raw
strings differ) and got one alias, so one tool vanished from the run and its calls reached the other server; a digest
alias could be another tool's valid name; and ``docs://handbook`` listed by two servers was offered once, every read
going to one of them."""

from __future__ import annotations

import hashlib
import re
import sys
import unicodedata
from typing import Any

import pytest

from agents.engine import model_tool_names
from agents.models import Run
from agents.selectors import tool_name_conflict_problem
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import mcp_server_discover
from tests.agents.test_openai_compatible import openai_agent, submit
from tests.mcp_fixtures.scripts import script_file
from tests.openai_server import ScriptedOpenAIServer

PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPLOYEE_SEARCH = "직원검색"

# A small stdio MCP server: one tool whose name is EMPLOYEE_SEARCH in the Unicode form FORM, and a handbook resource
# (plus one only it lists, named after LABEL), each answering with the server's LABEL.
SERVER_SCRIPT = """
import os, unicodedata
from fastmcp import FastMCP

label = os.environ["LABEL"]
mcp = FastMCP(f"docs-{label}")

@mcp.tool(name=unicodedata.normalize(os.environ["FORM"], os.environ["TOOL"]), description=f"Search on {label}.")
def search(q: str) -> str:
    return f"employees of server {label}"

@mcp.resource("docs://handbook", description="The handbook.")
def handbook() -> str:
    return f"Handbook of server {label}."

@mcp.resource(f"docs://only-{label}", description="A document of one server.")
def only() -> str:
    return f"Only on server {label}."

mcp.run(transport="stdio", show_banner=False)
"""


def stdio_server(mcp_id: str, *, label: str, form: str = "NFC", prefix: str = "", discover: bool = True) -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=[script_file(SERVER_SCRIPT)],
        timeout_s=10,
        tool_prefix=prefix,
        env={"LABEL": label, "FORM": form, "TOOL": EMPLOYEE_SEARCH},
        public_env=["LABEL", "FORM", "TOOL"],
    )
    if discover:
        report = mcp_server_discover(server=server, actor="test", via="tests")
        assert report.ok, report.error
        ToolContract.objects.filter(tool__server=server).update(risk="read")  # they only read: no approval
    return server


# ---- aliases ------------------------------------------------------------------------------------------------------


def test_a_digest_alias_that_is_another_tools_name_is_digested_again() -> None:
    taken_by_digest = "a_b_" + hashlib.sha256(b"a.b").hexdigest()[:8]  # what a.b's alias used to be
    names = model_tool_names(["a.b", "a_b", taken_by_digest])
    assert names["a_b"] == "a_b" and names[taken_by_digest] == taken_by_digest
    assert names["a.b"] not in {"a_b", taken_by_digest} and names["a.b"].startswith("a_b_")
    assert PROVIDER_NAME.fullmatch(names["a.b"])


def test_one_name_composed_and_decomposed_gets_two_aliases() -> None:
    composed, decomposed = EMPLOYEE_SEARCH, unicodedata.normalize("NFD", EMPLOYEE_SEARCH)
    names = model_tool_names([composed, decomposed])
    assert names[composed] != names[decomposed]
    assert all(PROVIDER_NAME.fullmatch(alias) for alias in names.values())


def test_the_aliases_are_unique_and_the_same_whatever_the_order_of_the_names() -> None:
    clashing = [
        "a.b",
        "a_b",
        "a b",
        "a_b_" + hashlib.sha256(b"a.b").hexdigest()[:8],
        EMPLOYEE_SEARCH,
        unicodedata.normalize("NFD", EMPLOYEE_SEARCH),
        "tool_" + hashlib.sha256(EMPLOYEE_SEARCH.encode()).hexdigest()[:8],
        "read.resource",
    ]
    first = model_tool_names(clashing)
    assert len(set(first.values())) == len(clashing)
    assert "read_resource" not in first.values()
    for turn in range(len(clashing)):  # each name first once, forwards and backwards
        order = clashing[turn:] + clashing[:turn]
        assert model_tool_names(order) == first
        assert model_tool_names(order[::-1]) == first


# ---- the name conflict check ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_two_servers_with_one_korean_tool_name_in_two_unicode_forms_conflict_and_the_run_is_refused() -> None:
    composed = stdio_server("hr-a", label="A", form="NFC")
    decomposed = stdio_server("hr-b", label="B", form="NFD")
    names = {t.name for t in (*composed.tools.all(), *decomposed.tools.all())}
    assert len(names) == 2  # the servers really sent two strings

    problem = tool_name_conflict_problem([composed, decomposed])
    assert EMPLOYEE_SEARCH in problem and "hr-a, hr-b" in problem, problem

    turns: list[dict[str, Any]] = [{"content": "unused"}]
    with ScriptedOpenAIServer(turns).running() as model:
        agent = openai_agent(model, composed, slug="nfd-conflict")
        agent.servers.set([composed, decomposed])
        run = submit(agent, "직원 검색")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "config:tool_name_conflict")
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.call").exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_discovery_keeps_off_a_tool_whose_name_another_bound_server_has_in_the_other_unicode_form() -> None:
    composed = stdio_server("hr-a", label="A", form="NFC")
    decomposed = stdio_server("hr-b", label="B", form="NFD", discover=False)
    with ScriptedOpenAIServer([{"content": "unused"}]).running() as model:
        agent = openai_agent(model, composed, slug="nfd-discovery")
    agent.servers.set([composed, decomposed])
    report = mcp_server_discover(server=decomposed, actor="test", via="tests")
    assert report.ok, report.error
    assert [entry.startswith(unicodedata.normalize("NFD", EMPLOYEE_SEARCH)) for entry in report.name_taken] == [True]
    assert not decomposed.tools.get().enabled
    assert tool_name_conflict_problem([composed, decomposed]) == ""


# ---- read_resource ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_uri_two_servers_list_is_offered_once_per_server_and_each_read_reaches_its_own() -> None:
    hr = stdio_server("hr-docs", label="A", prefix="hr_")
    finance = stdio_server("fin-docs", label="B", prefix="fin_")
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_resource", "args": {"uri": "docs://handbook"}}]},
        {"tool_calls": [{"name": "read_resource", "args": {"uri": "docs://handbook (hr-docs)"}}]},
        {"tool_calls": [{"name": "read_resource", "args": {"uri": "docs://handbook (fin-docs)"}}]},
        {"tool_calls": [{"name": "read_resource", "args": {"uri": "docs://only-A"}}]},
        {"content": "done"},
    ]
    with ScriptedOpenAIServer(turns).running() as model:
        agent = openai_agent(model, hr, slug="two-handbooks")
        agent.servers.set([hr, finance])
        agent.mcp_context = {"read_resource_tool": True}
        agent.save()
        run = submit(agent, "handbook?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message

    (spec,) = [t["function"] for t in model.requests[0]["body"]["tools"] if t["function"]["name"] == "read_resource"]
    assert spec["parameters"]["properties"]["uri"]["enum"] == [
        "docs://handbook (fin-docs)",
        "docs://handbook (hr-docs)",
        "docs://only-A",  # a URI one server lists is offered as it is
        "docs://only-B",
    ]
    told = [m["content"] for m in model.requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert "docs://handbook (hr-docs)" in told[0]  # the bare URI is refused, naming both
    assert "Handbook of server A." in told[1] and "Handbook of server B." in told[2]
    assert "Only on server A." in told[3]
    reads = AuditEvent.objects.filter(run_id=run.id, action="resource.read").order_by("seq")
    assert [(e.mcp_id, e.tool, e.ok) for e in reads] == [
        ("hr-docs", "docs://handbook", True),
        ("fin-docs", "docs://handbook", True),
        ("hr-docs", "docs://only-A", True),
    ]
