"""The server's admin page: Discover tools and Check health buttons with their result as a message (the server
id as it is spelled), non-secret environment values edited as values, and, after a rejected change of secrets,
the page says what is really stored."""

from __future__ import annotations

import re
import sys

import pytest
from django.conf import settings
from django.contrib.messages import get_messages
from django.test import Client

from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.conftest import DEMO_SECRET
from tests.mcpregistry.test_registry import post_server_form

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def page_messages(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_page_has_discover_and_health_buttons_that_report_in_a_message(admin_client: Client) -> None:
    server = McpServer.objects.create(
        mcp_id="sds-lower-case-id",
        name="demo",
        command=sys.executable,
        args=["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
        cwd=str(settings.BASE_DIR),
        env={"FAILURE_MODE": "none"},
        public_env=["FAILURE_MODE"],
    )
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert 'id="discover-tools"' in page and 'id="check-health"' in page
    assert admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/discover/").status_code == 405
    response = admin_client.post(f"/admin/mcpregistry/mcpserver/{server.pk}/discover/")
    assert response.status_code == 302
    [message] = page_messages(response)
    assert message.startswith("Discovery of sds-lower-case-id: 7 tools listed; added: ")
    assert "search_employee" in message
    # Every added tool starts as a write: said, with those that say they only read (a first run parked for
    # approval of a lookup, and nothing had told the admin why).
    assert "each added tool asks a person to approve every call (risk: write) until you mark it read" in message
    hinted = message.split("saying they only read (readOnlyHint, the server's word, not checked): ")[1]
    assert "search_employee" in hinted.split(";")[0]
    response = admin_client.post(f"/admin/mcpregistry/mcpserver/{server.pk}/health/")
    message = page_messages(response)[-1]
    assert re.match(r"Health of sds-lower-case-id: ok, 7 tools listed in \d+ ms$", message), message
    server.refresh_from_db()
    assert server.health == "ok"


def test_a_failed_health_check_is_an_error_message_and_the_servers_health(admin_client: Client) -> None:
    server = McpServer.objects.create(mcp_id="broken", name="b", command=sys.executable, args=["-m", "no.such.module"])
    response = admin_client.post(f"/admin/mcpregistry/mcpserver/{server.pk}/health/")
    [message] = page_messages(response)
    assert message.startswith("Health of broken: error:")
    server.refresh_from_db()
    assert server.health == "error"


def test_non_secret_environment_values_are_shown_and_edited_as_values(admin_client, demo_server) -> None:
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{demo_server.pk}/change/").content.decode()
    assert "FAILURE_MODE=none" in page and DEMO_SECRET not in page
    response = post_server_form(
        admin_client, demo_server, env_settings="FAILURE_MODE=timeout\nFAILURE_TIMEOUT_S=0.5\nREGION=kr"
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    demo_server.refresh_from_db()
    assert demo_server.public_env == ["FAILURE_MODE", "FAILURE_TIMEOUT_S", "REGION"]
    assert demo_server.env["FAILURE_MODE"] == "timeout" and demo_server.env["REGION"] == "kr"
    assert demo_server.env["INTERNAL_API_KEY"] == DEMO_SECRET  # the secret is untouched
    page = post_server_form(admin_client, demo_server, env_settings="FAILURE_MODE").content.decode()
    assert "Line 1: write NAME=value" in page


def test_saving_the_page_as_shown_keeps_a_setting_name_that_has_no_value(admin_client) -> None:
    server = McpServer.objects.create(
        mcp_id="settings",
        name="s",
        command=sys.executable,
        args=[],
        env={"FAILURE_MODE": "none", "API_TOKEN": "tok-5e6f7a8b9c0d"},
        public_env=["FAILURE_MODE", "FAILURE_TIMEOUT_S"],  # FAILURE_TIMEOUT_S: a setting, not set (not shown)
    )
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert "FAILURE_MODE=none" in page and "FAILURE_TIMEOUT_S" not in page

    response = post_server_form(admin_client, server, env_settings="FAILURE_MODE=none", name="renamed")

    assert response.status_code == 302, response.content.decode()[:2000]
    server.refresh_from_db()
    assert server.public_env == ["FAILURE_MODE", "FAILURE_TIMEOUT_S"]
    [update] = AuditEvent.objects.filter(action="config.mcp_server.update", result__id=server.pk)
    assert update.args == {"name": ["s", "renamed"]}  # the one change made


def test_after_a_rejected_secret_the_page_says_what_is_stored(admin_client, demo_server) -> None:
    response = post_server_form(
        admin_client, demo_server, new_env="OTHER=sk-other-123456\nT=Bearer ${AWS_SECRET_ACCESS_KEY}"
    )
    page = response.content.decode()
    assert response.status_code == 200 and "placeholders are not allowed" in page
    secrets = re.search(r"field-secrets_state.*?</div>\s*</div>", page, re.S).group(0)
    assert "INTERNAL_API_KEY" in secrets and "OTHER" not in secrets and "T</code>" not in secrets
    demo_server.refresh_from_db()
    assert "OTHER" not in demo_server.env
    assert "sk-other-123456" not in page  # what was typed is not sent back (a secret), as a password box's is


def test_a_name_given_as_a_setting_and_as_a_secret_is_refused_not_stored_shown(admin_client, demo_server) -> None:
    """Both ways at once, the secret's value used to be stored under a name marked as a setting: shown in clear on
    the page, never masked."""
    response = post_server_form(
        admin_client,
        demo_server,
        env_settings="FAILURE_MODE=none\nAPI_TOKEN=public-value",
        new_env="API_TOKEN=supersecret-XYZ-123",
    )
    page = response.content.decode()
    assert response.status_code == 200 and "API_TOKEN: given as a setting and as a secret" in page
    assert "supersecret-XYZ-123" not in page
    demo_server.refresh_from_db()
    assert "API_TOKEN" not in demo_server.env and "API_TOKEN" not in (demo_server.public_env or [])


def test_a_secret_given_for_a_settings_name_makes_it_a_secret(admin_client, demo_server) -> None:
    """A post that carries no settings box (a script's) gives a setting's name a secret value: it is a secret
    from then on, never shown."""
    assert "FAILURE_MODE" in demo_server.public_env
    response = post_server_form(admin_client, demo_server, new_env="FAILURE_MODE=sk-now-a-secret-77")
    assert response.status_code == 302, response.content.decode()[:2000]
    demo_server.refresh_from_db()
    assert "FAILURE_MODE" not in demo_server.public_env
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{demo_server.pk}/change/").content.decode()
    assert "sk-now-a-secret-77" not in page
