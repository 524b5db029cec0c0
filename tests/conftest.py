"""Fixtures and personas shared by the suite.

The MCP servers here are real: the demo server runs as a child process over stdio through the platform's
session pool. Only the model is scripted.

Personas, for permission tests:

- an admin: ``admin_user`` (a superuser) and ``admin_client`` (a ``Client`` logged in as it), pytest-django's own;
- an auditor: ``auditor_user``, made by ``manage.py create_auditor`` (staff, in the auditor group, password
  ``AUDITOR_PASSWORD``), and ``auditor_client`` logged in as it;
- an API caller: ``api_caller``, an ``ApiCaller(key, raw_key)``, and ``api_client``, an ``APIClient`` sending its
  key; ``other_caller`` is a second caller, who must not see the first one's runs;
- an outsider: ``outsider``, on the staff (so the admin lets them log in) but in no group and with no permission
  (password ``OUTSIDER_PASSWORD``), and ``outsider_client`` logged in as them.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.core.management import call_command
from django.db.backends.sqlite3.base import DatabaseWrapper as SqliteWrapper
from django.test import Client
from hypothesis import settings as hypothesis_settings
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rest_framework.test import APIClient

from agents.management.commands.seed_demo import DEMO_PUBLIC_ENV, DEMO_RULES, SYSTEM_PROMPT, apply_demo_contracts
from agents.models import Agent, ApiKey, DeterministicRule
from agents.services import api_key_create
from audit.append_only import sqlite_flush_past_triggers
from mcpregistry import gate
from mcpregistry.contracts import annotation_risk_hint
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import DiscoveryReport, mcp_server_discover, tool_contract_update

# Property tests draw new examples on each run where a developer runs them; CI (HYPOTHESIS_PROFILE=ci, set by
# .ci/run) draws the same ones every time, so a run there passes or fails on the code, not on the draw.
hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Test code may create configuration rows directly (fixtures); the platform's own code never may, here as in
# production (audit/change_guard.py).
settings.PLATFORM_CHANGE_GUARD = "tests"
# The suite's databases (this process's and the platforms the tests start) begin with an empty audit record, as
# after a flush: the groups the data migrations make are not recorded at migrate time here (the chain tests count
# events from seq 1). tests/audit/test_migrated_groups.py checks that recording on fresh databases of its own.
settings.PLATFORM_AUDIT_MIGRATED_GROUPS = False
os.environ["PLATFORM_AUDIT_MIGRATED_GROUPS"] = "0"
# Tests drive the ReAct loop with the scripted model, also in the worker processes they start.
settings.PLATFORM_ALLOW_SCRIPTED_MODEL = True
os.environ["PLATFORM_ALLOW_SCRIPTED_MODEL"] = "1"
# The tests' own HTTP MCP servers listen on loopback: allowed the way an operator allows an internal host.
settings.PLATFORM_MCP_ALLOW_PRIVATE_URLS = ["127.0.0.1", "localhost"]
settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS = ["127.0.0.1", "localhost"]
os.environ["PLATFORM_MCP_ALLOW_PRIVATE_URLS"] = "127.0.0.1,localhost"

# TransactionTestCase empties every table after each test (Django's flush). SQLite's audit triggers refuse that, as
# PostgreSQL's would; the suite passes them the way archive_audit does (audit/append_only.py), and the post_migrate
# that follows a flush creates a fresh chain head.
# (The operations class through the backend's base module: importing sqlite3.operations first is a circular import.)
SqliteOperations = SqliteWrapper.ops_class
_sqlite_sql_flush = SqliteOperations.sql_flush


def _sql_flush_past_the_audit_triggers(self: Any, style: Any, tables: Any, **options: Any) -> list[str]:
    return sqlite_flush_past_triggers(_sqlite_sql_flush(self, style, tables, **options), tables)


SqliteOperations.sql_flush = _sql_flush_past_the_audit_triggers

# A secret bound to the demo server in tests: it must never be stored or shown anywhere.
DEMO_SECRET = "sk-test-binding-secret-5f2b9c1d7e"


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing() -> Iterator[None]:
    """Passwords made in this process are hashed with MD5 (Django's advice for tests): its default PBKDF2 takes
    0.4 s a password on two cores, and the suite makes hundreds of users. Hashing is still real (logins, lockouts
    and the browser's login form check the passwords); the processes the tests start keep the production
    hashers."""
    from django.test.utils import override_settings

    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    fast.enable()
    yield
    fast.disable()


@pytest.fixture(scope="session", autouse=True)
def _close_mcp_sessions_at_the_end() -> Iterator[None]:
    yield
    shutdown_default_pool()


@pytest.fixture(autouse=True)
def _forget_registered_secrets() -> Iterator[None]:
    """A worker keeps every bound secret it has seen registered for masking (by design); a test starts without
    the secrets of the tests before it, so that a fixture's short setting does not mask another test's text."""
    from audit.masking import clear_registered_secrets

    clear_registered_secrets()
    yield
    clear_registered_secrets()


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
def _language_of_the_settings() -> Iterator[None]:
    """Each test starts in the settings' language: a request in Korean leaves Korean active in the test's thread
    (the locale middleware activates it and nothing deactivates it), which would change the next test's texts."""
    from django.utils import translation

    translation.activate(settings.LANGUAGE_CODE)
    yield
    translation.activate(settings.LANGUAGE_CODE)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """Each test starts with an empty cache: rate-limit windows, login failure counts and lockouts, unknown-key
    counts per address (every test client is 127.0.0.1) and stream slots must not carry over between tests."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def gate_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Backoff waits cost no real time in tests; a test reads ``gate_clock.slept`` to check the schedule."""
    fake = FakeClock()
    monkeypatch.setattr(gate, "clock", fake)
    return fake


def confirm_read_tools(server: McpServer) -> None:
    """What an admin does after discovering a server: mark the tools that only read as ``read`` (discovery
    proposes ``write`` for every tool; the server's own read-only hints are never trusted by the platform)."""
    for contract in ToolContract.objects.filter(tool__server=server).select_related("tool__server"):
        if contract.risk != "read" and annotation_risk_hint(contract.tool.annotations) == "read":
            tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"risk": "read"})


