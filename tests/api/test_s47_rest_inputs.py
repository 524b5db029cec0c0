"""Inputs of the REST API that were taken as other inputs: an ``Idempotency-Key`` whose ends held a character
Python counts as a space (a no-break space, a NEL) was that character less, so two keys a client sent made one run."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.models import Run
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
BODY = {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}


@pytest.fixture
def bearer(api_caller: ApiCaller) -> Client:
    make_agent(slug="company-assistant", servers=[], with_demo_rules=False)
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}", raise_request_exception=False)


@pytest.mark.parametrize("key", ["\xa0k1", "k1\x85"])
def test_an_idempotency_key_with_a_non_ascii_space_at_an_end_is_refused_not_taken_as_another_key(
    bearer: Client, key: str
) -> None:
    first = bearer.post(RUNS, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 202, first.content

    response = bearer.post(RUNS, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)

    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"Idempotency-Key": ["Invalid value."]}
    assert "Idempotent-Replayed" not in response
    assert Run.objects.count() == 1


def test_the_spaces_and_tabs_http_allows_around_a_key_are_still_not_part_of_it(bearer: Client) -> None:
    first = bearer.post(RUNS, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1")
    again = bearer.post(RUNS, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=" \tk1\t ")

    assert (first.status_code, again.status_code) == (202, 200), again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
