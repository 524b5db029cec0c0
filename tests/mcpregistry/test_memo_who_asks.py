"""The gate's cross-run memo (``memo_ttl_s``) keeps a read's answer for later runs; its key held the server's id,
the tool and the arguments alone:

* a server that gives each run a session of its own (``per_run``, the default): one caller's run logged in as
  alice, another's as bob, and bob's "my orders" was answered with alice's, audited as a plain ``memo:hit``;
* a binding changed since (its environment's tenant, its headers, deleted and made again): every agent on it was
  answered from the old backend for up to the TTL.

A run's own session keeps its answers to itself, and the binding as configured leads the shared key. The server is
real (``tests/mcp_fixtures/session_tenant_server.py``)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.core.cache import cache

from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_update
from tests.conftest import discover_as_admin

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def bound(mcp_id: str, *, scope: str, tenant: str = "alpha") -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.session_tenant_server"],
        cwd=str(settings.BASE_DIR),
        env={"TENANT": tenant},
        public_env=["TENANT"],
        session_scope=scope,
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read", memo=True, memo_ttl_s=600)
    return McpServer.objects.get(pk=server.pk)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def in_run(server: McpServer, run_id: str, tool: str, **args: str) -> gate.ToolResult:
    return gate.call(
        server=server, tool_name=tool, args=args, who=gate.GateCall(source="agent", run_id=run_id, memo={})
    )


def test_a_run_of_its_own_session_never_answers_another_run_from_the_memo() -> None:
    server = bound("shop", scope=McpServer.SessionScope.PER_RUN)
    alice, bob = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        in_run(server, alice, "login", user="alice")
        assert in_run(server, alice, "my_orders").value == "orders of alice"
        in_run(server, bob, "login", user="bob")
        orders = in_run(server, bob, "my_orders")
    finally:
        for run_id in (alice, bob):
            get_default_pool().close_scope(f"run:{run_id}")
        get_default_pool().close("shop")

    assert (orders.value, orders.memo_hit) == ("orders of bob", False)


def test_a_binding_changed_since_is_never_answered_with_what_the_old_one_said() -> None:
    server = bound("crm", scope=McpServer.SessionScope.SHARED)
    try:
        first = in_run(server, str(uuid.uuid4()), "tenant")
        again = in_run(server, str(uuid.uuid4()), "tenant")
        mcp_server_update(server=server, actor="admin", via="tests", data={"env": {"TENANT": "beta"}})
        moved = in_run(McpServer.objects.get(pk=server.pk), str(uuid.uuid4()), "tenant")
    finally:
        get_default_pool().close("crm")

    assert (first.value, again.value, again.memo_hit) == ("tenant=alpha", "tenant=alpha", True)  # the memo is on
    assert (moved.value, moved.memo_hit) == ("tenant=beta", False)
