"""An admin issues an API key from the admin: recorded like every change (never the key), shown once on the page
that follows the save and never again (not in the key's page, the list, a message or the record)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agents.models import Agent, ApiKey
from agents.services import api_key_create, api_key_digest
from audit.models import AuditEvent


@pytest.mark.django_db
def test_an_admin_issues_a_key_that_is_shown_once(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    response = admin_client.post(
        "/admin/agents/apikey/add/",
        {"name": "정산 시스템", "agents": [agent.pk], "rate": "60/min"},
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    [raw] = re.findall(r'id="raw-key" readonly value="(apk_[A-Za-z0-9_-]{43})"', page)
    assert "이번 한 번만" in page
    key = ApiKey.objects.get()
    assert (key.name, key.rate, key.prefix, key.digest) == ("정산 시스템", "60/min", raw[:12], api_key_digest(raw))
    assert list(key.agents.all()) == [agent]
    event = AuditEvent.objects.get(action="config.api_key.create")
    assert event.actor == "admin" and event.result["via"] == "admin"
    assert raw not in str(event.args) and raw not in str(event.result)
    for later in ("/admin/agents/apikey/", f"/admin/agents/apikey/{key.pk}/change/", "/admin/"):
        assert raw not in admin_client.get(later).content.decode()

    answered = Client().get("/api/v1/usage", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert answered.status_code == 200  # the key works


@pytest.mark.django_db
def test_a_bad_rate_is_refused_at_its_field_and_issues_nothing(admin_client: Client) -> None:
    response = admin_client.post("/admin/agents/apikey/add/", {"name": "x", "rate": "lots"})
    assert response.status_code == 200
    assert "rate" in response.context["adminform"].form.errors
    assert not ApiKey.objects.exists() and not AuditEvent.objects.filter(action="config.api_key.create").exists()


@pytest.mark.django_db
def test_a_budgets_page_offers_no_pop_up_to_issue_a_key(admin_client: Client) -> None:
    """A pop-up would close over the key it shows once: keys are issued on their own page."""
    page = admin_client.get("/admin/agents/budget/add/").content.decode()
    assert 'name="api_key"' in page and 'id="add_id_api_key"' not in page


@pytest.mark.django_db
def test_the_same_add_form_sent_again_issues_nothing_more(admin_client: Client) -> None:
    """Reloading the page that showed the key (the browser sends the form again) or going back and saving once
    more: the form's token issued a key already, so the admin is told so, with that key's page, and no second
    key is issued or recorded. A fresh add form issues a new key."""
    form = admin_client.get("/admin/agents/apikey/add/")
    [token] = re.findall(r'name="form_token" value="([A-Za-z0-9_-]+)"', form.content.decode())
    data = {"name": "야간 배치", "rate": "", "form_token": token}
    first = admin_client.post("/admin/agents/apikey/add/", data)
    [raw] = re.findall(r'id="raw-key" readonly value="(apk_[A-Za-z0-9_-]{43})"', first.content.decode())
    key = ApiKey.objects.get()

    again = admin_client.post("/admin/agents/apikey/add/", data, HTTP_ACCEPT_LANGUAGE="ko")
    page = again.content.decode()
    assert again.status_code == 200 and 'id="already-issued-key"' in page
    assert "야간 배치" in page and key.prefix in page and f"/admin/agents/apikey/{key.pk}/change/" in page
    assert "이번에는 다른 키가 발급되지 않았으며" in page  # in the reader's language
    assert raw not in page and "apk_" not in page.replace(key.prefix, "")
    assert ApiKey.objects.count() == 1
    assert AuditEvent.objects.filter(action="config.api_key.create").count() == 1

    fresh = admin_client.get("/admin/agents/apikey/add/").content.decode()
    [other_token] = re.findall(r'name="form_token" value="([A-Za-z0-9_-]+)"', fresh)
    assert other_token != token
    admin_client.post("/admin/agents/apikey/add/", {**data, "name": "두 번째", "form_token": other_token})
    assert sorted(ApiKey.objects.values_list("name", flat=True)) == ["두 번째", "야간 배치"]


@pytest.mark.django_db
@pytest.mark.parametrize("caught_by", ["model check", "database"])
def test_the_same_form_sent_twice_at_once_issues_one_key(admin_client: Client, monkeypatch, caught_by) -> None:
    """A double click: both requests find no key for the form's token, both insert; the second insert meets the
    first's token (unique: the model's check, or the database's when both checked before either inserted) and
    issues nothing: no second key, no second audit event, and the page says which key the form issued."""
    import agents.admin

    data = {"name": "동시 발급", "rate": "", "form_token": "double-click-token-0001"}
    admin_client.post("/admin/agents/apikey/add/", data)
    [key] = ApiKey.objects.all()
    monkeypatch.setattr(agents.admin, "posted_issue_token", lambda request: None)  # the check before: too early
    if caught_by == "database":
        monkeypatch.setattr(ApiKey, "validate_unique", lambda self, exclude=None: None)
    page = admin_client.post("/admin/agents/apikey/add/", data).content.decode()
    assert 'id="already-issued-key"' in page and key.prefix in page and "raw-key" not in page
    assert ApiKey.objects.count() == 1
    assert AuditEvent.objects.filter(action="config.api_key.create").count() == 1


@pytest.mark.django_db
def test_a_resent_form_is_refused_without_the_add_permission(client: Client) -> None:
    from django.contrib.auth.models import Permission, User

    issued, _raw = api_key_create(name="기존 키", actor="test", via="tests", issue_token="known-token-of-a-form")
    viewer = User.objects.create_user("viewer", password="pw-Viewer-2026", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    client.force_login(viewer)
    response = client.post("/admin/agents/apikey/add/", {"name": "x", "form_token": "known-token-of-a-form"})
    assert response.status_code == 403 and issued.prefix not in response.content.decode()


@pytest.mark.django_db
def test_the_forms_token_is_its_own_never_one_from_the_address(admin_client: Client) -> None:
    page = admin_client.get("/admin/agents/apikey/add/?form_token=chosen-by-a-link-0001").content.decode()
    [token] = re.findall(r'name="form_token" value="([A-Za-z0-9_-]+)"', page)
    assert token != "chosen-by-a-link-0001"
    # A token that is not one of ours (too short, odd characters) protects nothing and stops nothing.
    for odd in ("x", "<script>", "a" * 65):
        admin_client.post("/admin/agents/apikey/add/", {"name": f"k{len(odd)}", "rate": "", "form_token": odd})
    assert ApiKey.objects.count() == 3 and not ApiKey.objects.exclude(issue_token=None).exists()


@pytest.mark.django_db
def test_a_refused_form_sent_again_valid_issues_its_key_once(admin_client: Client) -> None:
    data = {"name": "재시도", "rate": "lots", "form_token": "retried-form-token-01"}
    assert "rate" in admin_client.post("/admin/agents/apikey/add/", data).context["adminform"].form.errors
    page = admin_client.post("/admin/agents/apikey/add/", {**data, "rate": "10/min"}).content.decode()
    [raw] = re.findall(r'id="raw-key" readonly value="(apk_[A-Za-z0-9_-]{43})"', page)
    assert ApiKey.objects.get().issue_token == "retried-form-token-01"
    assert raw not in str(dict(admin_client.session.items()))  # nothing of the key kept for later


@pytest.mark.django_db
def test_the_key_list_filters_live_and_revoked_keys_in_words(admin_client: Client) -> None:
    from django.utils import timezone

    api_key_create(name="살아 있는 키", actor="test", via="tests")
    revoked, _raw = api_key_create(name="폐기된 키", actor="test", via="tests")
    ApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    page = admin_client.get("/admin/agents/apikey/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "?state=live" in page and "?state=revoked" in page and "활성" in page and "폐기됨" in page
    live = admin_client.get("/admin/agents/apikey/?state=live").content.decode()
    assert "살아 있는 키" in live and "폐기된 키" not in live
    gone = admin_client.get("/admin/agents/apikey/?state=revoked").content.decode()
    assert "폐기된 키" in gone and "살아 있는 키" not in gone
