"""The link to a run's audit events, on the run's page and on an approval's page (review defect: it showed to a
reviewer, whom the audit list refuses, so she followed it to "Not allowed"): only whoever may view audit events
sees it, as the link to the run's page shows only to whoever may view runs."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Run
from tests.agents.test_admin_runs import a_run, an_approval
from tests.conftest import logged_in
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db

LINK_TEXT = "All audit events of this run"


def run_and_approval_pages(client: Any) -> tuple[Run, list[Any]]:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    approval = an_approval(run)
    pages = [
        client.get(f"/admin/agents/run/{run.pk}/change/"),
        client.get(f"/admin/agents/run/{run.pk}/timeline/"),  # the part the live page fetches again
        client.get(f"/admin/agents/approval/{approval.pk}/change/"),
    ]
    assert [page.status_code for page in pages] == [200, 200, 200]
    return run, pages


def test_a_reviewer_is_not_linked_to_the_audit_events_she_may_not_view() -> None:
    client = logged_in(staff("rita", groups=("reviewer",)))
    run, pages = run_and_approval_pages(client)
    assert client.get(f"/admin/audit/auditevent/?run={run.pk}").status_code == 403
    for page in pages:
        content = page.content.decode()
        assert LINK_TEXT not in content and "/admin/audit/" not in content, page.request["PATH_INFO"]
    approval_page = pages[-1].content.decode()
    assert "The run's page" in approval_page and " · " not in approval_page  # no separator left beside one link


def test_an_auditor_is_linked_to_the_runs_audit_events(auditor_client: Any) -> None:
    run, pages = run_and_approval_pages(auditor_client)
    link = f'href="/admin/audit/auditevent/?run={run.pk}"'
    assert auditor_client.get(f"/admin/audit/auditevent/?run={run.pk}").status_code == 200
    for page in pages:
        content = page.content.decode()
        assert LINK_TEXT in content and link in content, page.request["PATH_INFO"]


@pytest.mark.parametrize(
    ("language", "header", "title"),
    [
        ("en", "Agent platform administration", "Not allowed | Agent platform"),
        ("ko", "에이전트 플랫폼 관리", "허용되지 않음 | 에이전트 플랫폼"),
    ],
)
def test_the_not_allowed_page_wears_the_admin_sites_header(
    settings: Any, language: str, header: str, title: str
) -> None:
    client = logged_in(staff("rita", groups=("reviewer",)))
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = language
    refused = client.get("/admin/audit/auditevent/")
    page = refused.content.decode()
    assert refused.status_code == 403
    assert f'<div id="site-name"><a href="/admin/">{header}</a></div>' in page
    assert f"<title>{title}</title>" in page
    assert "Django" not in page  # not "Django administration" (in Korean "Django 관리"), nor its site admin


@pytest.mark.parametrize(
    ("language", "header", "title"),
    [
        ("en", "Agent platform administration", "Page not found | Agent platform"),
        ("ko", "에이전트 플랫폼 관리", "페이지를 찾을 수 없습니다 | 에이전트 플랫폼"),
    ],
)
def test_the_page_not_found_wears_the_admin_sites_header(settings: Any, language: str, header: str, title: str) -> None:
    client = logged_in(staff("rita", groups=("reviewer",)))
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = language
    missing = client.get("/no-such-page/")
    page = missing.content.decode()
    assert missing.status_code == 404
    assert f'<div id="site-name"><a href="/admin/">{header}</a></div>' in page
    assert f"<title>{title}</title>" in page
    assert "Django" not in page
