"""Commands that spoke English or said too little under a Korean platform (the s44 Korean admin walk):

1. ``agent_version list`` printed a note the platform wrote and the marks ``live``/``shadow`` in English, where the
   admin's versions list shows them in the reader's language (``version_note_text``);
2. ``run_query`` on a run parked for an approval printed an empty code: ``(승인 대기:  )``;
3. ``run_query`` labelled the offline provider's answer as the model's (``모델: …``), where the run page says it
   was made without a model;
4. the demo's servers had English names only, beside the agent's ``회사 정보 도우미 (company assistant)``.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import translation

from agents.models import Agent, Run
from agents.services import agent_shadow_set, agent_version_publish, agent_version_rollback
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_update
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db

EVAL_FREEZE_NOTE = "frozen for an eval run: the agent was never published"  # evals.services.EVAL_FREEZE_NOTE


# ---- 1. agent_version list --------------------------------------------------------------------------------------


def test_agent_version_list_says_the_platforms_notes_and_marks_in_the_readers_language() -> None:
    agent = make_agent(slug="versioned", servers=[], with_demo_rules=False)
    first = agent_version_publish(agent=agent, actor="admin", via="tests", note=EVAL_FREEZE_NOTE, make_live=False)
    Agent.objects.filter(pk=agent.pk).update(system_prompt="바뀐 프롬프트")  # v2 differs: the roll back to v1 makes v3
    agent.refresh_from_db()
    agent_version_publish(agent=agent, actor="admin", via="tests", note="운영자 메모")
    agent_version_rollback(version=first, actor="admin", via="tests")
    agent.refresh_from_db()
    agent_shadow_set(agent=agent, actor="admin", via="tests", version=first, rate=1.0)
    out = io.StringIO()
    with translation.override("ko"):
        call_command("agent_version", "list", "versioned", stdout=out)
    rows = [line.split("\t") for line in out.getvalue().splitlines()]
    assert [(row[0], row[3], row[4]) for row in rows] == [
        ("v1", "평가 실행을 위해 고정됨: 에이전트가 게시된 적이 없음", "섀도"),
        ("v2", "운영자 메모", ""),
        ("v3", "v1(으)로 롤백", "실서비스"),
    ]
    english = io.StringIO()
    call_command("agent_version", "list", "versioned", stdout=english)
    assert [line.split("\t")[3:] for line in english.getvalue().splitlines()] == [
        [EVAL_FREEZE_NOTE, "shadow"],
        ["운영자 메모", ""],
        ["roll back to v1", "live"],
    ]


# ---- 2. run_query on a run parked for an approval ------------------------------------------------------------


@pytest.fixture
def note_writer(tmp_path: Path) -> Iterator[Agent]:
    """An agent whose scripted model asks to write a note on a real stdio MCP server: its run parks."""
    binding: dict[str, Any] = {
        "mcp_id": "notes-s44",
        "name": "notes",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.probe_server"],
        "cwd": str(settings.BASE_DIR),
        "env": {"NOTES_FILE": str(tmp_path / "notes.txt")},
        "session_scope": "shared",
    }
    server = McpServer.objects.create(**binding)
    assert discover_as_admin(server=server).ok
    assert ToolContract.objects.get(tool__server=server, tool__name="append_note").risk == "write"
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
        {"content": "끝"},
    ]
    yield make_agent(slug="notes-s44", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    get_default_pool().close("notes-s44")


@pytest.mark.slow
@pytest.mark.parametrize(("language", "said"), [("ko", "(승인 대기)"), ("en", "(awaiting approval)")])
def test_run_query_says_only_the_status_of_a_run_parked_for_an_approval(
    note_writer: Agent, language: str, said: str
) -> None:
    out = io.StringIO()
    with translation.override(language), pytest.raises(CommandError) as parked:
        call_command("run_query", note_writer.slug, "회의록을 저장해줘", "--inline", stdout=out, stderr=io.StringIO())
    assert parked.value.returncode == 3
    assert Run.objects.get().status == Run.Status.AWAITING_APPROVAL
    lines = out.getvalue().splitlines()
    assert lines[1] == said, lines[:3]


# ---- 3. run_query on the offline provider's answer -----------------------------------------------------------


@pytest.mark.slow
def test_run_query_says_the_offline_providers_answer_was_made_without_a_model(demo_agent: Agent) -> None:
    out = io.StringIO()
    with translation.override("ko"):
        call_command("run_query", demo_agent.slug, "김하늘 님은 어느 팀 소속인가요?", "--inline", stdout=out)
    run = Run.objects.get()
    assert run.status == Run.Status.SUCCEEDED and run.answer
    text = out.getvalue()
    assert f"  모델 없이 만든 답변 (오프라인 제공자): {run.answer[:200]}" in text.splitlines()
    assert "모델: " not in text


@pytest.mark.slow
def test_run_query_still_says_a_models_answer_is_the_models(note_writer: Agent) -> None:
    Agent.objects.filter(pk=note_writer.pk).update(model_params={"script": [{"content": "모델의 답"}]})
    out = io.StringIO()
    call_command("run_query", note_writer.slug, "안녕", "--inline", stdout=out)
    assert "  model: 모델의 답" in out.getvalue().splitlines()


# ---- 4. the demo's server names ----------------------------------------------------------------------------------


def seed() -> None:
    call_command(
        "seed_demo", "--admin-username", "demo-admin", "--no-discover", stdout=io.StringIO(), stderr=io.StringIO()
    )


def test_the_demos_servers_have_korean_names_with_the_english_in_brackets() -> None:
    seed()
    names = dict(McpServer.objects.values_list("mcp_id", "name"))
    assert names == {
        "sds-company-data": "SDS 회사 데이터 (company data, seed 001 demo)",
        "local": "로컬 도구 (local tools: calculate, classify_request)",
    }
    assert Agent.objects.get(slug="company-assistant").name == "회사 정보 도우미 (company assistant)"


@pytest.mark.slow
def test_seed_demo_run_again_keeps_the_names_an_admin_gave_the_demos_servers() -> None:
    seed()
    for server in McpServer.objects.all():
        mcp_server_update(server=server, actor="admin", via="admin", data={"name": f"우리 {server.mcp_id}"})
    seed()
    assert dict(McpServer.objects.values_list("mcp_id", "name")) == {
        "sds-company-data": "우리 sds-company-data",
        "local": "우리 local",
    }
