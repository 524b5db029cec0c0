"""The date drill-down of the runs' and the audit events' lists at the last year a date can have: Django bounds a
year by the next one, which 9999 has not, and ``?created_at__year=9999`` was a server error. It is a filter out of
range, answered as one (tests/test_admin_filters.py): the list without its filters, and a message saying why."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

LISTS = ["/admin/agents/run/", "/admin/audit/auditevent/"]
PAST_THE_LAST_DAY = [
    "created_at__year=9999",
    "created_at__year=9999&created_at__month=12",
    "created_at__year=9999&created_at__month=12&created_at__day=31",
]


def answered_out_of_range(client: Client, url: str) -> None:
    client.raise_request_exception = False
    response = client.get(url)
    path = url.split("?")[0]
    assert (response.status_code, response.get("Location")) == (302, f"{path}?e=1")
    page = client.get(response["Location"])
    assert page.status_code == 200
    assert "out of range" in page.content.decode()


@pytest.mark.parametrize("query", PAST_THE_LAST_DAY)
@pytest.mark.parametrize("path", LISTS)
def test_a_drill_down_past_the_last_day_shows_the_list_without_it(admin_client: Client, path: str, query: str) -> None:
    answered_out_of_range(admin_client, f"{path}?{query}")


@pytest.mark.parametrize(
    "query",
    ["created_at__year=9999", "since=2026-01-01&created_at__year=9999", "until=9999-12-31&created_at__year=9999"],
)
def test_the_auditor_is_answered_the_same(auditor_client: Client, query: str) -> None:
    answered_out_of_range(auditor_client, f"/admin/audit/auditevent/?{query}")


@pytest.mark.parametrize("path", LISTS)
def test_a_month_of_the_last_year_that_has_a_next_one_is_still_shown(admin_client: Client, path: str) -> None:
    response = admin_client.get(f"{path}?created_at__year=9999&created_at__month=11")
    assert response.status_code == 200
