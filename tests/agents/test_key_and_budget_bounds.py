"""Defects of the API key and budget admin (forms2): an admin key issued or made by a staff user who may not
manage evals themselves (1); a reservation, an arm's weight or a category's order beyond what a 32-bit column
holds (4: PostgreSQL's, and the cost counters' 64 bits); a limit refused at its field also told as missing (5)."""

from __future__ import annotations

import io
import unicodedata
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from agents.admin import ADMIN_KEY_PERMISSIONS, ApiKeyAdmin
from agents.budgets import budget_create
from agents.models import AgentArm, ApiKey, Budget, Run
from agents.services import api_key_create
from tests.agents.test_budgets import price_house_model, scripted_agent, submit
from tests.conftest import logged_in


def staff_with(*perms: str) -> Any:
    user = get_user_model().objects.create_user("keeper", "", "pw-keeper-123", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return get_user_model().objects.get(pk=user.pk)  # a fresh one: permissions are cached per instance


KEY_PERMS = ("agents.add_apikey", "agents.change_apikey", "agents.view_apikey")


@pytest.mark.django_db
def test_a_staff_user_who_may_not_manage_evals_cannot_issue_an_admin_key() -> None:
    client = logged_in(staff_with(*KEY_PERMS))
    form = client.get("/admin/agents/apikey/add/").context["adminform"].form
    assert form.fields["admin"].disabled
    page = client.post("/admin/agents/apikey/add/", {"name": "eval bot", "rate": "", "admin": "on"})
    assert page.status_code == 200
    assert "Only a superuser" in str(page.context["adminform"].form.errors["admin"])
    assert not ApiKey.objects.exists()
    # Without the tick, a caller's key is issued as before.
    assert client.post("/admin/agents/apikey/add/", {"name": "caller", "rate": ""}).status_code == 200
    assert ApiKey.objects.get().admin is False


@pytest.mark.django_db
def test_a_staff_user_who_may_not_manage_evals_cannot_make_a_key_an_admin_key() -> None:
    key, _raw = api_key_create(name="caller", actor="test", via="tests")
    client = logged_in(staff_with(*KEY_PERMS))
    page = client.post(f"/admin/agents/apikey/{key.pk}/change/", {"name": "caller", "rate": "", "admin": "on"})
    assert page.status_code == 200 and "admin" in page.context["adminform"].form.errors
    assert ApiKey.objects.get().admin is False
    # An admin key keeps being one when such a user renames it (the browser sends no disabled checkbox).
    admin_key, _raw = api_key_create(name="evals", actor="test", via="tests", admin=True)
    renamed = client.post(f"/admin/agents/apikey/{admin_key.pk}/change/", {"name": "evals 2", "rate": ""})
    assert renamed.status_code == 302
    assert ApiKey.objects.get(pk=admin_key.pk).admin is True


@pytest.mark.django_db
def test_the_admins_save_refuses_an_admin_key_to_such_a_user_whatever_the_form() -> None:
    user = staff_with(*KEY_PERMS)
    request = RequestFactory().post("/admin/agents/apikey/add/")
    request.user = user
    model_admin = ApiKeyAdmin(ApiKey, admin.site)
    key = ApiKey(name="forged", admin=True)

    class Form:
        cleaned_data: dict[str, Any] = {"agents": [], "form_token": None}
        fields: dict[str, Any] = {}

    with pytest.raises(PermissionDenied, match="Only a superuser"):
        model_admin.save_model(request, key, Form(), change=False)
    assert not ApiKey.objects.exists()
    caller, _raw = api_key_create(name="caller", actor="test", via="tests")
    caller.admin = True
    with pytest.raises(PermissionDenied, match="Only a superuser"):
        model_admin.save_model(request, caller, Form(), change=True)
    assert ApiKey.objects.get(pk=caller.pk).admin is False


@pytest.mark.django_db
def test_a_superuser_or_a_user_who_manages_evals_issues_an_admin_key(admin_client: Client) -> None:
    assert admin_client.post("/admin/agents/apikey/add/", {"name": "su", "rate": "", "admin": "on"}).status_code == 200
    assert ApiKey.objects.get(name="su").admin is True
    client = logged_in(staff_with(*KEY_PERMS, *ADMIN_KEY_PERMISSIONS))
    assert not client.get("/admin/agents/apikey/add/").context["adminform"].form.fields["admin"].disabled
    assert client.post("/admin/agents/apikey/add/", {"name": "ev", "rate": "", "admin": "on"}).status_code == 200
    assert ApiKey.objects.get(name="ev").admin is True


@pytest.mark.django_db
def test_a_reservation_beyond_32_bits_is_refused_at_its_field(admin_client: Client, api_caller: Any) -> None:
    form = {"api_key": api_caller.key.pk, "period": "day", "max_tokens": "", "max_cost": "5", "enabled": "on"}
    page = admin_client.post("/admin/agents/budget/add/", {**form, "run_reservation_tokens": str(9 * 10**18)})
    assert page.status_code == 200 and "run_reservation_tokens" in page.context["adminform"].form.errors
    ok = admin_client.post("/admin/agents/budget/add/", {**form, "run_reservation_tokens": str(2**31 - 1)})
    assert ok.status_code == 302 and Budget.objects.get().run_reservation_tokens == 2**31 - 1


@pytest.mark.django_db
def test_a_stored_reservation_too_large_to_count_refuses_the_run_with_a_4xx(
    api_client: APIClient, api_caller: Any
) -> None:
    price_house_model()
    scripted_agent()
    budget = budget_create(
        actor="test", via="tests", data={"api_key": api_caller.key, "period": "day", "max_tokens": 10**19 // 2}
    )
    Budget.objects.filter(pk=budget.pk).update(run_reservation_tokens=9 * 10**18)  # stored before the bound
    refused: Any = submit(api_client)
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "budget_misconfigured"
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_an_arms_weight_beyond_32_bits_is_refused() -> None:
    from django.core.exceptions import ValidationError

    field = AgentArm._meta.get_field("weight")
    with pytest.raises(ValidationError):
        field.run_validators(2**31)
    field.run_validators(2**31 - 1)


@pytest.mark.django_db
def test_a_limit_refused_at_its_field_is_not_also_told_missing(admin_client: Client, api_caller: Any) -> None:
    form = {"api_key": api_caller.key.pk, "period": "day", "run_reservation_tokens": "5", "enabled": "on"}
    page = admin_client.post("/admin/agents/budget/add/", {**form, "max_tokens": "-5"})
    errors = page.context["adminform"].form.errors
    assert "max_tokens" in errors
    assert "Give a token limit, a cost limit, or both." not in page.content.decode()
    page = admin_client.post("/admin/agents/budget/add/", {**form, "max_cost": "lots"})
    assert "max_cost" in page.context["adminform"].form.errors
    assert "Give a token limit, a cost limit, or both." not in page.content.decode()
    none = admin_client.post("/admin/agents/budget/add/", form)
    assert "Give a token limit, a cost limit, or both." in none.content.decode()
    assert not Budget.objects.exists()


@pytest.mark.django_db
def test_a_key_name_with_a_control_character_is_refused_at_its_field(admin_client: Client) -> None:
    """The form refused NUL only; a tab or \\x01 was stored, which no one can type to find the key again."""
    for name in ("탭\t이름", "bell\x01"):
        page = admin_client.post("/admin/agents/apikey/add/", {"name": name, "rate": ""})
        assert page.status_code == 200 and "name" in page.context["adminform"].form.errors
    assert not ApiKey.objects.filter(name__in=["탭\t이름", "bell\x01"]).exists()


@pytest.mark.django_db
def test_a_new_key_name_is_stored_composed_so_either_keyboard_finds_it(admin_client: Client) -> None:
    """A name typed as jamo (NFD, as macOS sends 김) was stored as typed: revoke_api_key and the list's search,
    given the syllables, never found it."""
    decomposed = unicodedata.normalize("NFD", "운영팀 키")
    admin_client.post("/admin/agents/apikey/add/", {"name": decomposed, "rate": ""})
    assert ApiKey.objects.get().name == "운영팀 키"
    call_command("create_api_key", unicodedata.normalize("NFD", "배치 키"), stdout=io.StringIO())
    assert ApiKey.objects.filter(name="배치 키").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("form", ["NFC", "NFD"])
def test_revoke_api_key_finds_a_name_stored_as_typed_whichever_way_it_is_given(form: str) -> None:
    stored, _raw = api_key_create(name=unicodedata.normalize("NFD", "옛 키"), actor="system:test", via="test")
    call_command("revoke_api_key", unicodedata.normalize(form, "옛 키"), stdout=io.StringIO())
    stored.refresh_from_db()
    assert stored.revoked_at is not None
