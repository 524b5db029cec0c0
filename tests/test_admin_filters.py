"""An admin list filtered by a value the database cannot hold (a date the time zone moves before year 1, a year
too large for an integer) is shown without its filters with a message, as Django shows a filter it cannot read;
it was a server error."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

OUT_OF_RANGE = [
    "/admin/agents/apikey/?created_at__gte=0001-01-01",
    "/admin/agents/budget/?updated_at__gte=0001-01-01",
    "/admin/agents/run/?created_at__gte=0001-01-01",
    "/admin/audit/auditevent/?created_at__gte=0001-01-01",
    "/admin/audit/auditevent/?created_at__year=99999999999999999999",
]


@pytest.mark.parametrize("url", OUT_OF_RANGE)
def test_a_filter_out_of_range_shows_the_list_without_it(admin_client: Client, url: str) -> None:
    admin_client.raise_request_exception = False
    response = admin_client.get(url)
    path = url.split("?")[0]
    assert (response.status_code, response["Location"]) == (302, f"{path}?e=1")
    page = admin_client.get(response["Location"])
    assert page.status_code == 200
    assert "out of range" in page.content.decode()


def test_the_auditor_reads_the_same_in_korean(auditor_client: Client) -> None:
    auditor_client.raise_request_exception = False
    response = auditor_client.get("/admin/audit/auditevent/?created_at__gte=0001-01-01", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 302
    page = auditor_client.get(response["Location"], HTTP_ACCEPT_LANGUAGE="ko")
    assert page.status_code == 200
    assert "필터 값이 범위를 벗어나" in page.content.decode()
    # A value in range is still applied as before.
    assert auditor_client.get("/admin/audit/auditevent/?created_at__gte=2026-01-01").status_code == 200


def test_an_overflow_elsewhere_in_the_admin_is_not_taken_for_a_filter(admin_client: Client, monkeypatch) -> None:
    # Only a list's filters are answered so: on another page an OverflowError is a bug, and shows as one.
    from agents.admin import AgentAdmin

    def overflowing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OverflowError("a bug")

    monkeypatch.setattr(AgentAdmin, "get_changeform_initial_data", overflowing)
    admin_client.raise_request_exception = False
    assert admin_client.get("/admin/agents/agent/add/?x=1").status_code == 500
