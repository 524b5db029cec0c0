"""Who the admin's custom views still let in, and what they say otherwise (review of the admin views):

- the run's live stream is authorised by the admin session, not the user alone: signing out, a password
  changed elsewhere (which signs every other session out), deactivation or a lost permission ends an open
  stream with an ``event: error`` that speaks of the session, not of an API key;
- the stream re-checks with the run page's own rule, so a user who may change runs (and so view them) keeps it;
- every link the dashboard shows its reader opens (no 403), for each kind of user;
- discovering or checking a server that does not exist is a 404 for an admin, a 403 for whoever may not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

from agents.models import Run, RunEvent
from agents.services import api_key_create
from mcpregistry.models import McpServer
from tests.agents.test_admin_runs import a_run, an_approval
from tests.conftest import logged_in

pytestmark = pytest.mark.django_db

SESSION_ENDED = "Your admin session has ended, or you may no longer view runs; the stream is closed."


def staff(name: str, *, perms: tuple[str, ...] = (), groups: tuple[str, ...] = (), superuser: bool = False) -> Any:
    user = get_user_model().objects.create_user(name, "", "pw-x-123456", is_staff=True, is_superuser=superuser)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return get_user_model().objects.get(pk=user.pk)  # no cached permissions


@pytest.fixture
def every_poll_rechecks(settings: Any) -> None:
    """The stream asks again at each poll (no wait for ``PLATFORM_SSE_AUTH_RECHECK_S``) and gives up after one
    second: a stream that is not cut ends with ``open too long`` instead of ``event: error``."""
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 0
    settings.PLATFORM_SSE_POLL_S = 0.01
    settings.PLATFORM_SSE_MAX_S = 1


def sign_out(client: Client, user: Any) -> None:
    assert client.post("/admin/logout/").status_code == 200


def change_password_elsewhere(client: Client, user: Any) -> None:
    user.set_password("a-new-one-987654")
    user.save()


def deactivate(client: Client, user: Any) -> None:
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)


def take_the_permission_away(client: Client, user: Any) -> None:
    user.user_permissions.clear()


@pytest.mark.parametrize("end", [sign_out, change_password_elsewhere, deactivate, take_the_permission_away])
def test_an_open_admin_stream_ends_once_its_session_may_no_longer_view_the_run(
    every_poll_rechecks: None, end: Callable[[Client, Any], None]
) -> None:
    user = staff("operator", perms=("agents.view_run",))
    client = logged_in(user)
    run = a_run(status=Run.Status.RUNNING)
    stream = iter(client.get(f"/admin/agents/run/{run.pk}/events/").streaming_content)
    assert next(stream).startswith(b"retry:")  # the stream is open
    end(client, user)
    assert client.get(f"/admin/agents/run/{run.pk}/timeline/").status_code in (302, 403)  # a new request is refused
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running", "note": "나중"})
    rest = b"".join(stream).decode()
    assert rest.startswith("event: error") and SESSION_ENDED in rest
    assert "나중" not in rest and "API key" not in rest


@pytest.mark.slow
def test_a_stream_still_signed_in_runs_on_until_it_is_open_too_long(every_poll_rechecks: None) -> None:
    client = logged_in(staff("operator", perms=("agents.view_run",)))
    run = a_run(status=Run.Status.RUNNING)
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running"})
    body = b"".join(client.get(f"/admin/agents/run/{run.pk}/events/").streaming_content).decode()
    assert "id: 1\n" in body and "event: error" not in body and "open too long" in body


@pytest.mark.slow
def test_a_user_who_may_change_runs_keeps_the_stream_the_run_page_lets_them_open(every_poll_rechecks: None) -> None:
    client = logged_in(staff("canceller", perms=("agents.change_run",)))
    run = a_run(status=Run.Status.RUNNING)
    assert client.get(f"/admin/agents/run/{run.pk}/change/").status_code == 200
    body = b"".join(client.get(f"/admin/agents/run/{run.pk}/events/").streaming_content).decode()
    assert "event: error" not in body and "open too long" in body


VIEW_EVERYTHING = (
    "mcpregistry.view_mcpserver",
    "agents.view_agentversion",
    "agents.view_run",
    "agents.view_approval",
    "agents.view_deterministicrule",
    "audit.view_auditevent",
    "evals.view_evalrun",
)


@pytest.mark.slow
def test_every_admin_link_on_the_dashboard_opens_for_its_reader() -> None:
    key, _raw = api_key_create(actor="t", via="tests", name="키")
    a_run(status=Run.Status.FAILED, api_key=key, tokens=10)  # tokens without a price: the "Model prices" link
    an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    McpServer.objects.create(mcp_id="dead", name="dead", transport="http", url="http://127.0.0.1:9/mcp")
    readers = {
        "outsider": staff("otto"),
        "auditor": staff("audrey", groups=("auditor",)),
        "reviewer": staff("rita", groups=("reviewer",)),
        "viewer": staff("vic", perms=VIEW_EVERYTHING),
        "canceller": staff("carl", perms=("agents.change_run",)),
        "superuser": staff("root", superuser=True),
    }
    refused: list[tuple[str, str]] = []
    followed = 0
    for who, user in readers.items():
        client = logged_in(user)
        page = client.get("/admin/").content.decode()
        for href in sorted(set(re.findall(r'href="(/admin/[^"]*)"', page))):
            if "logout" not in href:
                followed += 1
                if client.get(href.replace("&amp;", "&")).status_code == 403:
                    refused.append((who, href))
    assert refused == []
    assert followed > 50  # the readers were shown links, and the links were followed


def test_the_rule_tester_link_shows_to_whoever_may_change_rules_as_the_tester_asks() -> None:
    reader = logged_in(staff("vic", perms=("audit.view_auditevent", "agents.view_deterministicrule")))
    editor = logged_in(staff("eve", perms=("audit.view_auditevent", "agents.change_deterministicrule")))
    assert "/admin/agents/rule-tester/" not in reader.get("/admin/").content.decode()
    assert "/admin/agents/rule-tester/" in editor.get("/admin/").content.decode()
    assert editor.get("/admin/agents/rule-tester/").status_code == 200


@pytest.mark.parametrize("operation", ["discover", "health"])
@pytest.mark.parametrize("object_id", ["99999", "abc"])
def test_a_missing_server_is_a_404_for_an_admin_and_a_403_for_whoever_may_not(operation: str, object_id: str) -> None:
    url = f"/admin/mcpregistry/mcpserver/{object_id}/{operation}/"
    admin = logged_in(staff("root", superuser=True))
    viewer = logged_in(staff("vic", perms=("mcpregistry.view_mcpserver",)))
    assert admin.post(url).status_code == 404
    assert viewer.post(url).status_code == 403
