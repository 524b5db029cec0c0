"""What an approval's admin pages show of its run (review defect: they showed the run's whole timeline, its answer,
tool calls and results, to a reviewer the Run admin refuses with a 403): the timeline and the link to the run's
page only to whoever may view runs; anyone else sees the call and its masked arguments alone, and is taken back to
the approval's page after deciding."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Approval, Run
from tests.agents.test_admin_runs import a_run, an_approval
from tests.conftest import logged_in
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db

SECRET_TRACE = ("기밀 조회 결과", "비밀 답변")


def an_answered_approval() -> Approval:
    run = a_run(
        status=Run.Status.AWAITING_APPROVAL,
        answer=SECRET_TRACE[1],
        messages=[
            {"type": "human", "content": "장부를 보여줘"},
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "args": {"q": "y"}}]},
            {"type": "tool", "content": SECRET_TRACE[0], "tool_call_id": "c1", "name": "lookup", "status": "success"},
            {"type": "ai", "content": SECRET_TRACE[1]},
        ],
    )
    approval: Approval = an_approval(run)
    return approval


def approval_pages(client: Any, approval: Approval) -> list[Any]:
    return [
        client.get(f"/admin/agents/approval/{approval.pk}/change/"),
        client.get(f"/admin/agents/approval/{approval.pk}/decide/approve/"),
        client.get(f"/admin/agents/approval/{approval.pk}/decide/reject/"),
    ]


def test_a_reviewer_who_may_not_view_runs_sees_the_call_but_not_the_runs_timeline() -> None:
    reviewer = staff("rita2", perms=("agents.view_approval", "agents.change_approval"))
    client = logged_in(reviewer)
    approval = an_answered_approval()
    assert client.get(f"/admin/agents/run/{approval.run_id}/change/").status_code == 403
    for response in approval_pages(client, approval):
        page = response.content.decode()
        assert response.status_code == 200
        assert "회의록 저장" in page  # the call's masked arguments
        assert not any(text in page for text in SECRET_TRACE), response.request["PATH_INFO"]
        assert 'class="step step-' not in page  # not a step of the timeline, not even its labels
        assert 'class="approval-trace"' not in page and 'href=""' not in page  # no empty heading, no dead link
        assert (response.context["timeline"], response.context["run_url"]) == (None, "")


def test_a_reviewer_who_may_view_runs_sees_the_runs_timeline_beside_the_call() -> None:
    client = logged_in(staff("vera", perms=("agents.view_approval", "agents.change_approval", "agents.view_run")))
    approval = an_answered_approval()
    change, *decide = approval_pages(client, approval)
    assert all(text in change.content.decode() for text in SECRET_TRACE)
    for response in (change, *decide):
        assert 'class="step step-tool' in response.content.decode()  # the decision pages show the steps' labels
        assert response.context["run_url"] == f"/admin/agents/run/{approval.run_id}/change/"


def test_a_decision_returns_to_the_approval_for_one_who_may_not_view_runs_and_to_the_run_otherwise() -> None:
    blind = logged_in(staff("rita3", perms=("agents.view_approval", "agents.change_approval")))
    seeing = logged_in(staff("vera2", perms=("agents.view_approval", "agents.change_approval", "agents.view_run")))
    for client, expected in ((blind, "approval"), (seeing, "run")):
        approval = an_answered_approval()
        response = client.post(f"/admin/agents/approval/{approval.pk}/decide/reject/", {"reason": "아니요"})
        target = approval.pk if expected == "approval" else approval.run_id
        assert (response.status_code, response["Location"]) == (302, f"/admin/agents/{expected}/{target}/change/")
