"""Cancelling an eval run (``evals.services.eval_run_cancel``), through every door: the service, the API's
``POST /api/v1/evals/runs/{id}/cancel``, the admin's Cancel button and list action, and ``run_eval`` interrupted.

A cancelled eval run's unfinished runs are cancelled (pending approvals expire, budget reservations are given
back), its cases not yet scored end unscored (``eval:cancelled``) and are never submitted, its scored cases keep
their scores, it never passes, and one ``eval_run.cancel`` audit event records it.
"""

from __future__ import annotations

import io
import types
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agents.budgets import budget_create
from agents.execution import run_execute
from agents.models import Agent, Approval, BudgetUsage, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from evals import services as eval_services
from evals.management.commands import run_eval as run_eval_command
from evals.models import EvalCaseResult, EvalRun, EvalSet
from evals.services import (
    CANCELLED_CHECK,
    eval_run_cancel,
    eval_run_refresh,
    eval_run_start,
    eval_runs_refresh_open,
    eval_set_apply,
)
from tests.conftest import logged_in
from tests.evals.conftest import bind_stock_server, company_assistant, import_seed_set, scripted_agent

pytestmark = pytest.mark.django_db

NOTICE = {"team": "ops", "text": "점검 공지"}


# ---- the service: cases parked on approval, queued, scored and never submitted --------------------------------


def notifier_eval(settings: Any, *, window: int = 2) -> EvalRun:
    """Four cases against an agent whose model sends a notice (``send_notice``, a write), with an agent budget that
    reserves 20,000 tokens a run; ``window`` of them submitted."""
    server = bind_stock_server(settings)
    script = [{"tool_calls": [{"name": "send_notice", "args": NOTICE}]}, {"content": "공지를 보냈습니다"}]
    agent = scripted_agent(slug="notifier", server=server, script=script)
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1_000_000, "run_reservation_tokens": 20_000},
    )
    cases = [{"key": f"c{i}", "query": f"공지 {i}", "expected_tools": ["send_notice"]} for i in range(4)]
    eval_set = eval_set_apply(document={"name": "notices", "cases": cases}, actor="test", via="tests").eval_set
    return eval_run_start(eval_set=eval_set, agent=agent, actor="test", window=window)


def result_of(eval_run: EvalRun, key: str) -> EvalCaseResult:
    return EvalCaseResult.objects.select_related("run").get(eval_run=eval_run, case__key=key)


def park_on_approval(run: Run) -> None:
    """Execute ``run`` until its write waits for a person. An eval's own runs never ask (their writes are held
    back, ``eval:write_blocked``), but a run that does park, holding its approval and its budget reservation, must
    still be ended with its eval: it is executed here as live traffic, where the write asks for approval."""
    Run.objects.filter(pk=run.pk).update(purpose=Run.Purpose.LIVE)
    run_execute(run_id=str(run.pk))
    Run.objects.filter(pk=run.pk).update(purpose=Run.Purpose.EVAL)
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert Approval.objects.get(run=run).status == Approval.Status.PENDING


def reserved_tokens() -> int:
    return sum(BudgetUsage.objects.values_list("reserved_tokens", flat=True))


def test_cancelling_ends_parked_and_queued_runs_keeps_scores_and_never_submits_the_rest(settings: Any) -> None:
    eval_run = notifier_eval(settings)
    first = result_of(eval_run, "c0").run
    assert first is not None
    run_execute(run_id=str(first.pk))  # an eval run: the write is held back, the run succeeds
    eval_run = eval_run_refresh(eval_run=eval_run)  # c0 scored; c2 submitted in its place
    scored = result_of(eval_run, "c0")
    assert scored.scored
    parked, queued = result_of(eval_run, "c1").run, result_of(eval_run, "c2").run
    assert parked is not None and queued is not None and result_of(eval_run, "c3").run is None
    park_on_approval(parked)
    assert reserved_tokens() == 40_000  # the parked run's and the queued run's

    eval_run = eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")

    assert eval_run.status == EvalRun.Status.CANCELLED and eval_run.finished_at is not None
    assert eval_run.passed is False and eval_run.failed_thresholds == []
    assert eval_run.done == 1 and eval_run.summary["cases"] == 1 and eval_run.summary["cancelled"] == 3
    assert result_of(eval_run, "c0").scores == scored.scores  # kept as scored
    for key in ("c1", "c2", "c3"):
        result = result_of(eval_run, key)
        assert result.cancelled and not result.passed
        assert result.scores["failed_checks"] == [CANCELLED_CHECK]
    parked.refresh_from_db()
    queued.refresh_from_db()
    assert (parked.status, queued.status) == (Run.Status.CANCELLED, Run.Status.CANCELLED)
    assert Approval.objects.get(run=parked).status == Approval.Status.EXPIRED
    assert reserved_tokens() == 0  # given back
    [event] = AuditEvent.objects.filter(action="eval_run.cancel")
    assert (event.source, event.actor) == ("admin", "admin:kim")
    assert event.args["runs_cancelled"] == 2 and event.args["cases_cancelled"] == 3
    assert sorted(event.args["run_ids"]) == sorted([str(parked.pk), str(queued.pk)])
    assert event.result["model"] == "evals.evalrun" and event.result["id"] == str(eval_run.pk)
    cancels = AuditEvent.objects.filter(action="run.cancel", run_id__in=[parked.pk, queued.pk])
    assert sorted(cancels.values_list("source", flat=True)) == ["eval", "eval"]

    # The refreshes that come after (a worker's background pass, the page, the API) submit nothing more.
    runs_before = Run.objects.count()
    assert eval_runs_refresh_open() == 0
    eval_run = eval_run_refresh(eval_run=eval_run, window=10)
    assert Run.objects.count() == runs_before and result_of(eval_run, "c3").run is None
    assert eval_run.status == EvalRun.Status.CANCELLED and eval_run.done == 1


