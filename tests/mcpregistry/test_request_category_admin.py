"""The classify_request table in the admin: keywords written comma-separated as in the rule editor (a JSON list is
read too), listed as words, each change through the service (audited)."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEvent
from mcpregistry.models import RequestCategory

pytestmark = pytest.mark.django_db


def test_keywords_are_written_and_shown_as_words(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/mcpregistry/requestcategory/add/",
        {"department": "IT지원팀", "keywords": "프린터, 노트북,, 모니터, 프린터", "order": "10", "enabled": "on"},
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    category = RequestCategory.objects.get(department="IT지원팀")
    assert category.keywords == ["프린터", "노트북", "모니터"]  # blanks and repeats dropped
    event = AuditEvent.objects.get(action="config.request_category.create")
    assert event.args["keywords"] == [None, ["프린터", "노트북", "모니터"]]

    page = admin_client.get(f"/admin/mcpregistry/requestcategory/{category.pk}/change/").content.decode()
    assert 'value="프린터, 노트북, 모니터"' in page
    assert "프린터, 노트북, 모니터" in admin_client.get("/admin/mcpregistry/requestcategory/").content.decode()

    data = {"department": "IT지원팀", "keywords": '["키보드", "마우스"]', "order": "10", "enabled": "on"}
    assert admin_client.post(f"/admin/mcpregistry/requestcategory/{category.pk}/change/", data).status_code == 302
    category.refresh_from_db()
    assert category.keywords == ["키보드", "마우스"]


@pytest.mark.parametrize("keywords", [" , ", '["키보드", 3]', "[broken"])
def test_keywords_that_say_nothing_are_refused_at_their_field(admin_client: Client, keywords: str) -> None:
    response = admin_client.post(
        "/admin/mcpregistry/requestcategory/add/", {"department": "총무팀", "keywords": keywords, "order": "1"}
    )
    assert response.status_code == 200
    assert "keywords" in response.context["adminform"].form.errors
    assert not RequestCategory.objects.filter(department="총무팀").exists()


@pytest.mark.parametrize("keywords", [["서울,부산", "x"], ["[긴급]", "y"]])
def test_keywords_that_commas_cannot_carry_are_shown_as_json_and_survive_a_save(
    admin_client: Client, keywords: list[str]
) -> None:
    category = RequestCategory.objects.create(department="총무팀", keywords=keywords, order=5)
    form = admin_client.get(f"/admin/mcpregistry/requestcategory/{category.pk}/change/").context["adminform"].form
    shown = form["keywords"].value()
    data = {"department": "총무팀", "keywords": shown, "order": "5", "enabled": "on"}
    response = admin_client.post(f"/admin/mcpregistry/requestcategory/{category.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    category.refresh_from_db()
    assert category.keywords == keywords
    assert not AuditEvent.objects.filter(action="config.request_category.update").exists()  # nothing changed
