"""Third-party MCP servers work as bindings: discovered, then called by the engine, and audited.

``mcp-server-time`` (PyPI, from its own virtualenv) and ``@modelcontextprotocol/server-everything`` (npm, over
stdio and streamable HTTP) are installed on first use by ``tests.thirdparty``; only the model is scripted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS
from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

from agents.execution import run_execute
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from mcpregistry.pool import SAFE_ENV_KEYS, get_default_pool
from tests.conftest import discover_as_admin, make_agent

if TYPE_CHECKING:  # imported by pytest_plugins below, so that pytest rewrites its asserts
    from tests.thirdparty import EverythingServer, StdioCommand

# The installers' fixtures: time_server_command, everything_server, everything_http_url.
pytest_plugins = ["tests.thirdparty"]
pytestmark = [pytest.mark.django_db, pytest.mark.thirdparty]


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The mcp_ids a test binds: every session of theirs is closed at its end, so no server process lingers."""
    mcp_ids: list[str] = []
    yield mcp_ids
    pool = get_default_pool()
    for mcp_id in mcp_ids:
        pool.close(mcp_id)
    assert not [s for s in pool.live_sessions().values() if s["mcp_id"] in mcp_ids]


def bind(opened: list[str], *, mcp_id: str, **fields) -> McpServer:
    opened.append(mcp_id)
    server = McpServer.objects.create(mcp_id=mcp_id, name=mcp_id, timeout_s=20, **fields)
    server.full_clean()
    return server


def bind_stdio(opened: list[str], *, mcp_id: str, command: StdioCommand, **fields) -> McpServer:
    return bind(
        opened,
        mcp_id=mcp_id,
        transport=McpServer.Transport.STDIO,
        command=command.command,
        args=command.args,
        env={**command.env, **fields.pop("env", {})},
        **fields,
    )


def discovered(server: McpServer) -> McpServer:
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    server.refresh_from_db()
    assert server.health == McpServer.Health.OK
    assert server.protocol_version in SUPPORTED_PROTOCOL_VERSIONS
    return server


def scripted_agent(slug: str, server: McpServer, tool: str, args: dict) -> Agent:
    return make_agent(
        slug=slug,
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": tool, "args": args}]}, {"content": "결과: {last_tool_result}"}],
    )


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def the_audited_call(run: Run, tool: str) -> AuditEvent:
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.source, event.tool, event.ok, event.reason) == ("agent", tool, True, "")
    return event


def test_the_time_server_from_its_own_venv_is_discovered_and_called_by_the_engine(
    time_server_command: StdioCommand, opened: list[str]
) -> None:
    server = discovered(
        bind_stdio(opened, mcp_id="time", command=time_server_command, session_scope=McpServer.SessionScope.SHARED)
    )
    assert {"get_current_time", "convert_time"} <= set(server.tools.values_list("name", flat=True))
    assert server.server_info.get("name") == "mcp-time"

    agent = scripted_agent("time-teller", server, "get_current_time", {"timezone": "Asia/Seoul"})
    run = submit(agent, "서울은 지금 몇 시인가요?")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "Asia/Seoul" in run.answer
    assert "+09:00" in run.answer
    event = the_audited_call(run, "get_current_time")
    assert event.args == {"timezone": "Asia/Seoul"}
    assert event.result["timezone"] == "Asia/Seoul"


def test_server_everything_over_stdio_is_discovered_and_its_echo_called_by_the_engine(
    everything_server: EverythingServer, opened: list[str]
) -> None:
    server = discovered(bind_stdio(opened, mcp_id="everything-stdio", command=everything_server.stdio()))
    assert {"echo", "get-env"} <= set(server.tools.values_list("name", flat=True))

    agent = scripted_agent("echoer", server, "echo", {"message": "안녕하세요"})
    run = submit(agent, "인사해 줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "Echo: 안녕하세요" in run.answer
    assert the_audited_call(run, "echo").args == {"message": "안녕하세요"}


def test_server_everything_over_streamable_http_is_discovered_and_its_echo_called_by_the_engine(
    everything_http_url: str, opened: list[str]
) -> None:
    assert everything_http_url.startswith("http://127.0.0.1:")
    server = discovered(
        bind(opened, mcp_id="everything-http", transport=McpServer.Transport.STREAMABLE_HTTP, url=everything_http_url)
    )
    assert "echo" in set(server.tools.values_list("name", flat=True))

    agent = scripted_agent("http-echoer", server, "echo", {"message": "안녕하세요, HTTP"})
    run = submit(agent, "HTTP로 인사해 줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "Echo: 안녕하세요, HTTP" in run.answer
    the_audited_call(run, "echo")


def test_a_stdio_server_sees_its_bindings_env_and_none_of_the_workers(
    everything_server: EverythingServer, opened: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://worker:worker-db-password@db/platform")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-aws-secret-access-key-value")
    # A fresh mcp_id: a new server process, started after the worker's environment got its secrets.
    server = discovered(
        bind_stdio(
            opened,
            mcp_id="everything-env",
            command=everything_server.stdio(),
            env={"BINDING_GREETING": "hello-binding"},
            public_env=["BINDING_GREETING"],  # a setting, not a secret: shown as itself
            session_scope=McpServer.SessionScope.SHARED,
        )
    )

    result = gate.call(server=server, tool_name="get-env", args={}, who=gate.GateCall(source="admin"))

    assert result.ok, result.message
    env = result.value
    assert isinstance(env, dict)
    assert env["BINDING_GREETING"] == "hello-binding"
    assert "DATABASE_URL" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env
    # Only the pool's safe keys and the MCP SDK's default inherited ones (HOME, PATH, USER...) pass through.
    assert set(env) <= {*SAFE_ENV_KEYS, *DEFAULT_INHERITED_ENV_VARS, "BINDING_GREETING"}
