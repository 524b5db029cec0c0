"""Human approval of write calls: a run parks, a person decides (API or admin), the run resumes and the call is
executed exactly once; rejection and expiry are told to the model."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agent_platform.celery import app as celery_app
from agents.approvals import approvals_expire_due
from agents.execution import run_execute
from agents.models import Agent, Approval, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db(transaction=False)

WRITES_A_NOTE = [
    {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
    {"content": "결과: {last_tool_result}"},
]


@pytest.fixture(autouse=True)
def eager_tasks():  # type: ignore[no-untyped-def]
    """Dispatch runs in-process (a resumed run is executed right here, as a worker would)."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


@pytest.fixture
def notes(tmp_path) -> Path:  # type: ignore[no-untyped-def]
    return tmp_path / "notes.txt"


@pytest.fixture
def writer(db, notes):  # type: ignore[no-untyped-def]
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="append_note").update(idempotency_arg="idempotency_key")
    key, raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(slug="notes", servers=[server], provider="scripted", script=WRITES_A_NOTE, with_demo_rules=False)
    # These tests decide as the API caller: this agent lets its callers approve the model's writes.
    Agent.objects.filter(pk=agent.pk).update(caller_approves_model_writes=True)
    run = Run.objects.create(agent=agent, api_key=key, query="회의록을 저장해줘")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    yield run, client
    get_default_pool().close("notes")


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def park(run: Run) -> Approval:
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    return run.approvals.get()


def a_rule_that_saves_the_notes(run: Run) -> None:
    """A deterministic rule of the run's agent that writes (append_note) when the query names 회의록."""
    from agents.models import DeterministicRule

    DeterministicRule.objects.create(
        agent=run.agent,
        name="회의록 저장 규칙",
        server=run.agent.servers.get(),
        tool_name="append_note",
        when={"any_keywords": ["회의록"]},
        params={"text": "규칙이 저장"},
    )


def decide(client: APIClient, run: Run, approval: Approval, decision: str, reason: str = ""):  # type: ignore[no-untyped-def]
    return client.post(
        f"/api/v1/runs/{run.id}/approvals/{approval.id}", {"decision": decision, "reason": reason}, format="json"
    )


@pytest.mark.slow
def test_a_write_call_parks_the_run_until_someone_decides(writer, notes) -> None:
    run, client = writer
    approval = park(run)
    assert (approval.tool, approval.status, approval.args) == ("append_note", "pending", {"text": "회의록 저장"})
    assert approval.expires_at > timezone.now()
    assert lines(notes) == []
    body = client.get(f"/api/v1/runs/{run.id}").json()
    assert body["status"] == "awaiting_approval"
    assert body["approvals"][0]["id"] == str(approval.id)


@pytest.mark.slow
def test_the_answer_of_a_run_with_approvals_is_drf_s_own(writer, notes) -> None:
    from tests.api.test_runs_api import drf_answers

    run, client = writer
    approval = park(run)
    run.refresh_from_db()
    parked = drf_answers(run)
    assert parked[0][0]["approvals"][0]["id"] == str(approval.id)
    decide(client, run, approval, "approve")
    run.refresh_from_db()
    for ours, drf in [*parked, *drf_answers(run)]:
        assert ours == drf and list(ours) == list(drf)


@pytest.mark.slow
def test_an_approved_call_runs_exactly_once_with_its_idempotency_key(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    run, client = writer
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        response = decide(client, run, approval, "approve", "확인함")
    assert response.status_code == 200, response.content
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "notes: 1" in run.answer
    [line] = lines(notes)
    assert line == f"회의록 저장\t{run.id}:{approval.pk}"  # the approval's key
    approval.refresh_from_db()
    assert approval.status == "executed"
    actions = list(AuditEvent.objects.filter(run_id=run.id).order_by("id").values_list("action", "ok"))
    assert actions == [("approval.request", False), ("approval.approve", True), ("tool.call", True)]
    # A second decision, or a redelivered run, changes nothing.
    assert decide(client, run, approval, "approve").status_code == 409
    run_execute(run_id=str(run.id))
    assert len(lines(notes)) == 1


@pytest.mark.slow
def test_a_rejected_call_is_not_made_and_the_model_is_told(writer, notes, django_capture_on_commit_callbacks) -> None:
    run, client = writer
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "거부했습니다" in run.answer and "필요 없음" in run.answer  # the agent's language (ko)
    assert lines(notes) == []
    assert AuditEvent.objects.filter(run_id=run.id, action="approval.reject").exists()


@pytest.mark.slow
def test_an_expired_approval_fails_the_call(writer, notes, django_capture_on_commit_callbacks) -> None:
    run, client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire_due() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "제한 시간 내에 승인되지 않았습니다" in run.answer
    assert lines(notes) == []
    assert decide(client, run, approval, "approve").status_code == 409


@pytest.mark.slow
def test_an_approval_is_bound_to_its_run(writer, notes) -> None:
    run, client = writer
    approval = park(run)
    other = Run.objects.create(agent=run.agent, api_key=run.api_key, query="other")
    assert (
        client.post(
            f"/api/v1/runs/{other.id}/approvals/{approval.id}", {"decision": "approve"}, format="json"
        ).status_code
        == 404
    )
    assert decide(client, run, approval, "maybe").status_code == 400


@pytest.mark.slow
def test_a_worker_restart_between_approval_and_execution_still_executes_once(writer, notes) -> None:
    run, client = writer
    approval = park(run)
    # The decision commits, but the worker that would run the resumed task dies before it executes anything.
    response = decide(client, run, approval, "approve")
    assert response.status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and lines(notes) == []
    # The message is delivered again (to another worker): the call runs once; a further delivery is a no-op.
    run_execute(run_id=str(run.id))
    run_execute(run_id=str(run.id))
    assert len(lines(notes)) == 1
    assert Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED


@pytest.mark.slow
def test_an_execution_cut_short_is_never_repeated(writer, notes) -> None:
    run, _client = writer
    approval = park(run)
    # The worker claimed the execution and died: the outcome is unknown, so the call is not made again.
    Approval.objects.filter(pk=approval.pk).update(status="executing")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.QUEUED)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "반영 여부를 알 수 없습니다" in run.answer  # "may or may not have taken effect", in the agent's language
    assert lines(notes) == []


