"""The admin's History button reads the audit record (defect: Django's page read its own log, which the platform
does not write, and told of every object, a key renamed a minute before included, that it had no history,
"probably not added via this admin site"); a record's page says it is never changed. Delete and group pages name
permissions in the reader's language, and no model is listed by its class name."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client

from agents.models import Run
from agents.services import api_key_create
from audit.models import AuditEvent
from audit.roles import group_save
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def text(page: bytes) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.decode()))


def test_an_objects_history_lists_its_changes_from_the_audit_record(admin_client: Client) -> None:
    key, _raw = api_key_create(name="배치 키", actor="system:test", via="tests")
    response = admin_client.post(f"/admin/agents/apikey/{key.pk}/change/", {"name": "야간 배치 키", "rate": ""})
    assert response.status_code == 302

    page = admin_client.get(f"/admin/agents/apikey/{key.pk}/history/", HTTP_ACCEPT_LANGUAGE="ko")
    assert page.status_code == 200
    shown = text(page.content)
    assert "아마도" not in shown and "probably" not in shown
    update = AuditEvent.objects.get(action="config.api_key.update")
    create = AuditEvent.objects.get(action="config.api_key.create")
    assert f'href="/admin/audit/auditevent/{update.pk}/change/"' in page.content.decode()
    assert f"#{update.seq}" in shown and f"#{create.seq}" in shown
    assert shown.index(f"#{update.seq}") < shown.index(f"#{create.seq}")  # newest first
    assert "admin" in shown and "이름" in shown  # the field, by its label


def test_another_objects_changes_are_not_in_its_history(admin_client: Client) -> None:
    first, _ = api_key_create(name="하나", actor="system:test", via="tests")
    api_key_create(name="둘", actor="system:test", via="tests")
    page = admin_client.get(f"/admin/agents/apikey/{first.pk}/history/")
    assert len(re.findall(r'href="/admin/audit/auditevent/\d+/change/"', page.content.decode())) == 1


def test_a_records_history_says_it_is_never_changed(auditor_client: Client, demo_server) -> None:
    run = Run.objects.create(agent=make_agent(slug="hist", servers=[demo_server]), query="안녕")
    page = auditor_client.get(f"/admin/agents/run/{run.pk}/history/", HTTP_ACCEPT_LANGUAGE="en")
    assert page.status_code == 200
    assert "it is never changed once written" in text(page.content)
    assert "probably" not in text(page.content)


def test_a_history_page_is_refused_to_who_may_not_view_the_object(outsider_client: Client) -> None:
    key, _ = api_key_create(name="비밀 아님", actor="system:test", via="tests")
    assert outsider_client.get(f"/admin/agents/apikey/{key.pk}/history/").status_code == 403


def test_a_groups_delete_page_names_its_permissions_in_the_readers_language(admin_client: Client) -> None:
    view_run = Permission.objects.get(codename="view_run")
    group = group_save(group=Group(name="검토자"), actor="system:test", via="tests", permissions=[view_run])
    page = admin_client.get(f"/admin/auth/group/{group.pk}/delete/", HTTP_ACCEPT_LANGUAGE="ko")
    assert page.status_code == 200
    assert "Can view run" not in text(page.content)
    assert Group.objects.filter(pk=group.pk).exists()


def test_the_group_page_names_every_model_in_korean(admin_client: Client) -> None:
    page = admin_client.get("/admin/auth/group/add/", HTTP_ACCEPT_LANGUAGE="ko")
    shown = page.content.decode()
    for english in ("budget reservation", "budget usage", "config generation"):
        assert english not in shown, english
