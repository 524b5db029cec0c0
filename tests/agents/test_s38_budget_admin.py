"""A stored budget keeps its owner; a view-only admin's POST to a configuration list (every admin on
``ServiceAdminMixin``) is a 403; a key is revoked by its prefix though another key is named after it; ``GET
/api/v1/usage`` says its days are UTC ones."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agents.budgets import budget_create, budget_delete, budget_update, model_price_create, period_bounds
from agents.models import ApiKey, Budget, BudgetUsage, DeterministicRule, ModelPrice
from agents.services import api_key_create
from audit.models import AuditEvent
from audit.roles import user_create
from evals.services import eval_set_apply
from mcpregistry.models import McpServer, McpTool
from tests.agents.test_budgets import scripted_agent, submit
from tests.conftest import ApiCaller

# --- a budget's owner -----------------------------------------------------------------------------------------


def _bearer(caller: ApiCaller) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client


def _key_budget(caller: ApiCaller) -> Budget:
    data = {"api_key": caller.key, "period": "day", "max_tokens": 400, "run_reservation_tokens": 400}
    return budget_create(actor="test-admin", via="tests", data=data)


@pytest.mark.django_db
def test_a_stored_budgets_key_is_not_changed_on_its_change_page(
    admin_client: Client, api_client: APIClient, api_caller: ApiCaller, other_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = _key_budget(api_caller)
    assert submit(api_client).status_code == 202  # queued: holds the whole limit on the first key's budget
    page = admin_client.get(f"/admin/agents/budget/{budget.pk}/change/").content.decode()
    assert 'name="api_key"' not in page and 'name="agent"' not in page
    assert "cannot be changed (its spend and runs in flight are theirs)" in page  # the page says why
    assert "cannot be changed" not in admin_client.get("/admin/agents/budget/add/").content.decode()

    posted = {
        "api_key": other_caller.key.pk,
        "agent": "",
        "period": "day",
        "max_tokens": 500,
        "run_reservation_tokens": 400,
        "enabled": "on",
    }
    response = admin_client.post(f"/admin/agents/budget/{budget.pk}/change/", posted)

    assert response.status_code == 302, response.content
    budget.refresh_from_db()
    assert (budget.api_key_id, budget.max_tokens) == (api_caller.key.pk, 500)  # the limit changed, not the key
    other = _bearer(other_caller)
    assert other.get("/api/v1/usage").json()["budgets"] == []
    assert submit(other).status_code == 202  # not refused for the first key's run in flight
    usage = BudgetUsage.objects.get(budget=budget)
    assert usage.reserved_tokens == 400


@pytest.mark.django_db
def test_budget_update_refuses_another_owner_and_writes_nothing(api_caller: ApiCaller, other_caller: ApiCaller) -> None:
    agent = scripted_agent()
    budget = _key_budget(api_caller)
    events = AuditEvent.objects.count()

    with pytest.raises(ValidationError) as refused:
        budget_update(budget=budget, actor="test-admin", via="tests", data={"api_key": other_caller.key})
    assert set(refused.value.message_dict) == {"api_key"}
    assert "create a new budget" in refused.value.message_dict["api_key"][0]

    moved = Budget.objects.get(pk=budget.pk)
    moved.api_key, moved.agent = None, agent  # as a form's instance carries it
    with pytest.raises(ValidationError) as refused:
        budget_update(budget=moved, actor="test-admin", via="tests")
    assert set(refused.value.message_dict) == {"api_key", "agent"}

    stored = Budget.objects.get(pk=budget.pk)
    assert (stored.api_key_id, stored.agent_id) == (api_caller.key.pk, None)
    assert AuditEvent.objects.count() == events
    # Its other fields still change.
    budget_update(budget=stored, actor="test-admin", via="tests", data={"max_tokens": 800})
    assert Budget.objects.get(pk=budget.pk).max_tokens == 800


# --- a view-only admin's POST to a configuration list -----------------------------------------------------------


def _staff(username: str, *codenames: str) -> Client:
    user = user_create(actor="test", via="tests", username=username, password="x-pw-Staff-123", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def _configuration() -> dict[str, tuple[str, Any]]:
    """Each configuration list, and a row of it: ``(model, pk)``."""
    agent = scripted_agent()
    key, _raw = api_key_create(actor="test", via="tests", name="listed key")
    budget = budget_create(
        actor="test", via="tests", data={"api_key": key, "period": "day", "max_tokens": 10, "run_reservation_tokens": 1}
    )
    price = model_price_create(
        actor="test",
        via="tests",
        data={"provider": "scripted", "model_id": "m", "input_per_mtok": 1, "output_per_mtok": 1},
    )
    group = Group.objects.create(name="listed group")
    user = user_create(actor="test", via="tests", username="listed", password="x-pw-Listed-123")
    server = McpServer.objects.create(mcp_id="listed", name="listed", command="true")
    tool = McpTool.objects.create(server=server, name="lookup", input_schema={"type": "object"})
    rule = DeterministicRule.objects.create(agent=agent, name="listed rule", server=server, tool_name="lookup")
    eval_set = eval_set_apply(
        document={"name": "listed", "cases": [{"key": "c", "query": "질문"}]}, actor="test", via="tests"
    ).eval_set
    return {
        "/admin/mcpregistry/mcpserver/": ("mcpserver", server.pk),
        "/admin/mcpregistry/mcptool/": ("mcptool", tool.pk),
        "/admin/agents/deterministicrule/": ("deterministicrule", rule.pk),
        "/admin/evals/evalset/": ("evalset", eval_set.pk),
        "/admin/agents/agent/": ("agent", agent.pk),
        "/admin/agents/apikey/": ("apikey", key.pk),
        "/admin/agents/budget/": ("budget", budget.pk),
        "/admin/agents/modelprice/": ("modelprice", price.pk),
        "/admin/auth/user/": ("user", user.pk),
        "/admin/auth/group/": ("group", group.pk),
    }


@pytest.mark.django_db
def test_a_view_only_admins_action_on_a_configuration_list_is_a_403() -> None:
    lists = _configuration()
    viewer = _staff("viewer", *(f"view_{model}" for model, _pk in lists.values()))
    actions = {"/admin/agents/apikey/": "revoke", "/admin/agents/agent/": "publish"}

    for url, (_model, pk) in lists.items():
        for action in {actions.get(url, "delete_selected"), "delete_selected"}:
            response = viewer.post(url, {"action": action, "_selected_action": [str(pk)], "post": "yes"})
            assert response.status_code == 403, (url, action, response.status_code)
        assert viewer.get(url).status_code == 200  # the list itself is theirs to read

    assert ApiKey.objects.get(pk=lists["/admin/agents/apikey/"][1]).revoked_at is None
    assert Budget.objects.filter(pk=lists["/admin/agents/budget/"][1]).exists()
    assert ModelPrice.objects.filter(pk=lists["/admin/agents/modelprice/"][1]).exists()
    assert Group.objects.filter(name="listed group").exists()
    assert McpServer.objects.filter(mcp_id="listed").exists() and DeterministicRule.objects.exists()


@pytest.mark.django_db
def test_who_may_change_or_delete_still_runs_the_lists_actions() -> None:
    lists = _configuration()
    key_pk = lists["/admin/agents/apikey/"][1]
    changer = _staff("changer", "view_apikey", "change_apikey")
    response = changer.post("/admin/agents/apikey/", {"action": "revoke", "_selected_action": [str(key_pk)]})
    assert response.status_code == 302, response.content
    assert ApiKey.objects.get(pk=key_pk).revoked_at is not None

    # Deleting is the delete permission's, without the change one.
    budget_pk = lists["/admin/agents/budget/"][1]
    deleter = _staff("deleter", "view_budget", "delete_budget")
    response = deleter.post(
        "/admin/agents/budget/", {"action": "delete_selected", "_selected_action": [str(budget_pk)], "post": "yes"}
    )
    assert response.status_code == 302, response.content
    assert not Budget.objects.filter(pk=budget_pk).exists()

    # "Go" with no action chosen: Django's own "No action selected", not a 403, for who is offered actions.
    other = lists["/admin/agents/apikey/"][1]
    response = deleter.post(
        "/admin/agents/budget/", {"action": "", "index": "0", "_selected_action": [str(other)]}, follow=True
    )
    assert response.status_code == 200 and "No action selected" in response.content.decode()
    viewer = _staff("viewer-only", "view_budget")
    response = viewer.post("/admin/agents/budget/", {"action": "", "index": "0", "_selected_action": [str(other)]})
    assert response.status_code == 403  # offered no action at all


# --- revoke_api_key --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_key_is_revoked_by_its_prefix_though_another_key_is_named_after_it() -> None:
    key, raw = api_key_create(actor="test", via="tests", name="billing")
    namesake, _raw = api_key_create(actor="test", via="tests", name=key.prefix)

    call_command("revoke_api_key", key.prefix, stdout=io.StringIO())

    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert ApiKey.objects.get(pk=namesake.pk).revoked_at is None
    # The whole key too; and a name no prefix matches still names its key.
    call_command("revoke_api_key", raw, stdout=io.StringIO())
    call_command("revoke_api_key", key.prefix, stdout=io.StringIO())  # already revoked: said so, nothing else
    assert ApiKey.objects.get(pk=namesake.pk).revoked_at is None
    other, _raw = api_key_create(actor="test", via="tests", name="정산")
    call_command("revoke_api_key", "정산", stdout=io.StringIO())
    assert ApiKey.objects.get(pk=other.pk).revoked_at is not None


# --- GET /api/v1/usage -----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_usage_says_its_days_start_at_midnight_utc(api_client: APIClient) -> None:
    body = api_client.get("/api/v1/usage").json()

    assert body["day_boundary"] == "UTC"
    now = timezone.now()
    for name, period in (("today", Budget.Period.DAY), ("this_month", Budget.Period.MONTH)):
        since = dt.datetime.fromisoformat(body["period_starts"][name])
        assert since == period_bounds(period, now)[0]
        assert since.utcoffset() == dt.timedelta(0)
        assert set(body[name]) == {"runs", "tokens", "cost_usd"}  # the totals as they were
    assert set(body["by_day"][0]) == {"day", "runs", "tokens", "cost_usd"}


@pytest.mark.django_db
def test_the_records_of_a_budget_name_its_key_without_moving_it() -> None:
    # A budget's api_key names a key (its name and prefix), never the key: the record shows which key, where masking
    # by a secret-looking field name hid it as "***". (Checked by moving a budget to another key before that was
    # refused.)
    key, raw = api_key_create(name="alpha-key", actor="test", via="tests")
    budget = _key_budget(ApiCaller(key, raw))
    budget_delete(budget=budget, actor="test-admin", via="tests")
    created, deleted = (
        AuditEvent.objects.get(action=f"config.budget.{verb}").args["api_key"] for verb in ("create", "delete")
    )
    assert created == [None, str(key)] and "alpha-key" in created[1]
    assert deleted[0] == str(key)
    assert raw not in json.dumps([created, deleted])
