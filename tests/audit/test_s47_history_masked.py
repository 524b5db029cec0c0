"""A History page shows what the audit record holds of an object's changes, masked again with the secrets the
configuration binds now: a value recorded in clear (nothing bound it then) and bound as a server's secret after
is masked there as on every other page that shows a record.

The eval set's page is the case: a case's question quoted a token (a user's, pasted into a test question); the
case was rewritten, and only then was the token bound as a server's secret. The set's History names the case's
row by its name as recorded then ("eval case k0: 토큰 …"), which held it in clear.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents.models import Agent
from audit.masking import MASK, clear_registered_secrets, registered_secrets
from audit.models import AuditEvent
from audit.services import audit_event_record
from evals.models import EvalCase
from evals.services import eval_case_create, eval_case_delete, eval_case_update, eval_set_create
from mcpregistry.services import mcp_server_create

pytestmark = pytest.mark.django_db

TOKEN = "Vx8qL2nRt5KpW9zJm3"


def bind_later() -> None:
    """The token bound as a server's secret, through the service an admin's page calls; then a fresh web process,
    which has registered nothing."""
    mcp_server_create(
        actor="admin",
        via="tests",
        data={"mcp_id": "vault", "name": "vault", "command": sys.executable, "args": ["-V"], "env": {"T": TOKEN}},
    )
    clear_registered_secrets()
    assert TOKEN not in registered_secrets()


def a_set_whose_case_quoted_it() -> Any:
    agent = Agent.objects.create(slug="helper", name="비서")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "leave-questions", "agent": agent})
    case = add_case(eval_set, "k0", f"토큰 {TOKEN} 확인")
    eval_case_update(case=case, actor="test", via="tests", data={"query": "연차 며칠 남았어?"})
    return eval_set


def add_case(eval_set: Any, key: str, query: str) -> EvalCase:
    return eval_case_create(
        actor="test", via="tests", data={"eval_set": eval_set, "key": key, "query": query, "case_type": "no_tool"}
    )


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_a_sets_history_masks_a_token_its_case_quoted_before_it_was_bound(admin_client: Client) -> None:
    eval_set = a_set_whose_case_quoted_it()
    recorded = AuditEvent.objects.filter(action="config.eval_case.create").get()
    assert TOKEN in str(recorded.result)  # recorded in clear: nothing bound it then
    bind_later()

    text = page(admin_client, f"/admin/evals/evalset/{eval_set.pk}/history/")

    assert TOKEN not in text
    assert f"k0: 토큰 {MASK} 확인" in text  # the row named as before, its Korean intact, the token masked


def test_a_deleted_cases_row_is_masked_too(admin_client: Client) -> None:
    eval_set = a_set_whose_case_quoted_it()
    eval_case_delete(case=EvalCase.objects.get(key="k0"), actor="test", via="tests")
    bind_later()

    text = page(admin_client, f"/admin/evals/evalset/{eval_set.pk}/history/")

    assert TOKEN not in text
    assert "연차 며칠 남았어?" in text  # the case's later name, as recorded


def test_the_secrets_are_read_once_per_page_not_per_row(admin_client: Client) -> None:
    """A History page of more changes reads the configuration's secrets no more often."""
    eval_set = a_set_whose_case_quoted_it()
    bind_later()
    url = f"/admin/evals/evalset/{eval_set.pk}/history/"
    with CaptureQueriesContext(connection) as few:
        assert TOKEN not in page(admin_client, url)
    for i in range(1, 4):
        add_case(eval_set, f"k{i}", f"질문 {i}")
    with CaptureQueriesContext(connection) as more:
        text = page(admin_client, url)
    assert TOKEN not in text and "k3: 질문 3" in text
    assert len(more) == len(few), (len(few), len(more))


def test_a_records_history_masks_a_server_id_bound_since(admin_client: Client) -> None:
    """A record's History (``ReadOnlyAdminMixin``: an audit event's, a run's) has no rows, but its title and
    breadcrumbs name the record: an audit event of a call to a server whose id is the token (bound since) is
    named with it masked, as on its own page."""
    event = audit_event_record(source="agent", mcp_id=TOKEN, tool="echo", args={"text": "안녕"})
    bind_later()

    text = page(admin_client, f"/admin/audit/auditevent/{event.pk}/history/")

    assert TOKEN not in text
    assert f"{MASK}.echo" in text
