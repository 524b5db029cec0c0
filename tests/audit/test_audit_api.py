"""``GET /api/v1/audit/events``: auditors only; filters; keyset pages; streamed CSV and JSONL exports.
Personas (tests/conftest.py): an admin, an auditor, an API caller (a key: 403), an outsider (staff, not an auditor)."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import uuid
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.db import connection
from django.db.models import QuerySet
from django.db.models.sql.compiler import SQLCompiler
from django.http import StreamingHttpResponse
from django.test import AsyncClient
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from django.utils import timezone
from rest_framework.test import APIClient

from agents.models import Agent, ApiKey, Run
from audit.models import AuditEvent
from audit.services import audit_event_record
from auditor.selectors import EXPORT_CHUNK_SIZE, EXPORT_COLUMNS
from tests.conftest import AUDITOR_PASSWORD, OUTSIDER_PASSWORD, logged_in
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db

# The project's urls plus the audit API, mounted where agent_platform/urls.py is to include it.
urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/audit/", include("auditor.urls")),
    path("api/v1/", include("agents.api.urls")),
]

EVENTS = "/api/v1/audit/events"


@pytest.fixture(autouse=True)
def audit_api_urls(settings):  # type: ignore[no-untyped-def]
    settings.ROOT_URLCONF = __name__


@pytest.fixture
def auditor_client(auditor_user) -> APIClient:  # type: ignore[no-untyped-def]
    """Here the auditor calls the API with Basic authentication (conftest's ``auditor_client`` has a session)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("audrey", AUDITOR_PASSWORD))
    return client


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def bulk_events(count: int, **fields) -> None:  # type: ignore[no-untyped-def]
    """Many events at once for volume tests. ``bulk_create`` bypasses the hash chain (``audit_event_record``
    appends one at a time): these rows carry seq numbers far past the chain head and are never verified."""
    start = 10**12 + AuditEvent.objects.filter(seq__gte=10**12).count()
    now = timezone.now()
    defaults = {"source": "agent", "mcp_id": "bulk", "tool": "조회", "args": {"이름": "김하늘"}, "result": {"ok": 1}}
    AuditEvent.objects.bulk_create(
        [
            AuditEvent(
                **{**defaults, **fields},
                created_at=now,
                seq=start + i,
                prev_hash="0" * 64,
                hash="0" * 64,
            )
            for i in range(count)
        ],
        batch_size=2000,
    )


@pytest.fixture
def two_runs(db):  # type: ignore[no-untyped-def]
    """Two agents' runs and their audited calls, plus an admin change."""
    first = Agent.objects.create(slug="hr", name="인사")
    second = Agent.objects.create(slug="it", name="IT")
    key = ApiKey.objects.create(name="caller", prefix="apk_caller01", digest="0" * 64)
    hr_run = Run.objects.create(agent=first, api_key=key, query="김하늘 님은 어느 팀?")
    it_run = Run.objects.create(agent=second, query="노트북?")
    audit_event_record(
        source="deterministic", run_id=hr_run.pk, mcp_id="company", tool="search_employee",
        args={"name": "김하늘"}, result={"team": "클라우드운영팀"}, latency_ms=3.5, actor="api_key:apk_caller01",
    )  # fmt: skip
    audit_event_record(
        source="agent", run_id=hr_run.pk, mcp_id="company", tool="get_asset_status", args={"asset_id": "A-1"},
        result="timeout", ok=False, reason="timeout", latency_ms=200.0, actor="api_key:apk_caller01",
    )  # fmt: skip
    audit_event_record(
        source="agent", run_id=it_run.pk, mcp_id="assets", tool="get_asset", args={"owner": "=HYPERLINK(1)"},
        result=None, ok=False, reason="args:missing:owner", attempt=0, actor="local",
    )  # fmt: skip
    audit_event_record(source="admin", action="agent.update", args={"name": ["a", "b"]}, actor="boss")
    return hr_run, it_run


def ids(response) -> list[int]:  # type: ignore[no-untyped-def]
    return [e["id"] for e in response.json()["results"]]


# ---- who may read it ------------------------------------------------------------------------------------------


def test_an_auditor_reads_events_with_basic_auth(auditor_client, two_runs) -> None:
    response = auditor_client.get(EVENTS)
    assert response.status_code == 200
    body = response.json()
    assert [e["action"] for e in body["results"]] == ["config.user.create", *["tool.call"] * 3, "agent.update"]
    assert body["next_cursor"] is None
    first = body["results"][1]
    assert set(first) == set(EXPORT_COLUMNS)
    assert first["agent"] == "hr" and first["result"] == {"team": "클라우드운영팀"}
    assert "클라우드운영팀" in response.content.decode("utf-8")  # not \\u-escaped


def test_an_auditor_reads_events_with_the_admin_login_session(auditor_user, two_runs) -> None:
    assert logged_in(auditor_user).get(EVENTS).status_code == 200


def test_a_superuser_reads_events(admin_client, two_runs) -> None:
    assert admin_client.get(EVENTS).status_code == 200


def test_an_api_callers_key_gets_403(api_client, two_runs) -> None:
    for url in (EVENTS, f"{EVENTS}?format=csv", "/api/v1/audit/metrics"):
        response = api_client.get(url)
        assert response.status_code == 403, url
        assert response.json()["error"]["code"] == "permission_denied"


def test_an_outsider_on_the_staff_gets_403(outsider, two_runs) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic(outsider.username, OUTSIDER_PASSWORD))
    assert client.get(EVENTS).status_code == 403
    assert client.get("/api/v1/audit/metrics").status_code == 403


