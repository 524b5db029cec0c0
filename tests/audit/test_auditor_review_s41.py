"""An auditor's review (s41): a list asked for a lookup it must not run, or a year out of range, is shown without
its filters, not hung or a 500; a call id carries no secret into the record; the tool filter lists tools, not the
names a model made up nor "login"; the metrics API refuses a period that starts after now."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from agent_platform.admin_filters import _lookup_refused
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry import gate
from tests.conftest import DEMO_SECRET, logged_in

pytestmark = pytest.mark.django_db

REFUSED = "A filter cannot be used on this list; the list is shown without filters."
OUT_OF_RANGE = "A filter's value is out of range; the list is shown without filters."


def _quiet(user: Any) -> Client:
    """A signed-in client that answers a server error as a 500, as a browser sees it."""
    client = logged_in(user)
    client.raise_request_exception = False
    return client


def _said(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# --- 1. a regular expression or a JSON lookup is refused on every list ---------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/admin/audit/auditevent/?hash__regex=%5E%5B0-9a-f%5D%2B%24",
        "/admin/audit/auditevent/?tool__iregex=.",
        "/admin/audit/auditevent/?hash__lower__regex=.",  # a chained lookup
        "/admin/agents/run/?query__regex=.",
        "/admin/agents/approval/?call_hash__regex=.",
        "/admin/audit/auditevent/?args__contains=%7B%7D",
        "/admin/audit/auditevent/?result__has_key=x",
        "/admin/audit/auditevent/?args__name=x",  # a key of a JSON field
        "/admin/agents/approval/?run__messages__contains=%5B%5D",  # across a relation
    ],
)
def test_a_regular_expression_or_a_json_lookup_shows_the_list_without_filters(auditor_user, url: str) -> None:
    response = _quiet(auditor_user).get(url)
    assert response.status_code == 302, response.status_code
    assert response["Location"].endswith("/?e=1")
    assert _said(response) == [REFUSED]


def test_a_json_field_is_still_filtered_by_exact_and_isnull_and_other_fields_by_any_other_lookup(auditor_user) -> None:
    audit_event_record(source="admin", tool="ping")
    client = _quiet(auditor_user)
    for query in ("result__isnull=True", "tool__startswith=pi", "tool__contains=in", "q=ping"):
        response = client.get(f"/admin/audit/auditevent/?{query}")
        assert response.status_code == 200, query
        assert [e.tool for e in response.context["cl"].result_list] == ["ping"], query


def test_no_filter_declared_on_any_list_is_refused(admin_user, rf) -> None:
    request = rf.get("/admin/")
    request.user = admin_user
    checked = 0
    for model, model_admin in admin.site._registry.items():
        if not model_admin.has_view_permission(request):
            continue
        changelist = model_admin.get_changelist_instance(request)
        parameters = [p for spec in changelist.filter_specs for p in spec.expected_parameters()]
        if model_admin.date_hierarchy:
            parameters += [f"{model_admin.date_hierarchy}__{part}" for part in ("year", "month", "day")]
        for parameter in parameters:
            assert not _lookup_refused(model, parameter), (model, parameter)
            checked += 1
    assert checked > 20


# --- 2. a year out of range -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/admin/agents/approval/?created_at__year=10000",
        "/admin/agents/approval/?expires_at__year=0",
        "/admin/agents/approval/?decided_at__year=-1",
        "/admin/audit/auditcheckpoint/?archived_at__year=99999",
        "/admin/agents/run/?finished_at__year=99999",
    ],
)
def test_a_year_out_of_range_shows_the_list_without_filters(auditor_user, url: str) -> None:
    response = _quiet(auditor_user).get(url)
    assert response.status_code == 302, response.status_code
    assert response["Location"].endswith("/?e=1")
    assert _said(response) == [OUT_OF_RANGE]


# --- 3. a call id is masked -------------------------------------------------------------------------------------------


def test_a_secret_in_a_call_id_reaches_no_auditor_view(demo_server, auditor_user) -> None:
    who = gate.GateCall(source="agent", actor="t", call_id=f"c-{DEMO_SECRET}")
    gate.call(server=demo_server, tool_name="search_employee", args={"name": "x"}, who=who)
    event = AuditEvent.objects.get(action="tool.call")
    assert event.call_id.startswith("c-") and DEMO_SECRET not in event.call_id
    client = _quiet(auditor_user)
    for url in ("/api/v1/audit/events", "/api/v1/audit/events?format=csv", "/api/v1/audit/events?format=jsonl"):
        response = client.get(url)
        assert response.status_code == 200, url
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert DEMO_SECRET.encode() not in body, url
    page = client.get(f"/admin/audit/auditevent/{event.pk}/change/")
    assert page.status_code == 200
    assert DEMO_SECRET not in page.content.decode()


# --- 4. the tool filter lists tools -----------------------------------------------------------------------------------


def test_the_tool_filter_folds_made_up_names_into_one_entry_and_leaves_out_sign_ins(auditor_user) -> None:
    audit_event_record(source="agent", mcp_id="local", tool="ping", ok=True)
    audit_event_record(source="agent", mcp_id="local", tool="pnig", ok=False, reason="tool:unknown")
    audit_event_record(source="agent", mcp_id="local", tool="ping_all", ok=False, reason="tool:unknown")
    audit_event_record(source="agent", mcp_id="other", tool="ping", ok=False, reason="tool:unknown")  # a tool still
    Client().post("/admin/login/", {"username": "audrey", "password": "wrong"})  # security.login_failed, "login"
    assert AuditEvent.objects.filter(action__startswith="security.", tool="login").exists()
    client = _quiet(auditor_user)

    page = client.get("/admin/audit/auditevent/")
    changelist = page.context["cl"]
    tools = next(spec for spec in changelist.filter_specs if spec.parameter_name == "tool")
    entries = {str(c["display"]): c for c in tools.choices(changelist)}
    assert list(entries) == ["All", "ping", "unknown tool (any name)"]

    # The folded entry chooses the reason, which the export link carries, and is shown chosen.
    folded = client.get(f"/admin/audit/auditevent/{entries['unknown tool (any name)']['query_string']}")
    assert sorted(e.tool for e in folded.context["cl"].result_list) == ["ping", "ping_all", "pnig"]
    assert "reason=tool%3Aunknown" in folded.context["audit_export_url"]
    changelist = folded.context["cl"]
    tools = next(spec for spec in changelist.filter_specs if spec.parameter_name == "tool")
    chosen = [str(c["display"]) for c in tools.choices(changelist) if c["selected"]]
    assert chosen == ["unknown tool (any name)"]


# --- 5. the metrics API's period -------------------------------------------------------------------------------------


def test_the_metrics_api_refuses_a_period_that_starts_after_now(auditor_user) -> None:
    since = (timezone.localdate() + dt.timedelta(days=2)).isoformat()
    response = _quiet(auditor_user).get("/api/v1/audit/metrics", {"since": since})
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["since"]  # the parameter given, not the one left out
    later = (timezone.localdate() + dt.timedelta(days=1)).isoformat()
    response = _quiet(auditor_user).get("/api/v1/audit/metrics", {"since": since, "until": later})
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["until"]


def test_the_metrics_api_writes_both_ends_of_its_period_in_one_time_zone(auditor_user) -> None:
    since = (timezone.localdate() - dt.timedelta(days=2)).isoformat()
    for query in ({"since": since}, {"since": f"{since}T00:00:00Z"}, {}):
        body = _quiet(auditor_user).get("/api/v1/audit/metrics", query).json()
        ends = [dt.datetime.fromisoformat(body[end]) for end in ("since", "until")]
        assert ends[0].utcoffset() == ends[1].utcoffset() == timezone.localtime().utcoffset(), query


def test_a_value_error_that_is_a_bug_is_not_hidden_as_a_filter_out_of_range(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth.admin import GroupAdmin

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("a bug, not a filter")

    monkeypatch.setattr(GroupAdmin, "get_search_results", broken)
    with pytest.raises(ValueError, match="a bug"):
        admin_client.get("/admin/auth/group/?q=운영")