@pytest.mark.slow
def test_an_admin_approves_in_the_admin(writer, notes, django_capture_on_commit_callbacks) -> None:
    run, _client = writer
    approval = park(run)
    admin = get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only")
    browser = Client()
    browser.force_login(admin)
    page = browser.get(f"/admin/agents/approval/{approval.pk}/change/").content.decode()
    assert "회의록 저장" in page  # the arguments, masked
    assert f"/admin/agents/approval/{approval.pk}/decide/approve/" in page
    assert 'name="_save"' not in page and "/delete/" not in page
    confirm = browser.get(f"/admin/agents/approval/{approval.pk}/decide/approve/").content.decode()
    assert "회의록 저장" in confirm and 'id="confirm-decision"' in confirm
    with django_capture_on_commit_callbacks(execute=True):
        response = browser.post(f"/admin/agents/approval/{approval.pk}/decide/approve/", {"reason": ""})
    assert response.status_code == 302 and response["Location"] == f"/admin/agents/run/{run.pk}/change/"
    approval.refresh_from_db()
    assert approval.status == "executed" and approval.decided_by == "admin:boss"
    assert len(lines(notes)) == 1


@pytest.mark.slow
def test_rejecting_in_the_admin_needs_a_reason(writer, notes, django_capture_on_commit_callbacks) -> None:
    run, _client = writer
    approval = park(run)
    admin = get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only")
    browser = Client()
    browser.force_login(admin)
    url = f"/admin/agents/approval/{approval.pk}/decide/reject/"
    response = browser.post(url, {"reason": "  "})
    assert response.status_code == 200 and "Give a reason for rejecting" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "pending"
    with django_capture_on_commit_callbacks(execute=True):
        assert browser.post(url, {"reason": "필요 없음"}).status_code == 302
    approval.refresh_from_db()
    assert (approval.status, approval.reason, approval.decided_by) == ("rejected", "필요 없음", "admin:boss")
    assert lines(notes) == []
    # Decided once: a second decision is refused with a message, not applied.
    browser.post(f"/admin/agents/approval/{approval.pk}/decide/approve/", {"reason": ""})
    approval.refresh_from_db()
    assert approval.status == "rejected"