def test_no_credentials_or_a_wrong_password_get_401(auditor_user, two_runs) -> None:
    assert APIClient().get(EVENTS).status_code == 401
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("audrey", "wrong"))
    response = client.get(EVENTS)
    assert response.status_code == 401 and response.json()["error"]["code"] == "authentication_failed"


def test_the_callers_runs_api_still_works_beside_it(api_client, demo_agent) -> None:
    response = api_client.post("/api/v1/runs", {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 202


# ---- filters --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected_tools"),
    [
        ("agent=hr", ["search_employee", "get_asset_status"]),
        ("mcp_id=assets", ["get_asset"]),
        ("tool=get_asset_status", ["get_asset_status"]),
        ("source=deterministic", ["search_employee"]),
        ("ok=false", ["get_asset_status", "get_asset"]),
        ("ok=true&source=admin", [""]),
        ("reason=timeout", ["get_asset_status"]),
        ("reason=args:*", ["get_asset"]),
        ("reason=!timeout", ["search_employee", "get_asset", ""]),  # "!": all but those (no reason kept)
        ("reason=!args:*", ["search_employee", "get_asset_status", ""]),
        ("action=!agent.update&ok=true", ["search_employee"]),
        ("actor=local", ["get_asset"]),
        ("actor=caller", ["search_employee", "get_asset_status"]),
        ("actor=boss", [""]),
        ("agent=hr&ok=false", ["get_asset_status"]),
    ],
)
def test_each_filter_narrows_the_events(auditor_client, two_runs, query, expected_tools) -> None:
    response = auditor_client.get(f"{EVENTS}?{query}")
    assert response.status_code == 200, response.content
    assert [e["tool"] for e in response.json()["results"] if e["action"] != "config.user.create"] == expected_tools


def test_the_run_filter_and_the_period(auditor_client, two_runs) -> None:
    _hr_run, it_run = two_runs
    assert [e["run"] for e in auditor_client.get(f"{EVENTS}?run={it_run.pk}").json()["results"]] == [str(it_run.pk)]
    today = timezone.localdate()
    everything = auditor_client.get(f"{EVENTS}?since={today}&until={today}").json()["results"]
    assert len(everything) == AuditEvent.objects.count()
    assert auditor_client.get(f"{EVENTS}?until={today}T00:00:00").json()["results"] == []
    later = (timezone.now() + dt.timedelta(minutes=5)).isoformat()
    assert auditor_client.get(f"{EVENTS}?since={later.replace('+', '%2B')}").json()["results"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("ok=maybe", "ok"),
        ("run=not-a-uuid", "run"),
        ("since=yesterday", "since"),
        ("until=2026-13-01", "until"),
        ("since=2026-03-02&until=2026-03-01", "until"),
        ("source=robot", "source"),
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("cursor=-1", "cursor"),
        ("cursor=abc", "cursor"),
        ("format=xlsx", "format"),
        ("agnet=hr", "agnet"),
        ("format=csv&cursor=10", "cursor"),
    ],
)
def test_a_bad_filter_is_a_400_in_the_projects_error_shape(auditor_client, two_runs, query, field) -> None:
    response = auditor_client.get(f"{EVENTS}?{query}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and error["message"]
    assert field in error["fields"]


@pytest.mark.slow
def test_keyset_pages_walk_every_event_once_in_id_order(auditor_client, two_runs) -> None:
    bulk_events(7)
    seen: list[int] = []
    url = f"{EVENTS}?limit=3&mcp_id=bulk"
    while url:
        body = auditor_client.get(url).json()
        seen += [e["id"] for e in body["results"]]
        url = body["next"]
        assert (body["next_cursor"] is None) == (url is None)
    assert seen == list(AuditEvent.objects.filter(mcp_id="bulk").order_by("id").values_list("id", flat=True))


def test_a_page_is_read_with_a_bounded_number_of_queries(auditor_client, two_runs) -> None:
    bulk_events(50)
    with CaptureQueriesContext(connection) as queries:
        assert len(auditor_client.get(f"{EVENTS}?limit=40").json()["results"]) == 40
    # authentication (user, groups), the archive's end (whether the page reaches into it) and one read of the
    # page: no query per event
    assert len(queries) <= 7


# ---- exports --------------------------------------------------------------------------------------------------


def read(response) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content)


