"""An approved write is checked against its exact arguments when the run resumes.

Defect held here: a resumed run replays the model's parked call from its stored, masked conversation; the gate
checked the contract against those masked arguments (``token=***`` against a pattern, ``"***"`` where an int
``passcode`` was), refused the call the person had approved (``args:pattern:text``, ``args:type:passcode``), and the
approval ended ``expired`` with the write never sent. The arguments are still checked before anyone is asked, and an
approval whose exact arguments do not match its hash is still refused."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from agent_platform.celery import app as celery_app
from agents.execution import run_execute
from agents.models import Agent, Approval, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db(transaction=False)

TOKEN_PATTERN = r"^token=[a-z0-9]{16}$"


@pytest.fixture(autouse=True)
def eager_tasks() -> Iterator[None]:
    """Dispatch runs in-process (a resumed run is executed right here, as a worker would)."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    return tmp_path / "notes.txt"


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def a_run(*, mcp_id: str, module: str, notes: Path, script: list[dict[str, Any]]) -> tuple[Run, APIClient]:
    """A run of a scripted agent bound to the fixture server ``module``, whose caller may approve its writes."""
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", module],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},  # type: ignore[misc]
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    key, raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(slug=mcp_id, servers=[server], provider="scripted", script=script, with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(caller_approves_model_writes=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return Run.objects.create(agent=agent, api_key=key, query="저장"), client


def a_note_with_a_token_pattern(notes: Path, text: str) -> tuple[Run, APIClient]:
    run, client = a_run(
        mcp_id="notes-pat",
        module="tests.mcp_fixtures.probe_server",
        notes=notes,
        script=[{"tool_calls": [{"name": "append_note", "args": {"text": text}}]}, {"content": "{last_tool_result}"}],
    )
    contract = ToolContract.objects.get(tool__server__mcp_id="notes-pat", tool__name="append_note")
    contract.args = {**contract.args, "text": {**contract.args.get("text", {}), "pattern": TOKEN_PATTERN}}
    contract.save()
    return run, client


def park(run: Run) -> Approval:
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL, (run.status, run.answer, run.error_message)
    return run.approvals.get()


def approve(client: APIClient, run: Run, approval: Approval, capture: Any) -> None:
    with capture(execute=True):
        response = client.post(f"/api/v1/runs/{run.id}/approvals/{approval.id}", {"decision": "approve"}, format="json")
    assert response.status_code == 200, response.content
    run.refresh_from_db()


@pytest.fixture(autouse=True)
def close_sessions() -> Iterator[None]:
    yield
    for mcp_id in ("notes-pat", "doors"):
        get_default_pool().close(mcp_id)


@pytest.mark.slow
def test_an_approved_write_whose_masked_text_fails_its_pattern_is_made_with_the_exact_text(
    db: None, notes: Path, django_capture_on_commit_callbacks: Any
) -> None:
    run, client = a_note_with_a_token_pattern(notes, "token=abcd1234efgh5678")
    approval = park(run)
    assert approval.args == {"text": "token=***"}  # what the stored conversation replays
    approve(client, run, approval, django_capture_on_commit_callbacks)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "args:pattern" not in run.answer and "notes: 1" in run.answer
    assert [line.split("\t")[0] for line in lines(notes)] == ["token=abcd1234efgh5678"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXECUTED


@pytest.mark.slow
def test_an_approved_write_whose_int_passcode_is_masked_is_made_with_the_exact_number(
    db: None, notes: Path, django_capture_on_commit_callbacks: Any
) -> None:
    run, client = a_run(
        mcp_id="doors",
        module="tests.mcp_fixtures.passcode_server",
        notes=notes,
        script=[
            {"tool_calls": [{"name": "unlock_door", "args": {"door": "정문", "passcode": 4821}}]},
            {"content": "{last_tool_result}"},
        ],
    )
    contract = ToolContract.objects.get(tool__server__mcp_id="doors", tool__name="unlock_door")
    assert (contract.risk, contract.args["passcode"]["type"]) == (ToolContract.Risk.WRITE, "int")
    approval = park(run)
    assert approval.args == {"door": "정문", "passcode": "***"}
    approve(client, run, approval, django_capture_on_commit_callbacks)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "unlocked 정문" in run.answer
    assert lines(notes) == ["정문\t4821"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXECUTED


@pytest.mark.slow
def test_arguments_the_contract_refuses_are_refused_before_anyone_is_asked(db: None, notes: Path) -> None:
    # Masked as the approved text is ("token=***"), but the model's own text fails the pattern: no approval.
    run, _client = a_note_with_a_token_pattern(notes, "token=ABCD1234EFGH5678")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert not Approval.objects.filter(run=run).exists()
    assert lines(notes) == []


@pytest.mark.slow
def test_an_approval_whose_exact_arguments_do_not_match_its_hash_is_still_refused(
    db: None, notes: Path, django_capture_on_commit_callbacks: Any
) -> None:
    run, client = a_note_with_a_token_pattern(notes, "token=abcd1234efgh5678")
    approval = park(run)
    # Other exact arguments under the same masked form (and passing the pattern): not the ones the hash binds.
    approval.exact_args = {"text": "token=zzzz9999zzzz9999"}
    approval.save(update_fields=["exact_args"])
    approve(client, run, approval, django_capture_on_commit_callbacks)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert AuditEvent.objects.filter(run_id=run.id, reason="approval:mismatch").exists()
    assert lines(notes) == []
