"""Discovery and the health check of a binding whose stored secrets this process cannot decrypt.

The defect it holds: both read the binding's secrets before the ``try`` that records a failure as the server's
health, so ``SecretDecryptionError`` escaped them. The server page's Discover tools and Check health buttons and
the list's actions answered 500, the stored health stayed ``ok`` with no last error, and ``manage.py
mcp_discover`` stopped with a traceback at that server, leaving the servers after it undiscovered. Now each is a
failed report that says why (the keys), recorded as the server's health error, with nothing connected.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.agents.test_poisoned_runs import store_foreign
from tests.mcpregistry.test_registry import mutable_server

pytestmark = pytest.mark.django_db

SERVER_URL = "/admin/mcpregistry/mcpserver/{}/{}/"
LIST_URL = "/admin/mcpregistry/mcpserver/"


@pytest.fixture
def lost(demo_server: McpServer) -> McpServer:
    """The demo binding, discovered and healthy, its env then stored by another installation's key; no session of
    it is held, so one held afterwards was opened by what the test did."""
    assert McpServer.objects.get(pk=demo_server.pk).health == McpServer.Health.OK  # discovery recorded it
    get_default_pool().close(demo_server.mcp_id)
    store_foreign(McpServer, "env", demo_server.pk, {"INTERNAL_API_KEY": "foreign-000000000000"})
    return McpServer.objects.get(pk=demo_server.pk)


def page_messages(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(m) for m in get_messages(response.wsgi_request)]


def assert_recorded_and_not_connected(server: McpServer, tools_before: list[tuple[str, bool]]) -> None:
    """The server's health is the error that names the keys; no session was opened; the registry is unchanged."""
    server.refresh_from_db()
    assert server.health == McpServer.Health.ERROR
    assert "SECRETS_ENCRYPTION_KEYS" in server.last_error and "foreign" not in server.last_error
    assert server.last_checked_at is not None
    sessions = get_default_pool().live_sessions().values()
    assert not [s for s in sessions if s["mcp_id"] == server.mcp_id]
    assert list(server.tools.values_list("name", "available")) == tools_before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("operation", "prefix"),
    [("discover", "Discovery of sds-company-data failed: "), ("health", "Health of sds-company-data: error: ")],
)
def test_the_server_pages_buttons_say_the_keys_cannot_decrypt_the_secrets(
    admin_client: Client, lost: McpServer, operation: str, prefix: str
) -> None:
    tools_before = list(lost.tools.values_list("name", "available"))
    admin_client.raise_request_exception = False
    response = admin_client.post(SERVER_URL.format(lost.pk, operation))
    assert response.status_code == 302
    [message] = page_messages(response)
    assert message.startswith(prefix)
    assert "cannot be decrypted" in message and "SECRETS_ENCRYPTION_KEYS" in message
    assert_recorded_and_not_connected(lost, tools_before)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["discover_tools", "check_health"])
def test_the_lists_actions_report_the_server_and_go_on_to_the_next(
    admin_client: Client, lost: McpServer, action: str
) -> None:
    after = mutable_server("zz-after")  # listed after the lost one (servers are ordered by id)
    tools_before = list(lost.tools.values_list("name", "available"))
    admin_client.raise_request_exception = False
    response = admin_client.post(LIST_URL, {"action": action, "_selected_action": [lost.pk, after.pk]})
    assert response.status_code == 302
    lost_message, after_message = page_messages(response)
    assert "sds-company-data" in lost_message and "SECRETS_ENCRYPTION_KEYS" in lost_message
    assert "zz-after" in after_message and "SECRETS_ENCRYPTION_KEYS" not in after_message
    assert_recorded_and_not_connected(lost, tools_before)
    after.refresh_from_db()
    assert after.health == McpServer.Health.OK


@pytest.mark.slow
def test_the_command_writes_the_servers_line_discovers_the_next_and_fails_at_the_end(lost: McpServer) -> None:
    mutable_server("zz-after")
    get_default_pool().close("zz-after")
    tools_before = list(lost.tools.values_list("name", "available"))
    out = StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("mcp_discover", "sds-company-data", "zz-after", stdout=out)
    assert "sds-company-data" in str(failure.value) and "zz-after" not in str(failure.value)
    text = out.getvalue()
    assert "sds-company-data: the stored secret values cannot be decrypted" in text
    assert "zz-after: ok, 1 tools (added 0, updated 0, vanished 0)" in text
    assert_recorded_and_not_connected(lost, tools_before)
