"""Another binding's secret is masked in every process (defect: a run was masked with its own servers' secrets and
those this process happened to have used before: a tool answering with a token of a server the agent is not bound
to put it in the audit, the run and the answer, or not, depending on which worker took the run). A real stdio
server (``tests/mcp_fixtures/context_server.py``); only the model is scripted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from agents.config_cache import run_configuration_forget
from agents.execution import run_execute
from agents.models import Run
from audit.masking import clear_registered_secrets
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry.models import ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_create
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db]

SERVER = Path(__file__).resolve().parent.parent / "mcp_fixtures" / "context_server.py"
CRM_TOKEN = "Hx5Rt8Kq2Nw7Pz3Lm"


@pytest.mark.slow
def test_a_tool_answering_with_another_bindings_token_is_masked_in_a_fresh_worker() -> None:
    echo = mcp_server_create(
        actor="admin",
        via="tests",
        data={"mcp_id": "ctx", "name": "ctx", "command": sys.executable, "args": [str(SERVER)], "timeout_s": 20},
    )
    # Bound to no agent of this run, never started in this process.
    mcp_server_create(
        actor="admin",
        via="tests",
        data={
            "mcp_id": "crm",
            "name": "crm",
            "command": sys.executable,
            "args": [str(SERVER)],
            "env": {"CRM_TOKEN": CRM_TOKEN},
        },
    )
    assert discover_as_admin(server=echo).ok
    ToolContract.objects.filter(tool__server=echo).update(risk=ToolContract.Risk.READ)
    shared = f"crm_access={CRM_TOKEN}"
    agent = make_agent(
        slug="reader",
        servers=[echo],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": "echo", "args": {"text": shared}}]}, {"content": "설정: {last_tool_result}"}],
    )
    clear_registered_secrets()  # a worker process that has not met the CRM binding
    run_configuration_forget()
    run = Run.objects.create(agent=agent, query="공유 설정 보여줘")
    try:
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close("ctx")
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    stored = json.dumps(
        [
            list(AuditEvent.objects.filter(run_id=run.id).values("args", "result")),
            run.answer,
            run.messages,
            list(run.events.values_list("data", flat=True)),
        ],
        ensure_ascii=False,
        default=str,
    )
    assert "crm_access=" in stored and CRM_TOKEN not in stored


@pytest.mark.slow
def test_settings_with_credential_words_in_their_names_stay_settings_and_short_secrets_mask_only_their_runs() -> None:
    """Two changes met: a setting named TOKEN_TTL_S or AUTH_MODE was refused (its name "says it is a secret"), and,
    kept as a secret, its 3600 and none were masked in the answers of every agent on the platform."""
    mcp_server_create(
        actor="admin", via="tests", data={"mcp_id": "idp", "name": "idp", "command": sys.executable,
                                          "args": [str(SERVER)], "env": {"TOKEN_TTL_S": "3600", "AUTH_MODE": "none"},
                                          "public_env": ["TOKEN_TTL_S", "AUTH_MODE"]},
    )  # fmt: skip
    with pytest.raises(ValidationError, match="DB_PASSWORD"):
        mcp_server_create(
            actor="admin", via="tests", data={"mcp_id": "db", "name": "db", "command": sys.executable,
                                              "args": [str(SERVER)], "env": {"DB_PASSWORD": "plain"},
                                              "public_env": ["DB_PASSWORD"]},
        )  # fmt: skip
    mcp_server_create(  # short secrets of a server this run's agent is not bound to
        actor="admin", via="tests", data={"mcp_id": "idp2", "name": "idp2", "command": sys.executable,
                                          "args": [str(SERVER)], "env": {"TTL": "3600", "MODE": "none"}},
    )  # fmt: skip
    echo = mcp_server_create(
        actor="admin", via="tests", data={"mcp_id": "ctx", "name": "ctx", "command": sys.executable,
                                          "args": [str(SERVER)], "timeout_s": 20},
    )  # fmt: skip
    assert discover_as_admin(server=echo).ok
    ToolContract.objects.filter(tool__server=echo).update(risk=ToolContract.Risk.READ)
    agent = make_agent(
        slug="reader", servers=[echo], provider="scripted", with_demo_rules=False,
        script=[{"tool_calls": [{"name": "echo", "args": {"text": "세션 만료 3600초, 오류 none"}}]},
                {"content": "결과: {last_tool_result}"}],
    )  # fmt: skip
    clear_registered_secrets()
    run_configuration_forget()
    run = Run.objects.create(agent=agent, query="설정 보여줘")
    try:
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close("ctx")
    run.refresh_from_db()
    assert run.answer == "결과: " + tool_data_block("세션 만료 3600초, 오류 none")