def test_the_csv_export_has_a_bom_a_header_json_cells_and_korean_intact(auditor_client, two_runs) -> None:
    response = auditor_client.get(f"{EVENTS}?format=csv&agent=hr")
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-events-')
    body = read(response)
    assert body.startswith("\ufeff".encode())
    rows = list(csv.reader(io.StringIO(body.decode("utf-8-sig"))))
    assert rows[0] == list(EXPORT_COLUMNS)
    first = dict(zip(rows[0], rows[1], strict=True))
    assert json.loads(first["args"]) == {"name": "김하늘"}
    assert json.loads(first["result"]) == {"team": "클라우드운영팀"}
    assert (first["agent"], first["ok"], first["latency_ms"]) == ("hr", "true", "3.5")
    assert "클라우드운영팀" in body.decode("utf-8")  # raw UTF-8, not escaped


def test_the_csv_export_never_hands_a_spreadsheet_a_formula(auditor_client, two_runs) -> None:
    audit_event_record(source="agent", tool="=cmd|' /C calc'!A0", actor="@evil", ok=False, reason="tool:unknown")
    rows = list(csv.reader(io.StringIO(read(auditor_client.get(f"{EVENTS}?format=csv")).decode("utf-8-sig"))))
    last = dict(zip(rows[0], rows[-1], strict=True))
    assert last["tool"] == "'=cmd|' /C calc'!A0" and last["actor"] == "'@evil"


def test_the_csv_export_guards_full_width_and_space_led_formulas_too(auditor_client, two_runs) -> None:
    audit_event_record(source="agent", tool="＝cmd|' /C calc'!A0", actor=" =evil", ok=False, reason="tool:unknown")
    audit_event_record(source="agent", tool="\u3000＋1", actor="＠x", ok=False, reason="tool:unknown")
    rows = list(csv.reader(io.StringIO(read(auditor_client.get(f"{EVENTS}?format=csv")).decode("utf-8-sig"))))
    cells = [dict(zip(rows[0], row, strict=True)) for row in rows[-2:]]
    assert [(c["tool"], c["actor"]) for c in cells] == [
        ("'＝cmd|' /C calc'!A0", "' =evil"),
        ("'\u3000＋1", "'＠x"),
    ]


