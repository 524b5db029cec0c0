"""A delete changes rows that stay: a many-to-many link goes with the deleted row (a group's members lose it, the
agents that bound a server lose the server, the API keys scoped to an agent lose the agent) and a foreign key may
be set to null (an eval set's agent). Each such row gets its own ``update`` event, after the delete's, naming
the deleted row: the record shows who lost what, not only what went."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from agents.models import Agent
from agents.services import agent_delete, api_key_create
from audit.models import AuditEvent
from audit.roles import group_delete, user_create
from evals.models import EvalSet
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_delete

pytestmark = pytest.mark.django_db


def events_since(seq: int) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    rows = AuditEvent.objects.filter(seq__gt=seq, action__startswith="config.").order_by("seq")
    return [(e.action, e.result["name"], e.args, e.result.get("deleted_with", {})) for e in rows]


def last_seq() -> int:
    return AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


def test_deleting_a_group_records_each_member_losing_it() -> None:
    reviewers, auditors = Group.objects.create(name="reviewer-x"), Group.objects.create(name="auditor-x")
    ann = user_create(actor="t", via="tests", username="ann", password=None, groups=[reviewers, auditors])
    user_create(actor="t", via="tests", username="bob", password=None, groups=[reviewers])
    user_create(actor="t", via="tests", username="cy", password=None, groups=[auditors])
    before, group_id = last_seq(), reviewers.pk

    group_delete(group=reviewers, actor="admin:root", via="admin")

    deleted_with = {"model": "auth.group", "id": group_id, "name": "reviewer-x"}
    assert events_since(before) == [
        ("config.group.delete", "reviewer-x", {"name": ["reviewer-x", None]}, {}),
        ("config.user.update", "ann", {"groups": [["auditor-x", "reviewer-x"], ["auditor-x"]]}, deleted_with),
        ("config.user.update", "bob", {"groups": [["reviewer-x"], []]}, deleted_with),
    ]
    assert list(get_user_model().objects.get(pk=ann.pk).groups.values_list("name", flat=True)) == ["auditor-x"]
    assert {e.actor for e in AuditEvent.objects.filter(seq__gt=before)} == {"admin:root"}


def test_deleting_a_server_records_each_agent_that_bound_it() -> None:
    kept = McpServer.objects.create(mcp_id="kept", name="kept", command=sys.executable, args=[])
    gone = McpServer.objects.create(mcp_id="gone", name="gone", command=sys.executable, args=[])
    agent = Agent.objects.create(slug="bound", name="bound")
    agent.servers.set([kept, gone])
    Agent.objects.create(slug="unbound", name="unbound")
    before, gone_id = last_seq(), gone.pk

    mcp_server_delete(server=gone, actor="admin:root", via="admin")

    [deleted, updated] = events_since(before)
    assert deleted[0] == "config.mcp_server.delete"
    assert updated == (
        "config.agent.update",
        str(agent),
        {"servers": [["gone", "kept"], ["kept"]]},
        {"model": "mcpregistry.mcpserver", "id": gone_id, "name": "gone"},
    )


def test_deleting_an_agent_records_the_eval_sets_and_api_keys_it_leaves() -> None:
    agent = Agent.objects.create(slug="leaving", name="leaving")
    other = Agent.objects.create(slug="staying", name="staying")
    key, _raw = api_key_create(name="scoped", actor="t", via="tests", agents=[agent, other])
    api_key_create(name="everyone", actor="t", via="tests")
    eval_set = EvalSet.objects.create(name="회귀", agent=agent)
    before, agent_id, agent_name = last_seq(), agent.pk, str(agent)

    agent_delete(agent=agent, actor="admin:root", via="admin")

    events = events_since(before)
    recorded = {(action, name): (args, deleted_with) for action, name, args, deleted_with in events}
    deleted_with = {"model": "agents.agent", "id": agent_id, "name": agent_name}
    assert recorded[("config.api_key.update", str(key))] == (
        {"agents": [sorted([agent_name, str(other)]), [str(other)]]},
        deleted_with,
    )
    assert recorded[("config.eval_set.update", str(eval_set))] == ({"agent": [agent_name, None]}, deleted_with)
    assert events[0][0] == "config.agent.delete" and len(events) == 3  # the key scoped to every agent is unchanged


def test_a_delete_that_changes_nothing_that_stays_records_only_itself() -> None:
    server = McpServer.objects.create(mcp_id="alone", name="alone", command=sys.executable, args=[])
    before = last_seq()
    mcp_server_delete(server=server, actor="admin:root", via="admin")
    assert [action for action, *_ in events_since(before)] == ["config.mcp_server.delete"]
