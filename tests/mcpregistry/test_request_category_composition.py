"""Defects of the classify_request table (forms2): a department or keyword typed decomposed (NFD, Korean from macOS)
was stored as typed, so the keyword never matched a request (stored composed) and a department could be stored
twice (3); an order beyond a 32-bit column was accepted on SQLite (4)."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from mcpregistry.builtin_tools import classify_request
from mcpregistry.models import RequestCategory
from mcpregistry.services import request_category_create, request_category_update

pytestmark = pytest.mark.django_db


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def classify(request: str) -> Any:
    return classify_request.invoke({"request": request})


def test_a_category_is_stored_composed_whatever_path_writes_it(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/mcpregistry/requestcategory/add/",
        {
            "department": nfd("IT지원팀"),
            "keywords": f"{nfd('프린터')}, 프린터, {nfd('노트북')}",
            "order": "10",
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    category = RequestCategory.objects.get()
    assert (category.department, category.keywords) == ("IT지원팀", ["프린터", "노트북"])  # one word, not two
    request_category_update(category=category, actor="test", via="tests", data={"keywords": [nfd("모니터")]})
    assert RequestCategory.objects.get().keywords == ["모니터"]
    assert classify(nfd("모니터가 안 켜져요"))["department"] == "IT지원팀"


def test_a_department_typed_decomposed_is_the_same_department(admin_client: Client) -> None:
    request_category_create(actor="test", via="tests", data={"department": "총무팀", "keywords": ["택배"]})
    page = admin_client.post(
        "/admin/mcpregistry/requestcategory/add/", {"department": nfd("총무팀"), "keywords": "우편", "order": "1"}
    )
    assert page.status_code == 200 and "department" in page.context["adminform"].form.errors
    with pytest.raises(ValidationError):
        request_category_create(actor="test", via="tests", data={"department": nfd("총무팀"), "keywords": ["우편"]})
    assert RequestCategory.objects.count() == 1


def test_a_keyword_stored_decomposed_before_still_matches() -> None:
    RequestCategory.objects.create(department=nfd("인사팀"), keywords=[nfd("휴가")], order=1)
    answer = classify("휴가 신청은 어디서 하나요?")
    assert answer == {"department": "인사팀", "matched": ["휴가"]}


def test_an_order_beyond_32_bits_is_refused_at_its_field(admin_client: Client) -> None:
    data = {"department": "총무팀", "keywords": "택배", "order": str(2**31)}
    page = admin_client.post("/admin/mcpregistry/requestcategory/add/", data)
    assert page.status_code == 200 and "order" in page.context["adminform"].form.errors
    assert not RequestCategory.objects.exists()
    ok = admin_client.post("/admin/mcpregistry/requestcategory/add/", {**data, "order": str(2**31 - 1)})
    assert ok.status_code == 302
