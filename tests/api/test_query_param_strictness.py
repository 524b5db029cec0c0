"""Every ``/api/v1/`` runs endpoint refuses a query parameter it does not take (``400 invalid_input``, each named
in ``fields``, the ones it takes named in the message) instead of ignoring it: ``POST /runs?wiat=30`` answered at
once, without the wait. A query with more parameters than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` is a
``400 too_many_fields`` that says so and gives the limit."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from agents.models import Approval, Run
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"
BODY = json.dumps({"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"})


@pytest.fixture
def bearer(api_caller: ApiCaller) -> Client:
    make_agent(slug="company-assistant", servers=[], with_demo_rules=False)
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")


@pytest.fixture
def parked(api_caller: ApiCaller, bearer: Client) -> tuple[Run, Approval]:
    """A run of the caller's waiting for a decision on one write call."""
    run = Run.objects.create(
        agent=make_agent(slug="notes-assistant", servers=[], with_demo_rules=False),
        api_key=api_caller.key,
        query="q",
        status=Run.Status.AWAITING_APPROVAL,
    )
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="h" * 64,
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    return run, approval


def post_json(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


# Each endpoint, the query parameters it takes, and how to call it with a query string.
Call = Callable[[Client, Run, Approval, str], Any]
ENDPOINTS: dict[str, tuple[tuple[str, ...], Call]] = {
    "POST /runs": (("wait",), lambda c, run, ap, q: c.post(f"{URL}?{q}", BODY, content_type="application/json")),
    "GET /runs": (("agent", "status", "page_size", "cursor"), lambda c, run, ap, q: c.get(f"{URL}?{q}")),
    "GET /runs/{id}": ((), lambda c, run, ap, q: c.get(f"{URL}/{run.id}?{q}")),
    "POST /runs/{id}/cancel": ((), lambda c, run, ap, q: c.post(f"{URL}/{run.id}/cancel?{q}")),
    "GET /runs/{id}/events": (("after",), lambda c, run, ap, q: c.get(f"{URL}/{run.id}/events?{q}")),
    "POST /runs/{id}/feedback": ((), lambda c, run, ap, q: post_json(c, f"{URL}/{run.id}/feedback?{q}", {"score": 1})),
    "POST /runs/{id}/approvals/{approval_id}": (
        (),
        lambda c, run, ap, q: post_json(c, f"{URL}/{run.id}/approvals/{ap.id}?{q}", {"decision": "reject"}),
    ),
    "GET /usage": ((), lambda c, run, ap, q: c.get(f"/api/v1/usage?{q}")),
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_an_unknown_query_parameter_is_refused_naming_it_and_the_ones_the_endpoint_takes(
    bearer: Client, parked: tuple[Run, Approval], endpoint: str
) -> None:
    accepted, call = ENDPOINTS[endpoint]
    response = call(bearer, *parked, "wiat=30")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["fields"] == {"wiat": ["Unknown query parameter."]}
    assert error["message"].startswith("Unknown query parameter: 'wiat'.")
    if accepted:
        assert error["message"].endswith("This endpoint takes: " + ", ".join(f"'{name}'" for name in accepted) + ".")
    else:
        assert error["message"].endswith("This endpoint takes no query parameters.")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_refused_query_parameter_leaves_everything_as_it_was(
    bearer: Client, parked: tuple[Run, Approval], endpoint: str
) -> None:
    run, approval = parked
    ENDPOINTS[endpoint][1](bearer, run, approval, "foo=1")
    assert list(Run.objects.values_list("id", flat=True)) == [run.id]  # POST /runs created nothing
    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL and run.feedback_score is None
    assert approval.status == Approval.Status.PENDING


def test_a_misspelt_wait_is_refused_rather_than_answered_at_once(bearer: Client) -> None:
    response = bearer.post(f"{URL}?wiat=30", BODY, content_type="application/json")
    assert response.status_code == 400
    assert "'wait'" in response.json()["error"]["message"]
    assert not Run.objects.exists()


def test_wait_on_a_run_s_page_is_refused_it_waits_only_when_submitting(
    bearer: Client, parked: tuple[Run, Approval]
) -> None:
    response = bearer.get(f"{URL}/{parked[0].id}?wait=5")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"wait": ["Unknown query parameter."]}


def test_every_unknown_parameter_is_named_at_once_and_a_blank_one_counts(bearer: Client) -> None:
    response = bearer.get("/api/v1/usage?foo=1&bar=&foo=2&=3")
    error = response.json()["error"]
    assert response.status_code == 400
    assert set(error["fields"]) == {"foo", "bar", ""}
    assert error["message"].startswith("Unknown query parameters: 'foo', 'bar', ''.")


def test_the_parameters_an_endpoint_takes_are_still_taken(bearer: Client, parked: tuple[Run, Approval]) -> None:
    run, _ = parked
    assert bearer.post(f"{URL}?wait=", BODY, content_type="application/json").status_code == 202
    assert bearer.get(f"{URL}?agent=company-assistant&status=queued&page_size=5").status_code == 200
    Run.objects.filter(id=run.id).update(status=Run.Status.SUCCEEDED)
    assert bearer.get(f"{URL}/{run.id}/events?after=0").status_code == 200


def too_many_fields() -> str:
    return "&".join(f"a{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c: c.get(f"{URL}?{too_many_fields()}"), id="GET /runs"),
        pytest.param(lambda c: c.post(f"{URL}?{too_many_fields()}", BODY, content_type="application/json"), id="POST"),
        pytest.param(lambda c: c.get(f"/api/v1/usage?{too_many_fields()}"), id="GET /usage"),
        # A plain Django view: refused by the URLconf's handler400, in the same words.
        pytest.param(lambda c: c.get(f"{URL}/{'0' * 32}/events?{too_many_fields()}"), id="events"),
    ],
)
def test_too_many_query_parameters_is_a_400_that_says_so_and_gives_the_limit(
    bearer: Client, call: Callable[[Client], Any]
) -> None:
    response = call(bearer)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {
        "error": {
            "code": "too_many_fields",
            "message": f"The request has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} query parameters or "
            "form fields.",
        }
    }
    assert not Run.objects.exists()


def test_too_many_query_parameters_on_a_rest_view_logs_no_error(
    bearer: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The API's exception handler answers it: a caller's mistake, logged as Django logs any 400 (a warning), not
    as the security error with its traceback that Django's own handling writes."""
    with caplog.at_level("WARNING"):
        response = bearer.get(f"/api/v1/usage?{too_many_fields()}")
    assert response.json()["error"]["code"] == "too_many_fields"
    assert [record.levelname for record in caplog.records] == ["WARNING"]
