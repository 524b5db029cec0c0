"""A rule run's ``deterministic:tool_failed`` message in the REST caller's language.

The defect: the engine stores that message in the run's language, as the run's agent says it (a Korean agent's
rejected write: "요청을 수행하지 않았습니다: 승인이 거부되었습니다."), and ``GET /runs/{id}`` with
``Accept-Language: en`` answered it so, under ``Content-Language: en``: ``agents.error_texts`` knew no such
message. Now it is read back from the stored sentence, in either language, and said in the caller's; a tool's own
words quoted after it stay as the tool wrote them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Agent, Run
from tests.agents.test_approvals import (  # noqa: F401 - the fixtures
    a_rule_that_saves_the_notes,
    decide,
    eager_tasks,
    lines,
    notes,
    park,
    writer,
)
from tests.conftest import ApiCaller, bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def errors_by_language(client: APIClient, run: Run) -> dict[str, Any]:
    """The run's ``error`` as ``GET /runs/{id}`` and ``GET /runs`` answer it, by the language asked for."""
    found: dict[str, Any] = {}
    for language in ("en", "ko"):
        one = client.get(f"{RUNS}/{run.id}", HTTP_ACCEPT_LANGUAGE=language)
        assert one.status_code == 200, one.content
        assert one["Content-Language"] == language
        listed = client.get(RUNS, HTTP_ACCEPT_LANGUAGE=language)
        assert [r["error"] for r in listed.json()["results"] if r["id"] == str(run.id)] == [one.json()["error"]]
        found[language] = one.json()["error"]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("agent_language", ["ko", "en"])
def test_a_rejected_rule_writes_message_reads_in_the_callers_language(
    writer: tuple[Run, APIClient],  # noqa: F811 - the fixture
    notes: Path,  # noqa: F811 - the fixture
    django_capture_on_commit_callbacks: Any,
    agent_language: str,
) -> None:
    run, client = writer
    Agent.objects.filter(pk=run.agent_id).update(model_provider="offline", language=agent_language)
    a_rule_that_saves_the_notes(run)
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "deterministic:tool_failed")
    korean = "요청을 수행하지 않았습니다: 승인이 거부되었습니다."
    english = "This request was not carried out: its approval was rejected."
    assert run.error_message == (korean if agent_language == "ko" else english)  # stored as the agent says it

    assert errors_by_language(client, run) == {
        "en": {"code": "deterministic:tool_failed", "message": english},
        "ko": {"code": "deterministic:tool_failed", "message": korean},
    }
    assert lines(notes) == []


@pytest.mark.slow
def test_a_failed_read_keeps_the_tools_own_words_in_either_language(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    agent = make_agent(slug="error-language", servers=[bind_demo_server(mcp_id="error-language")])
    Agent.objects.filter(pk=agent.pk).update(language="ko")
    run = Run.objects.create(agent=agent, api_key=api_caller.key, query="A-9999 자산의 현재 상태를 알려주세요.")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_failed")
    korean = "답변에 필요한 정보를 가져오지 못했습니다: 도구가 오류를 알렸습니다."
    assert run.error_message.startswith(korean)
    words = run.error_message.split("get_asset_status 도구의 답: “", 1)[1].removesuffix("”")
    assert words.startswith("'A-9999' 자산을 찾을 수 없습니다. 등록된 자산: A-1001")

    errors = errors_by_language(api_client, run)
    assert errors["ko"] == {"code": "deterministic:tool_failed", "message": run.error_message}
    assert errors["en"] == {
        "code": "deterministic:tool_failed",
        "message": "The information needed for this answer could not be retrieved: the tool reported an error. "
        f"Please check what you asked for, or try again later. get_asset_status said: “{words}”",
    }