def test_the_jsonl_export_is_one_event_per_line_with_korean_as_itself(auditor_client, two_runs) -> None:
    response = auditor_client.get(f"{EVENTS}?format=jsonl&agent=hr")
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"].startswith("application/x-ndjson")
    body = read(response).decode("utf-8")
    assert "김하늘" in body and "\\uae40" not in body
    lines = [json.loads(line) for line in body.splitlines()]
    assert [e["tool"] for e in lines] == ["search_employee", "get_asset_status"]
    assert lines[0]["args"] == {"name": "김하늘"} and lines[0]["run"] == str(two_runs[0].pk)


def test_an_export_takes_the_same_filters(auditor_client, two_runs) -> None:
    body = read(auditor_client.get(f"{EVENTS}?format=jsonl&ok=false&mcp_id=assets")).decode()
    assert [json.loads(line)["tool"] for line in body.splitlines()] == ["get_asset"]


@pytest.mark.slow
def test_a_large_export_streams_in_chunks_without_evaluating_the_queryset(auditor_client, two_runs) -> None:
    total = 5 * EXPORT_CHUNK_SIZE // 2  # three of the cursor's fetches (the last one short), ten blocks
    bulk_events(total)
    executed: list[dict] = []
    real_execute_sql = SQLCompiler.execute_sql

    def spy(compiler, *args, **kwargs):  # type: ignore[no-untyped-def]
        executed.append(kwargs)
        return real_execute_sql(compiler, *args, **kwargs)

    response = auditor_client.get(f"{EVENTS}?format=csv&mcp_id=bulk")
    assert isinstance(response, StreamingHttpResponse)
    blocks = iter(response.streaming_content)
    materialized = AssertionError("the export evaluated its queryset into memory")
    with (
        mock.patch.object(QuerySet, "_fetch_all", side_effect=materialized),
        mock.patch.object(SQLCompiler, "execute_sql", autospec=True, side_effect=spy),
        CaptureQueriesContext(connection) as queries,
    ):
        header = next(blocks)
        assert header.decode("utf-8-sig").strip() == ",".join(EXPORT_COLUMNS)
        assert len(queries) == 0  # the header goes out before the database is read
        first_rows = next(blocks)
        assert 0 < first_rows.count(b"\n") < total  # the first rows arrive before the rest is read
        rest = b"".join(blocks)
    assert (first_rows + rest).count(b"\n") == total
    assert len(queries) == 1  # one cursor for the whole export, no query per row
    assert executed == [{"chunked_fetch": True, "chunk_size": EXPORT_CHUNK_SIZE}]


def test_under_asgi_the_export_is_an_async_stream_read_block_by_block(auditor_user, two_runs) -> None:
    bulk_events(1_200)
    client = AsyncClient()
    # An ASGI header name as it is sent (the client's headers= mapping gives this Django's HTTP_ names).
    credentials = {"authorization": basic("audrey", AUDITOR_PASSWORD)}

    async def export() -> tuple[bool, list[bytes]]:
        response = await client.get(EVENTS, {"format": "jsonl", "mcp_id": "bulk"}, **credentials)
        assert response.status_code == 200
        return response.is_async, [block async for block in response.streaming_content]

    is_async, blocks = async_to_sync(export)()
    assert is_async  # Django would otherwise read a sync iterator to its end before sending anything
    assert len(blocks) == 3  # 500 + 500 + 200 rows
    assert sum(block.count(b"\n") for block in blocks) == 1_200


# ---- metrics --------------------------------------------------------------------------------------------------


def test_the_metrics_endpoint_answers_auditors_with_per_tool_figures(auditor_client, two_runs) -> None:
    response = auditor_client.get("/api/v1/audit/metrics")
    assert response.status_code == 200
    body = response.json()
    assert body["calls"] == 3 and body["errors"] == 2
    assert {(t["mcp_id"], t["tool"]) for t in body["tools"]} == {
        ("company", "search_employee"),
        ("company", "get_asset_status"),
        ("assets", "get_asset"),
    }


