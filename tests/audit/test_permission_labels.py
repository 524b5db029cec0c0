"""The group and user pages list permissions in the reader's language (``에이전트 | 승인 | 승인 보기``); Django
stores their names once, in English (``Can view approval``). Choosing them works as before."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

from audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def options(page: str, name: str) -> dict[str, str]:
    """The ``<select name=...>``'s options, value → visible label."""
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', page, re.S)
    assert select is not None, name
    return {
        v: html.unescape(t).strip()
        for v, t in re.findall(r'<option value="(\d+)"[^>]*>(.*?)</option>', select.group(1))
    }


def test_a_groups_permissions_are_listed_in_korean_and_chosen_as_before(admin_client: Client) -> None:
    group = Group.objects.create(name="검토자")
    view_approval = Permission.objects.get(codename="view_approval")
    add_agent = Permission.objects.get(codename="add_agent")

    korean = options(
        admin_client.get(f"/admin/auth/group/{group.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode(),
        "permissions",
    )
    english = options(
        admin_client.get(f"/admin/auth/group/{group.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode(),
        "permissions",
    )

    assert korean[str(view_approval.pk)] == "에이전트 | 승인 | 승인 보기"
    assert korean[str(add_agent.pk)] == "에이전트 | 에이전트 | 에이전트 추가"
    assert not [label for label in korean.values() if "Can " in label]  # every permission on the page
    assert english[str(view_approval.pk)] == "Agents | approval | Can view approval"
    assert len(korean) == len(english) == Permission.objects.count()

    response = admin_client.post(
        f"/admin/auth/group/{group.pk}/change/", {"name": "검토자", "permissions": [view_approval.pk]}
    )
    assert response.status_code == 302
    assert list(group.permissions.all()) == [view_approval]
    event = AuditEvent.objects.filter(action="config.group.update").latest("id")
    assert event.args == {"permissions": [[], ["agents.view_approval"]]}  # the record: a name in no language


def test_a_users_permissions_are_listed_in_korean(admin_client: Client) -> None:
    user = get_user_model().objects.create_user("reader", password=None)
    page = admin_client.get(f"/admin/auth/user/{user.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    labels = options(page, "user_permissions")
    delete_run = Permission.objects.get(codename="delete_run")
    assert labels[str(delete_run.pk)] == "에이전트 | 실행 | 실행 삭제"
    assert not [label for label in labels.values() if "Can " in label]


def test_the_record_names_permissions_the_same_whatever_language_the_page_was_in(admin_client: Client) -> None:
    """Django writes a permission's name in the active language ("에이전트 | 승인 | Can view approval" from a Korean
    page): the record names it by app_label.codename, and the event's page names it in the reader's words."""
    group = Group.objects.create(name="검토자")
    view_approval = Permission.objects.get(codename="view_approval")
    for language, permissions in (("ko", [view_approval.pk]), ("en", [])):
        data = {"name": "검토자", "permissions": permissions}
        response = admin_client.post(f"/admin/auth/group/{group.pk}/change/", data, HTTP_ACCEPT_LANGUAGE=language)
        assert response.status_code == 302
    granted, taken = AuditEvent.objects.filter(action="config.group.update").order_by("id")
    assert granted.args == {"permissions": [[], ["agents.view_approval"]]}
    assert taken.args == {"permissions": [["agents.view_approval"], []]}
    page = admin_client.get(f"/admin/audit/auditevent/{granted.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "에이전트 | 승인 | 승인 보기" in page and "agents.view_approval" in page
