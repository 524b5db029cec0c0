"""A rule's approved write interrupted by its worker's death: the gate does not send it again and ends its approval
``outcome_unknown``, but the user was told what a failed read is told: "답변에 필요한 정보를 가져오지 못했습니다.
잠시 후 다시 시도해 주세요." (the run's only call), or "append_line: 지금은 정보를 가져올 수 없습니다." beside a read
that worked. For a transfer, "try again" invites a second real write. The user is now told the request may or may
not have been carried out, to check before asking again; a rejected or expired write is said not carried out.

The worker's death is the state a SIGKILLed worker leaves (the approval claimed, the run's lease lapsed), as a
reviewer found it with a real worker; the server is real (``tests/mcp_fixtures/side_effect_server``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.answers import all_calls_failed_text, tool_unavailable_text
from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, DeterministicRule, Run
from agents.services import api_key_create
from mcpregistry.models import ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import make_agent
from tests.mcpregistry.test_at_most_once import side_effect_server, taken_over_mid_call

pytestmark = pytest.mark.django_db

MCP_ID = "interrupted-rule-write"


@pytest.fixture
def side_file(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "side.txt"
    get_default_pool().close(MCP_ID)


def writer_agent(side_file: Path, *, with_read: bool) -> Any:
    server = side_effect_server(MCP_ID, side_file, mode="ok")
    agent = make_agent(slug="rule-writer", servers=[server], provider="offline", with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent,
        server=server,
        name="송금",
        order=1,
        tool_name="append_line",
        when={"any_keywords": ["송금"]},
        params={"text": "송금 1건"},
    )
    if with_read:
        ToolContract.objects.filter(tool__server=server, tool__name="record_read").update(risk="read")
        DeterministicRule.objects.create(
            agent=agent,
            server=server,
            name="조회",
            order=0,
            tool_name="record_read",
            when={"any_keywords": ["송금"]},
            params={"key": "잔액"},
        )
    return agent


def interrupted_after_approval(agent: Any) -> tuple[Run, Approval]:
    key, _raw = api_key_create(actor="test", via="tests", name="caller")
    run = Run.objects.create(agent=agent, api_key=key, query="송금해줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL, (run.status, run.error_code, run.error_message)
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    taken_over_mid_call(approval)
    run_execute(run_id=str(run.id))  # the redelivered task takes the run over
    run.refresh_from_db()
    approval.refresh_from_db()
    return run, approval


@pytest.mark.slow
def test_a_runs_only_write_interrupted_is_not_answered_try_again_later(side_file: Path) -> None:
    run, approval = interrupted_after_approval(writer_agent(side_file, with_read=False))

    assert approval.status == Approval.Status.OUTCOME_UNKNOWN and not side_file.exists()  # never sent again
    assert run.status == Run.Status.FAILED
    assert "다시 시도" not in run.error_message
    assert "반영되었는지 확인" in run.error_message


@pytest.mark.slow
def test_a_write_interrupted_beside_a_read_is_not_said_to_be_information_not_retrieved(side_file: Path) -> None:
    run, approval = interrupted_after_approval(writer_agent(side_file, with_read=True))

    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert "송금 1건" not in side_file.read_text(encoding="utf-8")  # the write never sent again (the read is there)
    assert run.status == Run.Status.SUCCEEDED
    [line] = [line for line in run.answer.splitlines() if line.startswith("append_line")]
    assert "가져올 수 없습니다" not in line and "반영되었는지 확인" in line


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ("approval:rejected", "approval was rejected"),
        ("approval:expired", "not approved in time"),
        ("timeout", "could not be retrieved right now"),
        ("tool:out_of_date", "must be updated by an administrator"),  # trying again cannot mend it
    ],
)
def test_a_failed_calls_line_says_what_became_of_it(error: str, said: str) -> None:
    assert said in tool_unavailable_text(tool="append_line", language="en", error=error)


def test_an_interrupted_write_among_failed_calls_is_what_the_run_says() -> None:
    text = all_calls_failed_text(language="en", codes=["timeout", "approval:outcome_unknown"])
    assert text.startswith("This request was interrupted and may or may not have been carried out.")


def test_a_run_whose_only_call_met_a_changed_tool_is_not_told_to_try_again() -> None:
    text = all_calls_failed_text(language="en", codes=["tool:out_of_date"])
    assert "try again" not in text and "updated by an administrator" in text