@pytest.mark.slow
def test_an_approved_call_runs_with_its_exact_arguments_though_the_stored_conversation_is_masked(
    db, notes, django_capture_on_commit_callbacks
) -> None:
    secretish = "token=abcd1234efgh5678"
    server = McpServer.objects.create(
        mcp_id="notes-exact",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    key, raw = api_key_create(actor="test", via="tests", name="caller")
    script = [{"tool_calls": [{"name": "append_note", "args": {"text": secretish}}]}, {"content": "{last_tool_result}"}]
    agent = make_agent(slug="exact", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(caller_approves_model_writes=True)
    run = Run.objects.create(agent=agent, api_key=key, query="저장")
    approval = park(run)
    assert "abcd1234efgh5678" not in str(approval.args)  # shown masked
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert Approval.objects.filter(run=run).count() == 1
    [line] = lines(notes)
    assert line.startswith(secretish)
    get_default_pool().close("notes-exact")


# ---- who may approve --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_by_default_the_caller_may_not_approve_a_write_the_model_asked_for_but_a_reviewer_may(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    run, client = writer
    Agent.objects.filter(pk=run.agent_id).update(caller_approves_model_writes=False)
    approval = park(run)
    refused = decide(client, run, approval, "approve")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "approval_needs_reviewer"
    approval.refresh_from_db()
    assert approval.status == "pending" and lines(notes) == []
    reviewer = get_user_model().objects.create_user("rita", "", "pw-Long-enough-7", is_staff=True)
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    admin = Client()
    admin.force_login(reviewer)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(f"/admin/agents/approval/{approval.pk}/decide/approve/", {"reason": ""})
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "executed" and approval.decided_by == "admin:rita"
    assert len(lines(notes)) == 1


@pytest.mark.slow
def test_the_caller_may_still_reject_a_write_the_model_asked_for(writer, django_capture_on_commit_callbacks) -> None:
    run, client = writer
    Agent.objects.filter(pk=run.agent_id).update(caller_approves_model_writes=False)
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "아니요").status_code == 200
    approval.refresh_from_db()
    assert approval.status == "rejected"
    decision = AuditEvent.objects.get(run_id=run.id, action="approval.reject")
    assert (decision.source, decision.actor[:8]) == ("api", "api_key:")  # the caller's, not an admin's


@pytest.mark.slow
def test_the_caller_may_approve_a_write_a_deterministic_rule_made(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    run, client = writer
    Agent.objects.filter(pk=run.agent_id).update(caller_approves_model_writes=False)
    a_rule_that_saves_the_notes(run)
    approval = park(run)
    assert approval.call_id.startswith("rule:")
    with django_capture_on_commit_callbacks(execute=True):
        response = decide(client, run, approval, "approve")
    assert response.status_code == 200, response.content
    assert lines(notes)[0].startswith("규칙이 저장")


@pytest.mark.slow
def test_a_parked_run_tells_its_event_stream_which_approval_it_waits_for(writer) -> None:
    from agents.models import RunEvent

    run, _client = writer
    approval = park(run)

    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", "data"))
    kinds = [kind for kind, _data in events]
    assert kinds[-2:] == ["approval", "status"]  # what it waits for, then that it waits
    data = events[-2][1]
    assert data["approval_id"] == str(approval.pk)
    assert (data["tool"], data["status"], data["args"]) == ("append_note", "pending", approval.args)
    assert events[-1][1]["status"] == "awaiting_approval"


@pytest.mark.slow
def test_an_offline_run_whose_rule_write_the_caller_rejected_says_so_not_to_try_again_later(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    run, client = writer
    Agent.objects.filter(pk=run.agent_id).update(model_provider="offline", language="ko")
    a_rule_that_saves_the_notes(run)
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200

    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "deterministic:tool_failed")
    assert run.error_message == "요청을 수행하지 않았습니다: 승인이 거부되었습니다."
    assert lines(notes) == []


@pytest.mark.slow
def test_a_tool_withdrawn_counts_its_argument_errors_across_a_parked_run(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    """The correction cap counts the argument errors of the pass before the approval too: the second bad call
    after resuming (the cap is 2) withdraws the tool, the third is refused without reaching the server."""
    run, client = writer
    echo = ToolContract.objects.get(tool__server__mcp_id="notes", tool__name="echo")
    ToolContract.objects.filter(pk=echo.pk).update(correction_cap=2, risk="read")
    bad = {"tool_calls": [{"name": "echo", "args": {}}]}
    script = [
        bad,
        {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
        bad,
        bad,
        {"content": "그만둡니다"},
    ]
    agent = run.agent
    agent.model_params = {**(agent.model_params or {}), "script": script}
    Agent.objects.filter(pk=agent.pk).update(model_params=agent.model_params, max_iterations=10)
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    reasons = list(
        AuditEvent.objects.filter(run_id=run.id, tool="echo").order_by("id").values_list("reason", flat=True)
    )
    assert reasons == ["args:missing:text", "args:missing:text", "tool:withdrawn"]
    tool_errors = [m.get("error") for m in run.messages if m.get("type") == "tool" and m.get("name") == "echo"]
    assert tool_errors == ["args:missing:text", "args:missing:text", "tool:withdrawn"]
    assert {"type": "tool_withdrawn", "tool": "echo", "corrections": 2} in run.messages


@pytest.mark.slow
def test_a_tool_withdrawn_before_the_run_parked_is_still_withdrawn_after_it_resumes(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    run, client = writer
    echo = ToolContract.objects.get(tool__server__mcp_id="notes", tool__name="echo")
    ToolContract.objects.filter(pk=echo.pk).update(correction_cap=1, risk="read")
    bad = {"tool_calls": [{"name": "echo", "args": {}}]}
    script = [
        bad,
        {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
        bad,
        {"content": "끝"},
    ]
    Agent.objects.filter(pk=run.agent.pk).update(model_params={"script": script}, max_iterations=10)
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    reasons = list(
        AuditEvent.objects.filter(run_id=run.id, tool="echo").order_by("id").values_list("reason", flat=True)
    )
    assert reasons == ["args:missing:text", "tool:withdrawn"]
    # The resumed turns are not offered the tool, and the first pass's withdrawal stays in the trace.
    bound = [m["data"]["response_metadata"]["bound_tools"] for m in run.conversation if m["type"] == "ai"]
    assert "echo" in bound[0] and "echo" not in bound[2]
    assert [m for m in run.messages if m.get("type") == "tool_withdrawn"] == [
        {"type": "tool_withdrawn", "tool": "echo", "corrections": 1}
    ]
