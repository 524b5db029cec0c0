"""Access defects found in review s42: read-only pages, ``create_api_key --replace``, deleting a key that has runs,
and record lists that answered a write POST with 200."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import NoReverseMatch, reverse

from agent_platform.errors import ApplicationError
from agents.budgets import budget_create
from agents.models import Agent, AgentVersion, ApiKey, Run
from agents.services import agent_version_publish, api_key_create, api_key_delete, api_key_revoke, api_key_update
from audit.models import AuditEvent
from tests.agents.test_admin_runs import a_run, an_approval
from tests.conftest import ApiCaller, logged_in, make_agent
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db


# ---- 1. view permission only: every admin page opens --------------------------------------------------------


def _view_only_pages() -> list[tuple[str, str, str, Any]]:
    """(model label, view permission, page name, object pk) for every registered admin's change page (of its first
    row) and add page."""
    pages = []
    for model in admin.site._registry:
        opts = model._meta
        perm = f"{opts.app_label}.view_{opts.model_name}"
        row = model._default_manager.order_by("pk").values_list("pk", flat=True).first()
        if row is not None:
            pages.append((opts.label_lower, perm, f"admin:{opts.app_label}_{opts.model_name}_change", row))
        pages.append((opts.label_lower, perm, f"admin:{opts.app_label}_{opts.model_name}_add", None))
    return pages


def test_every_admin_page_opens_for_a_user_who_may_only_view_it(demo_agent: Agent, api_caller: ApiCaller) -> None:
    key = api_caller.key
    budget_create(actor="t", via="tests", data={"api_key": key, "period": "day", "max_tokens": 100000})
    agent_version_publish(agent=demo_agent, actor="t", via="tests", note="첫 버전")
    an_approval(a_run(api_key=key))
    pages = _view_only_pages()
    covered = {label for label, _perm, _name, pk in pages if pk is not None}
    for label in (
        "agents.agent",
        "agents.deterministicrule",
        "agents.apikey",
        "agents.budget",
        "agents.agentversion",
        "agents.run",
        "agents.approval",
        "mcpregistry.mcpserver",
        "mcpregistry.mcptool",  # its contract is an inline of its page
    ):
        assert label in covered, label
    answers = {}
    for number, (label, perm, name, pk) in enumerate(pages):
        try:
            url = reverse(name, args=[pk] if pk is not None else [])
        except NoReverseMatch:
            continue  # an admin without that page
        client: Client = logged_in(staff(f"viewer{number}", perms=(perm,)))
        client.raise_request_exception = False
        answers[(label, url)] = client.get(url).status_code
    broken = {page: status for page, status in answers.items() if status not in (200, 302, 403)}
    assert broken == {}
    assert answers[("agents.agent", f"/admin/agents/agent/{demo_agent.pk}/change/")] == 200
    rule = demo_agent.rules.order_by("pk").first()
    assert rule is not None
    assert answers[("agents.deterministicrule", f"/admin/agents/deterministicrule/{rule.pk}/change/")] == 200


# ---- 2. create_api_key --replace keeps the replaced key's scope -----------------------------------------------


def _issued(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue()


def test_a_replaced_key_keeps_its_agents_rate_and_budgets(demo_agent: Agent, demo_server: Any) -> None:
    make_agent(slug="hr-secret", servers=[demo_server], with_demo_rules=False)
    _issued("partner", "--agents", "company-assistant")
    old = ApiKey.objects.get()
    api_key_update(api_key=old, actor="t", via="tests", data={"rate": "5/min"})
    budget_create(actor="t", via="tests", data={"api_key": old, "period": "day", "max_tokens": 100000})
    raw, said = _issued("partner", "--replace")
    new = ApiKey.objects.get(revoked_at__isnull=True)
    assert new.pk != old.pk and raw.startswith(new.prefix)
    assert list(new.agents.values_list("slug", flat=True)) == ["company-assistant"]
    assert new.rate == "5/min" and new.admin is False
    assert list(new.budgets.values_list("period", "max_tokens", "enabled")) == [("day", 100000, True)]
    assert "company-assistant" in said and "5/min" in said
    # Moved with its counters (its spend keeps limiting the caller), audited as the budget's change.
    assert not old.budgets.exists()
    moved = AuditEvent.objects.filter(action="config.budget.update").order_by("-id").first()
    assert moved is not None and set(moved.args) == {"api_key"}
    refused = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/api/v1/runs", {"agent": "hr-secret", "query": "급여 알려줘"}, content_type="application/json"
    )
    assert refused.status_code in (403, 404)
    assert Run.objects.filter(agent__slug="hr-secret").count() == 0


def test_what_the_command_line_gives_wins_over_the_replaced_key(demo_agent: Agent, demo_server: Any) -> None:
    make_agent(slug="hr-secret", servers=[demo_server], with_demo_rules=False)
    _issued("partner", "--agents", "company-assistant")
    _issued("partner", "--replace", "--agents", "hr-secret")
    new = ApiKey.objects.get(revoked_at__isnull=True)
    assert list(new.agents.values_list("slug", flat=True)) == ["hr-secret"]


def test_replacing_keys_of_one_name_with_different_scopes_is_refused(demo_agent: Agent, demo_server: Any) -> None:
    make_agent(slug="hr-secret", servers=[demo_server], with_demo_rules=False)
    _issued("partner", "--agents", "company-assistant")
    _issued("partner", "--agents", "hr-secret")
    with pytest.raises(CommandError, match="hr-secret"):
        _issued("partner", "--replace")
    assert ApiKey.objects.filter(revoked_at__isnull=True).count() == 2
    # Named on the command line, nothing is left to carry over: the replace goes on.
    _issued("partner", "--replace", "--agents", "company-assistant")
    assert ApiKey.objects.filter(revoked_at__isnull=True).count() == 1


def test_a_replace_without_earlier_keys_issues_a_key_for_what_it_names(demo_agent: Agent) -> None:
    _, said = _issued("fresh", "--replace")
    new = ApiKey.objects.get()
    assert new.agents.count() == 0 and new.rate == "" and "carried" not in said.lower()


# ---- 3. a key with runs is not deleted ------------------------------------------------------------------------


def test_a_key_with_runs_is_not_deleted_by_the_service_or_the_admin() -> None:
    key, _raw = api_key_create(actor="t", via="tests", name="파트너")
    run = a_run(api_key=key)
    with pytest.raises(ApplicationError, match="Revoke"):
        api_key_delete(api_key=key, actor="t", via="tests")
    root = logged_in(staff("root", superuser=True))
    root.raise_request_exception = False
    page = root.get(f"/admin/agents/apikey/{key.pk}/delete/")
    assert page.status_code == 200 and "Revoke" in page.content.decode()
    posted = root.post(f"/admin/agents/apikey/{key.pk}/delete/", {"post": "yes"})
    assert posted.status_code == 200 and "Revoke" in posted.content.decode()
    action = root.post(
        "/admin/agents/apikey/", {"action": "delete_selected", "_selected_action": [str(key.pk)], "post": "yes"}
    )
    assert action.status_code == 200 and "Revoke" in action.content.decode()
    assert ApiKey.objects.filter(pk=key.pk).exists()
    run.refresh_from_db()
    assert run.api_key_id == key.pk
    assert not AuditEvent.objects.filter(action="config.api_key.delete").exists()
    # A revoked key keeps its runs too; a key with none is deleted.
    api_key_revoke(api_key=key, actor="t", via="tests")
    with pytest.raises(ApplicationError):
        api_key_delete(api_key=key, actor="t", via="tests")
    spare, _raw = api_key_create(actor="t", via="tests", name="spare")
    assert root.post(f"/admin/agents/apikey/{spare.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not ApiKey.objects.filter(pk=spare.pk).exists()


# ---- 4. record lists refuse a write POST ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("perms", "groups", "url", "action"),
    [
        ((), ("auditor",), "/admin/audit/auditcheckpoint/", "delete_selected"),
        (("agents.view_agentversion",), (), "/admin/agents/agentversion/", "rollback"),
        (("agents.view_shadowcomparison",), (), "/admin/agents/shadowcomparison/", "delete_selected"),
    ],
)
def test_a_record_list_answers_a_write_post_without_the_permission_with_403(
    perms: tuple[str, ...], groups: tuple[str, ...], url: str, action: str
) -> None:
    client = logged_in(staff("vic", perms=perms, groups=groups))
    assert client.get(url).status_code == 200
    assert client.post(url, {"action": action, "_selected_action": ["1"], "index": "0"}).status_code == 403


def test_a_roll_back_by_someone_who_may_change_the_agent_still_runs(demo_agent: Agent) -> None:
    first = agent_version_publish(agent=demo_agent, actor="t", via="tests", note="v1")
    Agent.objects.filter(pk=demo_agent.pk).update(system_prompt="두 번째 프롬프트")
    demo_agent.refresh_from_db()
    agent_version_publish(agent=demo_agent, actor="t", via="tests", note="v2")
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 2
    editor = logged_in(staff("eddie", perms=("agents.view_agentversion", "agents.change_agent")))
    posted = editor.post(
        "/admin/agents/agentversion/", {"action": "rollback", "_selected_action": [str(first.pk)], "index": "0"}
    )
    assert posted.status_code == 302
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 3


def test_a_rotated_key_keeps_its_budgets_spend_so_far() -> None:
    """Copied to the new key, the budget's counters started empty: each rotation (bin/up replaces its key at every
    start) gave the caller a fresh day (6,104 tokens spent against a day's 5,000)."""
    from rest_framework.test import APIClient

    from tests.agents.test_budgets import finish, scripted_agent, submit

    scripted_agent(turns=2, output_tokens=1500)
    raw, _said = _issued("partner")
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": ApiKey.objects.get(), "period": "day", "max_tokens": 5000, "run_reservation_tokens": 2000},
    )
    old_client = APIClient()
    old_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    admitted = 0
    while (response := submit(old_client)).status_code == 202:
        finish(response.json()["id"])
        admitted += 1
        assert admitted < 10
    new_raw, _said = _issued("partner", "--replace")
    new_client = APIClient()
    new_client.credentials(HTTP_AUTHORIZATION=f"Bearer {new_raw}")
    refused = submit(new_client)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
