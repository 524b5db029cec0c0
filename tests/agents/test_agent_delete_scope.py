"""An API key's list of agents: empty means every agent, so deleting the only agent a key may use would open every
agent to it. The delete is refused, by the service and on the admin's pages, naming the keys."""

from __future__ import annotations

import pytest
from django.test import Client

from agent_platform.errors import ApplicationError
from agents.models import Agent, ApiKey
from agents.services import agent_create, agent_delete, api_key_create

pytestmark = pytest.mark.django_db


def _agent(slug: str) -> Agent:
    return agent_create(actor="test", via="tests", data={"slug": slug, "name": slug, "model_provider": "offline"})


def test_an_agent_a_key_may_use_alone_is_not_deleted(db) -> None:
    alpha, beta = _agent("alpha"), _agent("beta")
    scoped, _raw = api_key_create(name="알파 전용", actor="test", via="tests", agents=[alpha])
    with pytest.raises(ApplicationError) as refused:
        agent_delete(agent=alpha, actor="test", via="tests")
    assert (refused.value.status, refused.value.code) == (409, "agent_in_key_scope")
    assert "알파 전용" in refused.value.message
    assert Agent.objects.filter(pk=alpha.pk).exists()
    assert [a.slug for a in ApiKey.objects.get(pk=scoped.pk).agents.all()] == ["alpha"]
    # A key that keeps another agent, or one for every agent, does not stop it.
    ApiKey.objects.get(pk=scoped.pk).agents.add(beta)
    api_key_create(name="모두", actor="test", via="tests")
    agent_delete(agent=alpha, actor="test", via="tests")
    assert [a.slug for a in ApiKey.objects.get(pk=scoped.pk).agents.all()] == ["beta"]


def test_the_admin_names_the_key_among_what_stops_the_delete(admin_client: Client) -> None:
    alpha, beta = _agent("alpha"), _agent("beta")
    api_key_create(name="pair-key", actor="test", via="tests", agents=[alpha, beta])
    # One of the two may go; both at once (the list's delete action) would leave the key with none.
    page = admin_client.get(f"/admin/agents/agent/{alpha.pk}/delete/").content.decode()
    assert "revoke it first" not in page
    assert "pair-key (" in page  # among what goes with it: the key's link to this agent
    both = {"action": "delete_selected", "_selected_action": [alpha.pk, beta.pk]}
    page = admin_client.post("/admin/agents/agent/", both).content.decode()
    assert "pair-key" in page and "revoke it first" in page
    admin_client.post("/admin/agents/agent/", {**both, "post": "yes"})
    assert Agent.objects.filter(slug__in=["alpha", "beta"]).count() == 2
    admin_client.post(f"/admin/agents/agent/{alpha.pk}/delete/", {"post": "yes"})
    assert not Agent.objects.filter(slug="alpha").exists()
    page = admin_client.get(f"/admin/agents/agent/{beta.pk}/delete/").content.decode()
    assert "pair-key" in page
    admin_client.post(f"/admin/agents/agent/{beta.pk}/delete/", {"post": "yes"})
    assert Agent.objects.filter(slug="beta").exists()


def test_a_revoked_key_does_not_stop_the_delete(db) -> None:
    from agents.services import api_key_revoke

    alpha = _agent("alpha")
    scoped, _raw = api_key_create(name="old", actor="test", via="tests", agents=[alpha])
    api_key_revoke(api_key=scoped, actor="test", via="tests")
    agent_delete(agent=alpha, actor="test", via="tests")
    assert not Agent.objects.filter(slug="alpha").exists()
