"""Fixtures and personas shared by the suite.

The MCP servers here are real: the demo server runs as a child process over stdio through the platform's
session pool. Only the model is scripted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from agents.management.commands.seed_demo import DEMO_RULES, SYSTEM_PROMPT, apply_demo_contracts
from agents.models import Agent, ApiKey, DeterministicRule
from agents.services import api_key_create
from mcpregistry import gate
from mcpregistry.models import McpServer
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import mcp_server_discover

# Test code may create configuration rows directly (fixtures); the platform's own code never may, here as in
# production (audit/change_guard.py).
settings.PLATFORM_CHANGE_GUARD = "tests"

# A secret bound to the demo server in tests: it must never be stored or shown anywhere.
DEMO_SECRET = "sk-test-binding-secret-5f2b9c1d7e"


@pytest.fixture(scope="session", autouse=True)
def _close_mcp_sessions_at_the_end() -> Iterator[None]:
    yield
    shutdown_default_pool()


class FakeClock(gate.Clock):
    """The gate's clock for tests: sleeping advances time instantly, and every wait is recorded."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 3))
        self.offset += seconds


@pytest.fixture(autouse=True)
def gate_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Backoff waits cost no real time in tests; a test reads ``gate_clock.slept`` to check the schedule."""
    fake = FakeClock()
    monkeypatch.setattr(gate, "clock", fake)
    return fake


def bind_demo_server(
    *, mcp_id: str = "sds-company-data", failure_mode: str = "none", session_scope: str = "shared", **env: str
) -> McpServer:
    """A binding to the shipped demo server (a real stdio process), discovered."""
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name="SDS company data",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
        cwd=str(settings.BASE_DIR),
        env={"FAILURE_MODE": failure_mode, "INTERNAL_API_KEY": DEMO_SECRET, "FAILURE_TIMEOUT_S": "0.2", **env},
        timeout_s=10,
        session_scope=session_scope,
    )
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    apply_demo_contracts(server)
    return server


@pytest.fixture
def demo_server(db: Any) -> McpServer:
    return bind_demo_server()


def make_agent(
    *,
    slug: str,
    servers: list[McpServer],
    provider: str = "offline",
    script: list[dict[str, Any]] | None = None,
    with_demo_rules: bool = True,
) -> Agent:
    agent = Agent.objects.create(
        slug=slug,
        name=slug,
        system_prompt=SYSTEM_PROMPT,
        model_provider=provider,
        model_params={"script": script} if script is not None else {},
    )
    agent.servers.set(servers)
    if with_demo_rules:
        for rule in DEMO_RULES:
            DeterministicRule.objects.create(agent=agent, server=servers[0], **rule)
    return agent


@pytest.fixture
def demo_agent(demo_server: McpServer) -> Agent:
    return make_agent(slug="company-assistant", servers=[demo_server])


@pytest.fixture
def api_caller(db: Any) -> tuple[ApiKey, str]:
    """An API caller persona: a key for every agent."""
    return api_key_create(actor="test", via="tests", name="caller")


@pytest.fixture
def outsider(db: Any) -> tuple[ApiKey, str]:
    """Another API caller, who must not see the first caller's runs."""
    return api_key_create(actor="test", via="tests", name="outsider")


@pytest.fixture
def api_client(api_caller: tuple[ApiKey, str]) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_caller[1]}")
    return client