def discover_as_admin(*, server: McpServer) -> DiscoveryReport:
    """Discover ``server`` and confirm its read-only tools, as an admin binding it would."""
    report = mcp_server_discover(server=server, actor="test-admin", via="tests")
    if report.ok:
        confirm_read_tools(server)
    return report


def bind_demo_server(
    *,
    mcp_id: str = "sds-company-data",
    failure_mode: str = "none",
    session_scope: str = "shared",
    shipped_delay: bool = False,
    **env: str,
) -> McpServer:
    """A binding to the shipped demo server (a real stdio process), discovered. Its injected timeout answers
    after 0.2 s, before the contract's own timeout, so that the suite stays fast; ``shipped_delay`` leaves
    ``FAILURE_TIMEOUT_S`` unset, as ``seed_demo`` does (the server's 5 s, past the contract's 2 s)."""
    delay: dict[str, str] = {} if shipped_delay else {"FAILURE_TIMEOUT_S": "0.2"}
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name="SDS company data",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
        cwd=str(settings.BASE_DIR),
        env={"FAILURE_MODE": failure_mode, "INTERNAL_API_KEY": DEMO_SECRET, **delay, **env},
        public_env=[*DEMO_PUBLIC_ENV, *env],
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


def module_flow_graphs(module: str) -> list[str]:
    """Every ``build_*`` function of the test module ``module``, as the dotted paths ``PLATFORM_FLOW_GRAPHS`` takes:
    a worker runs only registered flow graphs (``agents.flows.registered_flow_graphs``)."""
    import importlib

    found = importlib.import_module(module)
    return [
        f"{module}.{name}" for name in sorted(vars(found)) if name.startswith("build_") and callable(vars(found)[name])
    ]


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


# ---- personas ------------------------------------------------------------------------------------------------

AUDITOR_PASSWORD = "read-only-Ledger-42"
OUTSIDER_PASSWORD = "pw-for-tests-only-9"


class ApiCaller(NamedTuple):
    """An API key and the raw key shown once at its creation (unpacks as ``key, raw_key``)."""

    key: ApiKey
    raw_key: str


def logged_in(user: AbstractBaseUser) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def auditor_user(db: Any) -> AbstractBaseUser:
    """The auditor persona, made as an operator makes one: ``manage.py create_auditor audrey``."""
    call_command("create_auditor", "audrey", "--password", AUDITOR_PASSWORD, stdout=io.StringIO())
    return get_user_model().objects.get(username="audrey")


@pytest.fixture
def auditor_client(auditor_user: AbstractBaseUser) -> Client:
    return logged_in(auditor_user)


@pytest.fixture
def outsider(db: Any) -> AbstractBaseUser:
    """A user with no rights: on the staff, so the admin lets them log in, but in no group and with no permission."""
    return get_user_model().objects.create_user("otto", "", OUTSIDER_PASSWORD, is_staff=True)


@pytest.fixture
def outsider_client(outsider: AbstractBaseUser) -> Client:
    return logged_in(outsider)


@pytest.fixture
def api_caller(db: Any) -> ApiCaller:
    """The API caller persona: a key for every agent."""
    return ApiCaller(*api_key_create(actor="test", via="tests", name="caller"))


@pytest.fixture
def other_caller(db: Any) -> ApiCaller:
    """Another API caller, who must not see the first caller's runs."""
    return ApiCaller(*api_key_create(actor="test", via="tests", name="other caller"))


@pytest.fixture
def api_client(api_caller: ApiCaller) -> APIClient:
    """An ``APIClient`` that sends the API caller's key."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    return client


# ---- traces ----------------------------------------------------------------------------------------------------


class _SwitchedExport(SpanProcessor):
    """A span processor that hands finished spans to the in-memory exporter only while a test asks for spans."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.exporter.export([span])


_span_switch: _SwitchedExport | None = None


@pytest.fixture
def spans() -> Iterator[Any]:
    """The SDK's ``InMemorySpanExporter``, receiving every span finished during the test (the process's tracer
    provider is installed once, on first use; OpenTelemetry allows one per process)."""
    global _span_switch
    if _span_switch is None:
        _span_switch = _SwitchedExport(InMemorySpanExporter())
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):  # none yet (the OTEL_* variables may have installed one)
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(_span_switch)
    _span_switch.exporter.clear()
    _span_switch.on = True
    yield _span_switch.exporter
    _span_switch.on = False
    _span_switch.exporter.clear()


@pytest.fixture
def masked_caplog(caplog: Any) -> Iterator[Any]:
    """``caplog`` whose handler masks secrets as the platform's log handlers do (Django's LOGGING gives each one the
    filter). pytest keeps one capture handler for the whole session: the filter is taken off again afterwards."""
    from audit.masking import SecretMaskingFilter

    masking = SecretMaskingFilter()
    caplog.handler.addFilter(masking)
    try:
        yield caplog
    finally:
        caplog.handler.removeFilter(masking)
