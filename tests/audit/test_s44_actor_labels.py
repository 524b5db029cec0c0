"""Who did it, and by which path, in words (a Korean admin walk): the pages showed the record's codes as they are,
"system:live이(가) … 요청했습니다", "처리자: admin:admin", "시작한 사람: system:run_eval", a tool's callers
"system:live", and a History page's path "seed_demo" where the event's page says "관리자". The record keeps its
codes (``audit.labels.actor_in_words`` and ``via_label`` only read them)."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from agents.execution import run_execute
from agents.models import Agent, Approval, Run
from audit.labels import actor_in_words, via_label
from audit.models import AuditEvent
from evals.models import EvalRun
from evals.services import eval_set_apply
from tests.agents import test_approvals

pytestmark = pytest.mark.django_db

# The approvals' fixtures: tasks run eagerly; an agent whose model writes a note through a real stdio server.
eager_tasks, writer, notes = test_approvals.eager_tasks, test_approvals.writer, test_approvals.notes


def text(page: bytes) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.decode()))


def english(client: Client, url: str) -> str:
    return text(client.get(url, HTTP_ACCEPT_LANGUAGE="en").content)


def a_boss() -> Client:
    browser = Client()
    browser.force_login(get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only"))
    return browser


def test_the_record_s_actors_read_in_words_and_any_other_as_it_is() -> None:
    assert actor_in_words("admin:alice") == "alice (admin)"
    assert actor_in_words("api_key:apk_ab12") == "API key apk_ab12…"
    assert actor_in_words("api_key:apk_ab12 (client gone)") == "API key apk_ab12… (client gone)"
    assert actor_in_words("system:live") == "live run (no API key)"
    assert actor_in_words("system:run_eval") == "run_eval command"
    assert actor_in_words("system:seed_demo") == "seed_demo command"
    assert actor_in_words("rule-tester:alice") == "alice (rule tester)"
    assert actor_in_words("alice") == "alice"  # a username, as an admin page's change records it
    assert actor_in_words("system:no_such_thing") == "system:no_such_thing"
    assert actor_in_words("admin:a\u202eb") == "a⟦U+202E⟧b (admin)"
    assert actor_in_words("") == ""


@pytest.mark.slow
def test_a_live_runs_approval_names_who_asked_and_who_decided_in_words(
    writer: tuple[Run, object], django_capture_on_commit_callbacks: object
) -> None:
    keyed, _client = writer
    run = Run.objects.create(agent=keyed.agent, query="회의록을 저장해줘")  # no API key: a live run of its own
    run_execute(run_id=str(run.id))
    approval = Approval.objects.get(run=run)
    assert approval.requested_by == "system:live"  # the record keeps its code
    browser = a_boss()

    asked = "Asked by live run (no API key) at "
    assert asked in english(browser, f"/admin/agents/approval/{approval.pk}/change/")
    for decision in ("approve", "reject"):
        assert asked in english(browser, f"/admin/agents/approval/{approval.pk}/decide/{decision}/")
    row = re.search(
        r'<tr class="pending-approval".*?</tr>',
        browser.get("/admin/", HTTP_ACCEPT_LANGUAGE="en").content.decode(),
        re.S,
    )
    assert row is not None
    assert "requested by: live run (no API key)" in text(row.group(0).encode())
    assert "system:live" not in text(row.group(0).encode())

    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        browser.post(f"/admin/agents/approval/{approval.pk}/decide/approve/", {"reason": ""})
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("executed", "admin:boss")
    page = english(browser, f"/admin/agents/approval/{approval.pk}/change/")
    assert "Decided by boss (admin)." in page and "Asked by live run (no API key) at " in page
    assert "Decided by boss (admin)." in english(browser, f"/admin/agents/approval/{approval.pk}/decide/approve/")
    timeline = english(browser, f"/admin/agents/run/{run.pk}/change/")
    assert "by boss (admin)" in timeline and "by admin:boss" not in timeline

    # The call it let through counts for its caller, named in words on the tool metrics page.
    assert AuditEvent.objects.filter(action="tool.call", actor="system:live", tool="append_note").exists()
    metrics = english(browser, "/admin/audit/auditevent/metrics/")
    assert "live run (no API key) : 1" in metrics  # the tool's callers
    assert "live run (no API key) — 1" in metrics  # per caller
    assert "system:live" not in metrics


def test_an_eval_runs_page_names_who_started_it_in_words() -> None:
    agent = Agent.objects.create(slug="a", name="a")
    leave = eval_set_apply(document={"name": "leave", "cases": [{"query": "연차는 며칠?"}]}, actor="t", via="tests")
    browser = a_boss()
    for started_by, words in (("system:run_eval", "run_eval command"), ("admin:boss", "boss (admin)")):
        eval_run = EvalRun.objects.create(eval_set=leave.eval_set, agent=agent, total=1, started_by=started_by)
        page = english(browser, f"/admin/evals/evalrun/{eval_run.pk}/change/")
        assert f"Started by: {words}" in page
        assert started_by not in page


def test_a_history_pages_path_is_named_as_the_events_page_names_it(admin_client: Client) -> None:
    assert via_label("admin") == str(AuditEvent.Source.ADMIN.label)
    assert via_label("seed_demo") == "seed_demo command"
    assert via_label("command") == "a command"
    assert via_label("tests") == "tests"
    call_command("create_api_key", "배치 키", stdout=io.StringIO(), stderr=io.StringIO())
    created = AuditEvent.objects.get(action="config.api_key.create").result
    assert isinstance(created, dict) and created["via"] == "create_api_key"  # the record keeps its code
    pk = created["id"]
    response = admin_client.post(f"/admin/agents/apikey/{pk}/change/", {"name": "야간 배치 키", "rate": ""})
    assert response.status_code == 302

    page = admin_client.get(f"/admin/agents/apikey/{pk}/history/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    paths = re.findall(r'<td[^>]*>[^<]*</td>\s*<td>([^<]*)</td>\s*<td>[^<]*</td>\s*<td><a href="/admin/audit/', page)
    assert paths == ["관리자", "create_api_key 명령"]  # newest first; a command's name is its own


def test_the_approval_list_and_a_history_page_name_who_acted_in_words(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="words", name="words")
    run = Run.objects.create(agent=agent, query="q")
    Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={},
        call_hash="h",
        requested_by="system:live",
        decided_by="admin:boss",
        status=Approval.Status.REJECTED,
        expires_at=timezone.now(),
    )
    listing = admin_client.get("/admin/agents/approval/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "live run (no API key)" in listing and "boss (admin)" in listing
    assert ">system:live<" not in listing and ">admin:boss<" not in listing

    call_command("create_api_key", "배치 키", stdout=io.StringIO(), stderr=io.StringIO())
    created = AuditEvent.objects.get(action="config.api_key.create")
    assert created.actor == "system:create_api_key"
    history = admin_client.get(
        f"/admin/agents/apikey/{created.result['id']}/history/", HTTP_ACCEPT_LANGUAGE="en"
    ).content.decode()
    assert '<td title="system:create_api_key">create_api_key command</td>' in history
