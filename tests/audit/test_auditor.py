"""The auditor: a person who reads the audit record, runs and approvals in the admin and never changes anything or
sees a secret. Personas (tests/conftest.py): an admin, an auditor (``create_auditor``), an outsider (staff, no rights)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.utils import timezone

from agents.execution import run_execute
from agents.models import Agent, ApiKey, Approval, DeterministicRule, Run
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.conftest import AUDITOR_PASSWORD, DEMO_SECRET, make_agent
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db


def a_secret_binding(admin_client) -> McpServer:  # type: ignore[no-untyped-def]
    """A binding whose env secret was set through the admin form, as an admin does it."""
    response = post_server_form(
        admin_client, None, mcp_id="vault", new_env=f"INTERNAL_API_KEY={DEMO_SECRET}", new_headers=""
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    server = McpServer.objects.get(mcp_id="vault")
    McpTool.objects.create(server=server, name="lookup", discovered_at=timezone.now())
    return server


def a_run_with_a_decided_approval(server: McpServer) -> tuple[Run, Approval]:
    agent = Agent.objects.create(slug="ledger", name="장부 도우미")
    agent.servers.set([server])
    key = ApiKey.objects.create(name="caller", prefix="apk_caller01", digest="0" * 64)
    run = Run.objects.create(
        agent=agent,
        api_key=key,
        query="김하늘 님의 장부를 수정해줘",
        status=Run.Status.SUCCEEDED,
        answer="수정하지 않았습니다: 승인이 거절되었습니다.",
        messages=[
            {"type": "human", "content": "김하늘 님의 장부를 수정해줘"},
            {
                "type": "ai",
                "content": "",
                "tool_calls": [{"id": "call-1", "name": "lookup", "args": {"name": "김하늘"}}],
            },
            {"type": "approval", "approval_id": "", "tool": "lookup", "args": {"name": "김하늘"}},
            {"type": "tool", "content": "거절됨", "tool_call_id": "call-1", "name": "lookup", "status": "error"},
            {"type": "ai", "content": "수정하지 않았습니다: 승인이 거절되었습니다."},
        ],
    )
    approval = Approval.objects.create(
        run=run,
        mcp_id=server.mcp_id,
        tool="lookup",
        args={"name": "김하늘"},
        call_hash="h" * 64,
        call_id="call-1",
        status=Approval.Status.REJECTED,
        decided_by="admin:boss",
        reason="위험한 변경",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    run.messages[2]["approval_id"] = str(approval.pk)
    run.save(update_fields=["messages"])
    audit_event_record(
        source="agent",
        run_id=run.pk,
        mcp_id=server.mcp_id,
        tool="lookup",
        call_id="call-1",
        args={"name": "김하늘", "token": DEMO_SECRET},
        result=f"failed with {DEMO_SECRET}",
        ok=False,
        reason="approval:rejected",
        attempt=0,
        actor="api_key:apk_caller01",
        secrets=server.secret_values(),
    )
    return run, approval


# ---- create_auditor -------------------------------------------------------------------------------------------


def test_create_auditor_makes_a_staff_user_in_the_auditor_group_with_view_only_rights(auditor_user) -> None:
    assert auditor_user.is_staff and not auditor_user.is_superuser
    assert list(auditor_user.groups.values_list("name", flat=True)) == ["auditor"]
    assert auditor_user.check_password(AUDITOR_PASSWORD)
    assert auditor_user.get_all_permissions() == {
        "audit.view_auditevent",
        "audit.view_auditcheckpoint",
        "agents.view_run",
        "agents.view_approval",
        "agents.view_runevent",
    }


def test_the_auditor_group_exists_after_migrate_with_exactly_the_view_permissions(db) -> None:
    group = Group.objects.get(name="auditor")
    assert sorted(group.permissions.values_list("codename", flat=True)) == [
        "view_approval",
        "view_auditcheckpoint",
        "view_auditevent",
        "view_run",
        "view_runevent",
    ]


def test_create_auditor_prints_a_generated_password_alone_on_one_line_once(db) -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_auditor", "ines", stdout=out, stderr=err)
    [password] = out.getvalue().split()
    assert len(password) >= 20
    assert get_user_model().objects.get(username="ines").check_password(password)
    assert password not in err.getvalue()


def test_create_auditor_reads_the_password_from_standard_input_off_the_command_line(db) -> None:
    out = io.StringIO()
    call_command("create_auditor", "jun", "--password-stdin", stdin=io.StringIO(AUDITOR_PASSWORD + "\n"), stdout=out)
    assert get_user_model().objects.get(username="jun").check_password(AUDITOR_PASSWORD)
    assert AUDITOR_PASSWORD not in out.getvalue()
    with pytest.raises(CommandError, match="no password"):
        call_command("create_auditor", "kim", "--password-stdin", stdin=io.StringIO(""), stdout=io.StringIO())
    with pytest.raises(CommandError):  # one or the other
        call_command("create_auditor", "lee", "--password-stdin", "--password", "x", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username__in=["kim", "lee"]).exists()


def test_creating_an_auditor_is_itself_audited(auditor_user) -> None:
    event = AuditEvent.objects.get(action="config.user.create")
    assert event.args["username"] == [None, "audrey"] and event.args["groups"] == [None, ["auditor"]]
    assert (event.actor, event.result["via"]) == ("system:create_auditor", "create_auditor")
    assert AUDITOR_PASSWORD not in str(event.args) + str(event.result)


def test_create_auditor_refuses_an_existing_user_and_a_weak_password(auditor_user) -> None:
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_auditor", "audrey", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("create_auditor", "weak", "--password", "123", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username="weak").exists()


# ---- what the auditor may see ---------------------------------------------------------------------------------


def test_the_auditor_sees_audit_events_runs_and_approvals_read_only(admin_client, auditor_client) -> None:
    run, approval = a_run_with_a_decided_approval(a_secret_binding(admin_client))
    event = AuditEvent.objects.filter(run_id=run.id).first()
    for url in [
        "/admin/audit/auditevent/",
        f"/admin/audit/auditevent/{event.pk}/change/",
        "/admin/agents/run/",
        f"/admin/agents/run/{run.pk}/change/",
        "/admin/agents/approval/",
        f"/admin/agents/approval/{approval.pk}/change/",
    ]:
        response = auditor_client.get(url)
        assert response.status_code == 200, url
        assert 'name="_save"' not in response.content.decode(), url


def test_the_auditor_cannot_add_change_or_delete_anything_they_can_see(admin_client, auditor_client) -> None:
    run, approval = a_run_with_a_decided_approval(a_secret_binding(admin_client))
    event = AuditEvent.objects.filter(run_id=run.id).first()
    for base, pk in [("audit/auditevent", event.pk), ("agents/run", run.pk), ("agents/approval", approval.pk)]:
        assert auditor_client.get(f"/admin/{base}/add/").status_code == 403, base
        assert auditor_client.get(f"/admin/{base}/{pk}/delete/").status_code == 403, base
        assert auditor_client.post(f"/admin/{base}/{pk}/delete/", {"post": "yes"}).status_code == 403, base
        assert auditor_client.post(f"/admin/{base}/{pk}/change/", {}).status_code == 403, base
    assert Run.objects.filter(pk=run.pk).exists() and AuditEvent.objects.filter(pk=event.pk).exists()


def test_the_auditor_cannot_approve_or_reject_a_pending_call(admin_client, auditor_client) -> None:
    _run, approval = a_run_with_a_decided_approval(a_secret_binding(admin_client))
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.PENDING, decided_by="", reason="")
    page = auditor_client.get("/admin/agents/approval/").content.decode()
    assert 'value="approve"' not in page and 'value="reject"' not in page
    for action in ("approve", "reject"):
        auditor_client.post("/admin/agents/approval/", {"action": action, "_selected_action": [str(approval.pk)]})
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and approval.decided_by == ""


@pytest.mark.parametrize(
    "model",
    ["mcpregistry/mcpserver", "mcpregistry/mcptool", "agents/deterministicrule", "agents/agent", "agents/apikey"],
)
def test_the_auditor_cannot_reach_bindings_tools_contracts_rules_agents_or_api_keys(
    admin_client, auditor_client, model
) -> None:
    server = a_secret_binding(admin_client)
    tool = server.tools.get()
    ToolContract.objects.create(tool=tool)
    agent = Agent.objects.create(slug="other", name="other")
    rule = DeterministicRule.objects.create(agent=agent, name="r", server=server, tool_name="lookup")
    key = ApiKey.objects.create(name="k", prefix="apk_k", digest="1" * 64)
    pk = {
        "mcpregistry/mcpserver": server.pk,
        "mcpregistry/mcptool": tool.pk,
        "agents/deterministicrule": rule.pk,
        "agents/agent": agent.pk,
        "agents/apikey": key.pk,
    }[model]
    for url in [
        f"/admin/{model}/",
        f"/admin/{model}/add/",
        f"/admin/{model}/{pk}/change/",
        f"/admin/{model}/{pk}/delete/",
    ]:
        response = auditor_client.get(url)
        assert response.status_code == 403, url
        assert DEMO_SECRET not in response.content.decode()
    response = auditor_client.post(f"/admin/{model}/{pk}/delete/", {"post": "yes"})
    assert response.status_code == 403


def test_the_admin_index_offers_the_auditor_only_the_audit_record_runs_and_approvals(auditor_client) -> None:
    page = auditor_client.get("/admin/").content.decode()
    for reachable in ("/admin/audit/auditevent/", "/admin/agents/run/", "/admin/agents/approval/"):
        assert reachable in page
    for hidden in (
        "mcpserver",
        "mcptool",
        "deterministicrule",
        "/admin/agents/agent/",
        "apikey",
        "auth/user",
        "auth/group",
    ):
        assert hidden not in page
    for hidden in ("/admin/auth/user/", "/admin/auth/group/"):
        assert auditor_client.get(hidden).status_code == 403


def test_no_page_the_auditor_can_reach_shows_a_binding_secret(admin_client, auditor_client) -> None:
    server = a_secret_binding(admin_client)
    run, approval = a_run_with_a_decided_approval(server)
    assert DEMO_SECRET in McpServer.objects.get(pk=server.pk).env["INTERNAL_API_KEY"]  # stored (encrypted)
    urls = [
        "/admin/",
        "/admin/audit/",
        "/admin/agents/",
        "/admin/audit/auditevent/",
        "/admin/audit/auditevent/?mcp_id=vault",
        "/admin/audit/auditevent/metrics/",
        "/admin/agents/run/",
        f"/admin/agents/run/{run.pk}/change/",
        f"/admin/agents/run/{run.pk}/history/",
        "/admin/agents/approval/",
        f"/admin/agents/approval/{approval.pk}/change/",
    ]
    urls += [f"/admin/audit/auditevent/{pk}/change/" for pk in AuditEvent.objects.values_list("pk", flat=True)]
    for url in urls:
        response = auditor_client.get(url)
        assert response.status_code == 200, url
        assert DEMO_SECRET not in response.content.decode(), url
    assert auditor_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").status_code == 403


def test_an_outsider_on_the_staff_sees_no_audit_record(outsider_client) -> None:
    assert outsider_client.get("/admin/audit/auditevent/").status_code == 403
    assert outsider_client.get("/admin/audit/auditevent/metrics/").status_code == 403
    assert outsider_client.get("/admin/agents/run/").status_code == 403


# ---- the audit list and the run trace -------------------------------------------------------------------------


def test_the_audit_list_filters_by_agent_server_tool_source_outcome_reason_caller_period_and_run(
    admin_client, auditor_client
) -> None:
    run, _approval = a_run_with_a_decided_approval(a_secret_binding(admin_client))
    audit_event_record(source="deterministic", mcp_id="other", tool="ping", actor="local", attempt=1, latency_ms=3)
    listed = lambda query: auditor_client.get(f"/admin/audit/auditevent/?{query}").context["cl"].result_list  # noqa: E731
    [by_run] = listed(f"run={run.pk}")
    assert by_run.run_id == run.pk
    assert [e.tool for e in listed("agent=ledger")] == ["lookup"]
    assert [e.tool for e in listed("mcp_id=other")] == ["ping"]
    assert [e.tool for e in listed("tool=lookup&source=agent&ok=false&reason=approval:rejected")] == ["lookup"]
    assert [e.tool for e in listed("actor=caller")] == ["lookup"]  # the run's API key, by name
    assert {e.action for e in listed("source=admin")} == {"config.mcp_server.create", "config.user.create"}
    today = timezone.localdate()
    assert len(listed(f"since={today}&until={today}")) == AuditEvent.objects.count()
    assert list(listed(f"until={today - timedelta(days=1)}")) == []
    audit_event_record(source="admin", action="config.request_category.create", mcp_id="local", tool="IT지원팀")
    page = auditor_client.get("/admin/audit/auditevent/")
    tools = next(spec for spec in page.context["cl"].filter_specs if spec.parameter_name == "tool")
    called = set(
        AuditEvent.objects.exclude(action__startswith="config.").exclude(tool="").values_list("tool", flat=True)
    )
    assert {value for value, _label in tools.lookup_choices} == called == {"lookup", "ping"}  # no department


def test_a_bad_filter_value_in_the_list_shows_nothing_and_says_why(auditor_client) -> None:
    response = auditor_client.get("/admin/audit/auditevent/?run=not-a-run&since=yesterday", follow=True)
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    text = response.content.decode()
    assert "not a run id" in text


def test_each_event_links_to_its_run(admin_client, auditor_client) -> None:
    run, _approval = a_run_with_a_decided_approval(a_secret_binding(admin_client))
    page = auditor_client.get("/admin/audit/auditevent/").content.decode()
    assert f'href="/admin/agents/run/{run.pk}/change/"' in page


def test_a_runs_page_shows_its_whole_trace_in_order_with_audited_outcomes(demo_server, auditor_client) -> None:
    agent = make_agent(
        slug="react",
        servers=[demo_server],
        provider="scripted",
        script=[
            {"tool_calls": [{"name": "list_team_members", "args": {"team": "클라우드운영팀"}}]},
            {"content": "팀원 목록: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="김하늘 님은 어느 팀 소속인가요?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    page = auditor_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    labels = [
        "rule decision",
        "deterministic call",
        "system message",
        "user query",
        "model turn 1",  # numbered
        "tool call",
        "model turn 2",
        "answer",
    ]
    positions = [page.index(f">{label}<") for label in labels]
    assert positions == sorted(positions)
    assert "직원 소속 조회" in page and "클라우드운영팀" in page  # Korean as itself, not \\uXXXX
    assert "\\uc9c1" not in page
    assert page.count("1 attempt(s)") >= 2  # the deterministic call and the model's call, from the audit
    assert f"/admin/audit/auditevent/?run={run.pk}" in page
    assert DEMO_SECRET not in page


def test_a_runs_page_shows_approvals_and_their_decisions(admin_client, auditor_client) -> None:
    run, _approval = a_run_with_a_decided_approval(a_secret_binding(admin_client))
    page = auditor_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert ">approval requested<" in page
    assert "rejected" in page and "by boss (admin)" in page and "위험한 변경" in page
    assert "failed: rejected by a person (approval:rejected)" in page  # the reason in words, with its code
    assert page.index(">approval requested<") < page.index(">answer<")
    korean = auditor_client.get(f"/admin/agents/run/{run.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "사람이 거부함 (approval:rejected)" in korean


def test_the_run_admin_is_still_read_only_for_an_admin(admin_client) -> None:
    server = a_secret_binding(admin_client)
    run, _approval = a_run_with_a_decided_approval(server)
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert 'name="_save"' not in page
    assert admin_client.post(f"/admin/agents/run/{run.pk}/change/", {}).status_code == 403