def test_the_metrics_endpoint_refuses_bad_periods_and_event_only_filters(auditor_client, two_runs) -> None:
    for query, field in [
        ("since=soon", "since"),
        ("run=" + str(uuid.uuid4()), "run"),
        ("format=csv", "format"),
        ("action=no.such.action", "action"),  # taken and ignored before: the figures were every action's
    ]:
        response = auditor_client.get(f"/api/v1/audit/metrics?{query}")
        assert response.status_code == 400, query
        assert field in response.json()["error"]["fields"]


# ---- PostgreSQL -----------------------------------------------------------------------------------------------

PG_EXPORT = """
import base64, json
from django.db import connection
from django.test import Client
from django.test.utils import override_settings
from audit.services import audit_events_record
# More than one of the export's chunks (EXPORT_CHUNK_SIZE, 2,000): appended together, 50 rows a statement (one by
# one, the appends took longer than the export).
audit_events_record(
    {"source": "agent", "mcp_id": "pg", "tool": "조회", "args": {"i": i}, "latency_ms": float(i % 100)}
    for i in range(2500)
)
auth = "Basic " + base64.b64encode(b"pgaudrey:read-only-Ledger-42").decode()
with override_settings(ROOT_URLCONF="tests.audit.test_audit_api"):
    client = Client(HTTP_AUTHORIZATION=auth)
    export = client.get("/api/v1/audit/events", {"format": "jsonl", "mcp_id": "pg"})
    blocks = iter(export.streaming_content)
    first_block = next(blocks)
    with connection.cursor() as cursor:  # the export's cursor, open on the server while it is read
        cursor.execute("SELECT count(*) FROM pg_cursors WHERE name LIKE '_django_curs_%%'")
        open_cursors = cursor.fetchone()[0]
    lines = (first_block + b"".join(blocks)).decode("utf-8").splitlines()
    page = client.get("/api/v1/audit/events", {"mcp_id": "pg", "limit": 1000, "cursor": 0}).json()
    metrics = client.get("/api/v1/audit/metrics", {"mcp_id": "pg"}).json()
print(json.dumps({
    "status": export.status_code, "lines": len(lines), "first": json.loads(lines[0]), "page": len(page["results"]),
    "calls": metrics["calls"], "p50": metrics["tools"][0]["latency_p50_ms"], "open_cursors": open_cursors,
}, ensure_ascii=False))
"""


@pytest.mark.postgres
def test_on_postgresql_the_group_exists_and_the_export_streams_from_a_server_side_cursor(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    created = manage("create_auditor", "pgaudrey", "--password", AUDITOR_PASSWORD, database_url=postgres_url)
    assert created.returncode == 0, created.stdout + created.stderr
    result = manage("shell", "-c", PG_EXPORT, database_url=postgres_url)
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert (outcome["status"], outcome["lines"], outcome["page"], outcome["calls"]) == (200, 2500, 1000, 2500)
    assert outcome["first"]["tool"] == "조회" and outcome["first"]["args"] == {"i": 0}
    assert outcome["p50"] == 49.5
    assert outcome["open_cursors"] == 1


def test_an_actor_or_tool_pasted_decomposed_finds_the_events_recorded_composed(auditor_client) -> None:
    """Korean names compare by code point: 홍길동 pasted from a decomposed source (macOS) found none of the events
    recorded composed, and the auditor saw an empty list. Both spellings are looked for."""
    import unicodedata

    from audit.services import audit_event_record

    audit_event_record(source="model", mcp_id="m", tool="도구", args={}, result={"ok": 1}, actor="홍길동")
    for actor, tool in (
        ("홍길동", "도구"),
        (unicodedata.normalize("NFD", "홍길동"), unicodedata.normalize("NFD", "도구")),
    ):
        found = auditor_client.get(EVENTS, {"actor": actor, "tool": tool}).json()
        assert [event["tool"] for event in found["results"]] == ["도구"], (actor, found)
