"""Every admin action that changes something asks for a permission to change: Django offers an action without
``permissions`` to anyone who may open the list, and runs it without another check. A member of staff who may
only view tools approved a tool's changed schema (and made it callable), ran discovery and published agents."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission

from agents.models import Agent
from audit.roles import user_create
from mcpregistry.models import McpTool

# Actions that change nothing and start nothing (none now: checking a server's health starts its process and
# connects out, and asks for the change permission as the server page's health button does).
READ_ONLY_ACTIONS: set[tuple[str, str, str]] = set()


def test_every_admin_action_that_changes_something_asks_for_a_permission() -> None:
    unguarded = []
    for model, model_admin in admin.site._registry.items():
        for function, name, _description in model_admin._get_base_actions():
            if name == "delete_selected":
                continue  # Django's own: it asks for the delete permission
            key = (model._meta.app_label, model._meta.model_name, name)
            if not getattr(function, "allowed_permissions", None) and key not in READ_ONLY_ACTIONS:
                unguarded.append(key)
    assert unguarded == []


@pytest.mark.django_db
def test_a_viewer_cannot_approve_a_tool_or_publish_an_agent(client, demo_agent, demo_server) -> None:
    viewer = user_create(actor="t", via="tests", username="viewer", password="view-only-pw-1", is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_mcptool", "view_mcpserver", "view_agent"])
    )
    client.force_login(viewer)
    tool = McpTool.objects.get(server=demo_server, name="search_employee")
    McpTool.objects.filter(pk=tool.pk).update(review_required=True, enabled=False)

    client.post("/admin/mcpregistry/mcptool/", {"action": "approve_reviewed_changes", "_selected_action": [tool.pk]})
    client.post("/admin/agents/agent/", {"action": "publish", "_selected_action": [demo_agent.pk]})

    tool.refresh_from_db()
    assert (tool.review_required, tool.enabled) == (True, False)
    assert not Agent.objects.get(pk=demo_agent.pk).versions.exists()


@pytest.mark.django_db
def test_a_viewer_cannot_start_a_servers_process_by_checking_its_health(client, demo_server) -> None:
    from mcpregistry.models import McpServer

    viewer = user_create(actor="t", via="tests", username="viewer", password="view-only-pw-1", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_mcpserver"]))
    client.force_login(viewer)
    before = McpServer.objects.get(pk=demo_server.pk).last_checked_at
    client.post("/admin/mcpregistry/mcpserver/", {"action": "check_health", "_selected_action": [demo_server.pk]})
    assert McpServer.objects.get(pk=demo_server.pk).last_checked_at == before  # not connected to