def test_a_scored_case_whose_run_still_waits_for_approval_keeps_its_score_and_its_run_is_cancelled(
    settings: Any,
) -> None:
    eval_run = notifier_eval(settings, window=1)
    parked = result_of(eval_run, "c0").run
    assert parked is not None
    park_on_approval(parked)
    eval_run = eval_run_refresh(eval_run=eval_run)  # an eval never waits for a person: scored (failed) as it is
    scored = result_of(eval_run, "c0")
    assert scored.scored and not scored.passed

    eval_run = eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")

    assert result_of(eval_run, "c0").scores == scored.scores and not result_of(eval_run, "c0").cancelled
    parked.refresh_from_db()
    assert parked.status == Run.Status.CANCELLED
    assert Approval.objects.get(run=parked).status == Approval.Status.EXPIRED
    assert reserved_tokens() == 0


def test_a_refresh_that_read_a_case_before_the_cancellation_does_not_score_it_after(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    eval_run = notifier_eval(settings)
    finished = result_of(eval_run, "c0").run
    assert finished is not None
    run_execute(run_id=str(finished.pk))
    read_calls = eval_services.run_tool_calls_for_scoring

    def cancelled_meanwhile(run_id: Any) -> Any:  # the cancellation comes between reading the case and scoring it
        eval_run_cancel(eval_run=EvalRun.objects.get(pk=eval_run.pk), actor="admin:kim", via="admin")
        return read_calls(run_id)

    monkeypatch.setattr(eval_services, "run_tool_calls_for_scoring", cancelled_meanwhile)
    eval_run = eval_run_refresh(eval_run=eval_run)

    assert eval_run.status == EvalRun.Status.CANCELLED and eval_run.done == 0
    assert result_of(eval_run, "c0").cancelled
    assert result_of(eval_run, "c2").run is None and result_of(eval_run, "c3").run is None


def test_cancelling_a_finished_or_cancelled_eval_run_is_refused(settings: Any) -> None:
    eval_run = notifier_eval(settings)
    eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")
    with pytest.raises(ApplicationError) as refused:
        eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")
    assert (refused.value.code, refused.value.status) == ("eval_run_finished", 409)
    EvalRun.objects.filter(pk=eval_run.pk).update(status=EvalRun.Status.FINISHED)
    with pytest.raises(ApplicationError):
        eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")
    assert AuditEvent.objects.filter(action="eval_run.cancel").count() == 1


def test_a_case_run_that_keeps_changing_state_refuses_the_whole_cancellation_not_only_its_case(settings: Any) -> None:
    """``run_cancel`` gives up on a run whose row changes under each of its compare-and-swaps (``run_busy``): a
    live worker renewing its lease at those moments. Marking that case cancelled would leave its run going on, its
    eval run told cancelled: the cancellation is refused (409) and nothing of it is kept."""
    eval_run = notifier_eval(settings)
    busy = result_of(eval_run, "c0").run
    assert busy is not None
    lease = timezone.now() + timedelta(minutes=5)
    Run.objects.filter(pk=busy.pk).update(
        status=Run.Status.RUNNING, lease_expires_at=lease, pass_started_at=timezone.now()
    )
    renewals = []

    def worker_renews_its_lease(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith('UPDATE "agents_run"') and '"error_code"' in sql:  # run_cancel's compare-and-swap
            renewals.append(sql)
            execute(
                'UPDATE "agents_run" SET "lease_expires_at" = %s WHERE "id" = %s',
                [lease + timedelta(seconds=len(renewals)), busy.pk.hex],
                False,
                context,
            )
        return execute(sql, params, many, context)

    with pytest.raises(ApplicationError) as refused, connection.execute_wrapper(worker_renews_its_lease):
        eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")

    assert (refused.value.code, refused.value.status) == ("run_busy", 409) and renewals
    eval_run.refresh_from_db()
    assert eval_run.status == EvalRun.Status.RUNNING
    assert not EvalCaseResult.objects.filter(eval_run=eval_run, scored=True).exists()
    assert set(Run.objects.filter(purpose=Run.Purpose.EVAL).values_list("status", flat=True)) == {
        Run.Status.RUNNING,
        Run.Status.QUEUED,
    }
    assert not AuditEvent.objects.filter(action__in=["eval_run.cancel", "run.cancel"]).exists()
    # Once the worker lets go, the same cancellation goes through.
    assert eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin").status == EvalRun.Status.CANCELLED


# ---- the API ---------------------------------------------------------------------------------------------------


def demo_eval_run() -> EvalRun:
    """The seed's set against the demo agent (its real demo server), its first case's run executed and scored."""
    agent = company_assistant()
    eval_run = eval_run_start(eval_set=import_seed_set(), agent=agent, actor="test", window=2)
    first = EvalCaseResult.objects.filter(eval_run=eval_run).order_by("pk").first()
    assert first is not None and first.run_id is not None
    run_execute(run_id=str(first.run_id))
    return eval_run_refresh(eval_run=eval_run)


def key_client(*, agents: list[Agent] | None = None, admin: bool = True) -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name=f"ops-{uuid.uuid4().hex[:6]}", admin=admin,
                               agents=agents or [])  # fmt: skip
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.slow
def test_the_api_cancels_an_eval_run_and_answers_it_as_get_does() -> None:
    eval_run = demo_eval_run()
    client = key_client()
    url = f"/api/v1/evals/runs/{eval_run.pk}/cancel"

    response = client.post(url, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled" and body["passed"] is False
    assert body["progress"] == {"done": 1, "total": 5} and body["summary"]["cancelled"] == 4
    cases = body["cases"]
    assert [c["cancelled"] for c in cases] == [False, True, True, True, True]
    assert cases[0]["scored"] and cases[0]["passed"] is not None
    assert all(c["scored"] is False and c["passed"] is None for c in cases[1:])
    assert cases[1]["scores"]["failed_checks"] == [CANCELLED_CHECK]
    assert client.get(f"/api/v1/evals/runs/{eval_run.pk}").json()["cases"] == cases
    [event] = AuditEvent.objects.filter(action="eval_run.cancel")
    assert event.source == "api" and event.actor.startswith("api_key:") and event.args["runs_cancelled"] == 2

    again = client.post(url, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "eval_run_finished"


@pytest.mark.slow
def test_the_api_answers_404_for_an_eval_run_it_may_not_see_and_403_to_a_callers_key() -> None:
    eval_run = demo_eval_run()
    other = Agent.objects.create(slug="other", name="other")
    assert key_client().post(f"/api/v1/evals/runs/{uuid.uuid4()}/cancel").status_code == 404
    assert key_client().post("/api/v1/evals/runs/not-a-uuid/cancel").status_code == 404
    assert key_client(agents=[other]).post(f"/api/v1/evals/runs/{eval_run.pk}/cancel").status_code == 404
    assert key_client(admin=False).post(f"/api/v1/evals/runs/{eval_run.pk}/cancel").status_code == 403
    assert APIClient().post(f"/api/v1/evals/runs/{eval_run.pk}/cancel").status_code == 401
    assert EvalRun.objects.get(pk=eval_run.pk).status == EvalRun.Status.RUNNING
    assert "/api/v1/evals/runs/{run_id}/cancel" not in Client().get("/api/v1/schema/?format=json").json()["paths"]


# ---- the admin ---------------------------------------------------------------------------------------------------


def staff_with(*codenames: str) -> Client:
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:6]}", "", "pw-x-123456", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="evals", codename__in=codenames))
    return logged_in(get_user_model().objects.get(pk=user.pk))


def test_the_cancel_button_asks_to_confirm_then_cancels_and_the_page_shows_it(admin_client: Client) -> None:
    eval_run = demo_eval_run()
    page_url = reverse("admin:evals_evalrun_change", args=[eval_run.pk])
    cancel_url = reverse("admin:evals_evalrun_cancel", args=[eval_run.pk])
    assert cancel_url in admin_client.get(page_url).content.decode()

    confirmation = admin_client.get(cancel_url)
    assert confirmation.status_code == 200 and 'name="post" value="yes"' in confirmation.content.decode()
    assert admin_client.post(cancel_url).status_code == 200  # a POST without the confirmation asks again
    assert EvalRun.objects.get(pk=eval_run.pk).status == EvalRun.Status.RUNNING

    done = admin_client.post(cancel_url, {"post": "yes"})

    assert done.status_code == 302 and done["Location"] == page_url
    assert EvalRun.objects.get(pk=eval_run.pk).status == EvalRun.Status.CANCELLED
    page = admin_client.get(page_url).content.decode()
    assert "4 cases were not scored" in page and page.count("its eval run was cancelled") == 4
    assert cancel_url not in page and 'http-equiv="refresh"' not in page
    [event] = AuditEvent.objects.filter(action="eval_run.cancel")
    assert event.source == "admin" and event.actor.startswith("admin:")
    assert admin_client.post(cancel_url, {"post": "yes"}).status_code == 302  # already cancelled: told, not a 500
    assert AuditEvent.objects.filter(action="eval_run.cancel").count() == 1


def test_the_list_action_asks_to_confirm_then_cancels(admin_client: Client) -> None:
    eval_run = demo_eval_run()
    url = reverse("admin:evals_evalrun_changelist")
    chosen = {"action": "cancel_selected", "_selected_action": [eval_run.pk]}

    confirmation = admin_client.post(url, chosen)
    assert confirmation.status_code == 200 and "Yes, cancel" in confirmation.content.decode()
    assert EvalRun.objects.get(pk=eval_run.pk).status == EvalRun.Status.RUNNING

    done = admin_client.post(url, {**chosen, "post": "yes"})

    assert done.status_code == 302
    assert EvalRun.objects.get(pk=eval_run.pk).status == EvalRun.Status.CANCELLED
    assert "cancelled" in admin_client.get(url).content.decode()


@pytest.mark.slow
def test_only_who_may_change_eval_runs_may_cancel_one_and_only_by_post_with_its_token() -> None:
    eval_run = demo_eval_run()
    cancel_url = reverse("admin:evals_evalrun_cancel", args=[eval_run.pk])
    viewer = staff_with("view_evalrun")
    assert cancel_url not in viewer.get(reverse("admin:evals_evalrun_change", args=[eval_run.pk])).content.decode()
    assert viewer.get(cancel_url).status_code == 403
    assert viewer.post(cancel_url, {"post": "yes"}).status_code == 403
    listed = {"action": "cancel_selected", "_selected_action": [eval_run.pk], "post": "yes"}
    assert viewer.post(reverse("admin:evals_evalrun_changelist"), listed).status_code == 403
    canceller = staff_with("view_evalrun", "change_evalrun")
    canceller.handler.enforce_csrf_checks = True  # type: ignore[attr-defined]
    assert canceller.post(cancel_url, {"post": "yes"}).status_code == 403  # no CSRF token
    assert EvalRun.objects.get(pk=eval_run.pk).status == EvalRun.Status.RUNNING


# ---- run_eval interrupted ------------------------------------------------------------------------------------


def run_eval_waiting(monkeypatch: pytest.MonkeyPatch, sleep: Any) -> tuple[int, str]:
    """``manage.py run_eval company-assistant seed-001-tools`` waiting for workers (not ``--inline``), its wait
    replaced by ``sleep``; returns its exit status and stderr."""
    monkeypatch.setattr(run_eval_command, "time", types.SimpleNamespace(monotonic=run_eval_command.time.monotonic,
                                                                        sleep=sleep))  # fmt: skip
    err = io.StringIO()
    try:
        call_command("run_eval", "company-assistant", "seed-001-tools", "--workers", "2", stdout=io.StringIO(),
                     stderr=err)  # fmt: skip
    except CommandError as exc:
        return exc.returncode, err.getvalue() + str(exc)
    return 0, err.getvalue()


def test_ctrl_c_while_run_eval_waits_cancels_the_eval_run_and_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    company_assistant()
    import_seed_set()

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    status, err = run_eval_waiting(monkeypatch, interrupted)

    eval_run = EvalRun.objects.get()
    assert status == run_eval_command.INTERRUPTED_EXIT
    assert f"eval run {eval_run.pk} cancelled" in err and "5 not scored" in err
    assert eval_run.status == EvalRun.Status.CANCELLED
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.CANCELLED}  # the two submitted
    [event] = AuditEvent.objects.filter(action="eval_run.cancel")
    assert event.actor == "system:run_eval" and event.result["via"] == "run_eval" and event.args["runs_cancelled"] == 2


def test_run_eval_ends_non_zero_when_its_eval_run_is_cancelled_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    company_assistant()
    import_seed_set()

    def cancelled_from_the_admin(_seconds: float) -> None:
        eval_run_cancel(eval_run=EvalRun.objects.get(), actor="admin:kim", via="admin")

    status, err = run_eval_waiting(monkeypatch, cancelled_from_the_admin)

    assert status == 1 and "was cancelled" in err
    assert EvalSet.objects.get().runs.get().status == EvalRun.Status.CANCELLED
