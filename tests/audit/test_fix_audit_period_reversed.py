"""The audit list's period that ends before it starts shows no events and says why, as an unusable date does (the
list's export refuses it too)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from audit.services import audit_event_record

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/audit/auditevent/"


def listed(client: Any, query: str) -> tuple[list[Any], list[str]]:
    """The events the list shows for ``query``, and the messages it shows with them."""
    response = client.get(f"{LIST_URL}?{query}")
    assert response.status_code == 200
    return list(response.context["cl"].result_list), [str(message) for message in get_messages(response.wsgi_request)]


@pytest.mark.parametrize(("since", "until"), [("2026-12-31", "2026-01-01"), ("2026-03-01T18:00", "2026-03-01T18:00")])
def test_a_period_that_ends_before_it_starts_shows_nothing_and_says_why(
    auditor_client: Any, since: str, until: str
) -> None:
    audit_event_record(source="agent", tool="lookup")

    events, said = listed(auditor_client, f"since={since}&until={until}")

    assert events == []
    assert said == [f"Period: {since} to {until} ends before it starts."]


def test_a_period_of_one_day_is_no_reversed_period(auditor_client: Any) -> None:
    event = audit_event_record(source="agent", tool="lookup")
    day = timezone.localdate().isoformat()  # a date is a day where the platform is (TIME_ZONE)

    events, said = listed(auditor_client, f"since={day}&until={day}")

    assert event in events and said == []
