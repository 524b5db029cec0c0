"""An API key's list of agents: empty means every agent, so taking the last agent off a key widens it to every
agent. The edit was saved (the admin's form with every agent unticked, any caller of ``api_key_update`` giving
``agents=[]``) and recorded as ``{"agents": [["alpha"], []]}``: a reviewer read a scope emptied, not opened. It is
refused now, by the service and at the admin's field, nothing written or audited; a key for every agent is still
edited as before."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agents.models import Agent, ApiKey
from agents.services import agent_create, api_key_create, api_key_revoke, api_key_update
from audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def _agent(slug: str) -> Agent:
    return agent_create(actor="test", via="tests", data={"slug": slug, "name": slug, "model_provider": "offline"})


def _updates() -> int:
    return AuditEvent.objects.filter(action="config.api_key.update").count()


def _slugs(key: ApiKey) -> list[str]:
    return sorted(ApiKey.objects.get(pk=key.pk).agents.values_list("slug", flat=True))


def test_the_service_refuses_to_take_a_keys_last_agent_off(db) -> None:
    alpha = _agent("alpha")
    key, _raw = api_key_create(name="alpha-only", actor="test", via="tests", agents=[alpha])
    with pytest.raises(ValidationError) as refused:
        api_key_update(api_key=key, actor="test", via="tests", data={"name": "renamed"}, agents=[])
    [error] = refused.value.error_dict["agents"]
    assert error.code == "key_scope_widened" and "every agent" in error.message
    assert _slugs(key) == ["alpha"] and ApiKey.objects.get(pk=key.pk).name == "alpha-only"
    assert _updates() == 0


def test_a_key_for_every_agent_is_still_edited(db) -> None:
    key, _raw = api_key_create(name="everyone", actor="test", via="tests")
    api_key_update(api_key=key, actor="test", via="tests", data={"name": "모두", "rate": "60/min"}, agents=[])
    stored = ApiKey.objects.get(pk=key.pk)
    assert (stored.name, stored.rate, _slugs(key)) == ("모두", "60/min", [])


def test_a_key_may_move_to_other_agents_and_a_revoked_one_be_emptied(db) -> None:
    alpha, beta = _agent("alpha"), _agent("beta")
    key, _raw = api_key_create(name="scoped", actor="test", via="tests", agents=[alpha])
    api_key_update(api_key=key, actor="test", via="tests", agents=[beta])
    assert _slugs(key) == ["beta"]
    # A revoked key uses nothing any more, and is never live again: its list may go (as its agents may be deleted).
    api_key_revoke(api_key=key, actor="test", via="tests")
    api_key_update(api_key=ApiKey.objects.get(pk=key.pk), actor="test", via="tests", agents=[])
    assert _slugs(key) == []


def test_the_admin_shows_the_refusal_at_the_agents_field(admin_client: Client) -> None:
    alpha, beta = _agent("alpha"), _agent("beta")
    key, _raw = api_key_create(name="alpha-only", actor="test", via="tests", agents=[alpha])
    page = admin_client.post(f"/admin/agents/apikey/{key.pk}/change/", {"name": "alpha-only", "rate": ""})
    assert page.status_code == 200  # the form again, not a redirect to the list
    assert "agents" in page.context["adminform"].form.errors
    assert "keep at least one" in page.content.decode()
    assert _slugs(key) == ["alpha"] and _updates() == 0
    # Moving it to another agent saves as before.
    page = admin_client.post(f"/admin/agents/apikey/{key.pk}/change/", {"name": "beta-only", "agents": [beta.pk]})
    assert page.status_code == 302 and _slugs(key) == ["beta"] and _updates() == 1


def test_the_admin_still_edits_a_key_for_every_agent(admin_client: Client) -> None:
    key, _raw = api_key_create(name="everyone", actor="test", via="tests")
    page = admin_client.post(f"/admin/agents/apikey/{key.pk}/change/", {"name": "everyone", "rate": "5/min"})
    assert page.status_code == 302
    assert ApiKey.objects.get(pk=key.pk).rate == "5/min" and _slugs(key) == []
