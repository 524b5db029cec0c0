"""What a review of the A2A and MCP endpoints found (rev34_B):

1. a run kept without a contextId (a REST run sent without one, every MCP run) reports its own id as its task's
   contextId, and ``ListTasks`` finds it by that id, but a follow-up sent under it was given no history: the model
   never saw the first turn. And a ``context.contextId`` that is not text (a number, an object) was kept, reported
   as "12345" or Python's text of it, and found by nothing: it is refused on every door;
2. the cards and MCP ``tools/list`` showed the first line of the system prompt unmasked: a binding's secret written
   there was shown to every API caller;
3. malformed A2A params (``includeArtifacts: "yes"``, a ``contextId`` object, a ``configuration`` or ``metadata``
   that is no object, a ``metadata.context.contextId`` other than the message's) were ignored without a word.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageConfiguration, SendMessageRequest
from django.test import Client
from django.utils import timezone
from google.protobuf.json_format import MessageToDict

from agents.execution import conversation_history
from agents.models import Agent, Run
from agents.services import agent_version_publish
from audit.change_guard import change_scope
from mcpregistry.models import McpServer
from tests.conftest import DEMO_SECRET, ApiCaller, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _waits_short(settings: Any) -> None:
    """No worker runs here: a message this file expects refused that is taken instead (the old code) is answered
    after a second of waiting, not a minute (a stream: ten minutes)."""
    settings.PLATFORM_API_MAX_WAIT_S = 1
    settings.PLATFORM_SSE_MAX_S = 1


@pytest.fixture
def quiet(db: Any) -> Agent:
    """An agent without servers or rules: its runs stay queued (no worker runs in these tests)."""
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def client_for(raw_key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")


def a2a(client: Client, method: str, params: dict[str, Any], slug: str = "quiet") -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    response = client.post(
        f"/a2a/{slug}/", json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0"}
    )
    answered: dict[str, Any] = json.loads(
        b"".join(response.streaming_content) if response.streaming else response.content
    )
    return answered


def mcp(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    response = client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json"}
    )
    answered: dict[str, Any] = json.loads(
        b"".join(response.streaming_content) if response.streaming else response.content
    )
    return answered


def send(client: Client, params: dict[str, Any]) -> dict[str, Any]:
    """``SendMessage`` answered at once with its task (no worker runs it here)."""
    answer = a2a(client, "SendMessage", {**params, "configuration": {"returnImmediately": True}})
    task: dict[str, Any] = answer["result"]["task"]
    return task


def invalid_params(answer: dict[str, Any]) -> str:
    """The message of a -32602 answer (fails the test on any other)."""
    assert answer.get("error", {}).get("code") == -32602, answer
    message: str = answer["error"]["message"]
    return message


def finish(run_id: Any, answer: str) -> None:
    """The run as a worker leaves a succeeded one (no worker runs here)."""
    now = timezone.now()
    Run.objects.filter(pk=run_id).update(status=Run.Status.SUCCEEDED, answer=answer, started_at=now, finished_at=now)


def message(text: str, **envelope: Any) -> dict[str, Any]:
    return {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}], **envelope}


# --- 1. a conversation is the one the task reports -----------------------------------------------------------


def test_a_follow_up_under_the_context_id_a_task_reports_is_given_that_tasks_turn(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    client = client_for(api_caller.raw_key)
    first = client.post(
        "/api/v1/runs", {"agent": "quiet", "query": "김하늘 님은 어느 팀?"}, content_type="application/json"
    )
    first_id = first.json()["id"]
    finish(first_id, "인사팀입니다.")
    reported = a2a(client, "GetTask", {"id": first_id})["result"]["contextId"]
    assert reported == first_id  # a run kept without a contextId is its own conversation

    follow = send(client, {"message": message("그 팀장은?", contextId=reported)})
    second = Run.objects.get(pk=follow["id"])
    assert conversation_history(second) == [{"query": "김하늘 님은 어느 팀?", "answer": "인사팀입니다."}]
    finish(second.pk, "박팀장입니다.")
    third = client.post(
        "/api/v1/runs",
        {"agent": "quiet", "query": "연락처는?", "context": {"contextId": reported}},
        content_type="application/json",
    )
    assert [turn["query"] for turn in conversation_history(Run.objects.get(pk=third.json()["id"]))] == [
        "김하늘 님은 어느 팀?",
        "그 팀장은?",
    ]


def test_a_run_is_not_in_the_conversation_its_id_names_for_another_caller_or_when_it_keeps_its_own(
    api_caller: ApiCaller, other_caller: ApiCaller, quiet: Agent
) -> None:
    mine = client_for(api_caller.raw_key)
    plain = mine.post("/api/v1/runs", {"agent": "quiet", "query": "첫 질문"}, content_type="application/json").json()
    kept = mine.post(
        "/api/v1/runs",
        {"agent": "quiet", "query": "다른 대화", "context": {"contextId": "대화-7"}},
        content_type="application/json",
    ).json()
    finish(plain["id"], "답 1")
    finish(kept["id"], "답 2")
    theirs = client_for(other_caller.raw_key)
    other = send(theirs, {"message": message("남의 대화", contextId=plain["id"])})
    assert conversation_history(Run.objects.get(pk=other["id"])) == []  # the id is not the other caller's to join
    under_kept_id = send(mine, {"message": message("id로", contextId=kept["id"])})
    assert conversation_history(Run.objects.get(pk=under_kept_id["id"])) == []  # that run's conversation is 대화-7


@pytest.mark.parametrize("context_id", [12345, {"a": [1]}, "", "   ", "x" * 201])  # null: none (test_context_id_doors)
def test_a_context_id_that_is_not_text_is_refused_by_rest_naming_the_field(
    api_caller: ApiCaller, quiet: Agent, context_id: Any
) -> None:
    response = client_for(api_caller.raw_key).post(
        "/api/v1/runs",
        {"agent": "quiet", "query": "q", "context": {"contextId": context_id, "userId": "u"}},
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["fields"] == {"context": {"contextId": ["'context.contextId' must be text of 1 to 200 characters."]}}
    assert not Run.objects.exists()


def test_a_context_id_that_is_not_text_is_refused_by_mcp_and_a2a(api_caller: ApiCaller, quiet: Agent) -> None:
    client = client_for(api_caller.raw_key)
    call = {"name": "ask_quiet", "arguments": {"query": "q", "context": {"contextId": 12345}}}
    result = mcp(client, "tools/call", call)["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"] == "invalid_input: 'context.contextId' must be text of 1 to 200 characters."
    sent = a2a(client, "SendMessage", {"message": message("q"), "metadata": {"context": {"contextId": {"a": [1]}}}})
    assert "'metadata.context.contextId'" in invalid_params(sent)
    assert not Run.objects.exists()
    accepted = mcp(client, "tools/list", {})["result"]["tools"][0]["inputSchema"]["properties"]["context"]
    assert accepted["properties"]["contextId"]["type"] == ["string", "null"]  # the schema says what is refused


def test_a_text_context_id_is_still_taken_on_every_door(api_caller: ApiCaller, quiet: Agent) -> None:
    client = client_for(api_caller.raw_key)
    rest = client.post(
        "/api/v1/runs",
        {"agent": "quiet", "query": "q", "context": {"contextId": "대화-1"}},
        content_type="application/json",
    )
    assert rest.status_code == 202 and rest.json()["context"]["contextId"] == "대화-1"
    # the context's contextId alone names the conversation, as on REST (it was replaced by a new one)
    alone = send(client, {"message": message("a"), "metadata": {"context": {"contextId": "대화-1"}}})
    assert alone["contextId"] == "대화-1"
    both = {
        "message": message("b", contextId="대화-1"),
        "metadata": {"context": {"contextId": "대화-1", "userId": "u"}},
    }
    task = send(client, both)
    assert Run.objects.get(pk=task["id"]).context == {"contextId": "대화-1", "userId": "u"}
    listed = a2a(client, "ListTasks", {"contextId": "대화-1"})["result"]
    assert listed["totalSize"] == 3


# --- 2. what describes an agent is masked as its runs are ------------------------------------------------------


# Secrets that no value pattern of the masker finds (DEMO_SECRET's "sk-…" is masked as a pattern anyway): only the
# secrets a run of the agent is masked with hide them.
PASSPHRASE = "Lighthouse-Orchid-4471"
OTHER_BINDINGS = "Quartz-Meadow-8812"
MODEL_KEY = "kestrel92harbor-model"


def bind_secret_server(mcp_id: str, **env: str) -> McpServer:
    with change_scope(actor="test", via="tests"):
        server: McpServer = McpServer.objects.create(
            mcp_id=mcp_id,
            name=mcp_id,
            transport=McpServer.Transport.STDIO,
            command=sys.executable,
            args=["-c", "pass"],
            env=env,
            public_env=[],
        )
    return server


def with_prompt(agent: Agent, prompt: str) -> None:
    with change_scope(actor="test", via="tests"):
        Agent.objects.filter(pk=agent.pk).update(system_prompt=prompt)
    agent.refresh_from_db()


def descriptions(client: Client) -> dict[str, str]:
    """What the agent card, the directory card and MCP tools/list say, as text."""
    return {
        "agent card": client.get("/a2a/helper/.well-known/agent-card.json").content.decode(),
        "directory card": client.get("/.well-known/agent-card.json").content.decode(),
        "MCP tools/list": json.dumps(mcp(client, "tools/list", {}), ensure_ascii=False),
    }


def shown_in(shown: dict[str, str], *secrets: str) -> list[str]:
    return [name for name, text in shown.items() if any(secret in text for secret in secrets)]


def test_binding_secrets_in_the_system_prompt_are_masked_in_the_cards_and_mcp_tools(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    bound = bind_secret_server("backend", INTERNAL_API_KEY=DEMO_SECRET, BACKEND_PASSPHRASE=PASSPHRASE)
    bind_secret_server("elsewhere", TOKEN=OTHER_BINDINGS)  # another agent's binding: its runs mask it too
    agent = make_agent(slug="helper", servers=[bound], with_demo_rules=False)
    secrets = (DEMO_SECRET, PASSPHRASE, OTHER_BINDINGS)
    with_prompt(agent, f"Call the backend with {DEMO_SECRET}, {PASSPHRASE} or {OTHER_BINDINGS}.\nBe brief.")
    client = client_for(api_caller.raw_key)

    shown = descriptions(client)  # two agents: the directory describes each one
    assert shown_in(shown, *secrets) == []
    assert all("Call the backend with" in text for text in shown.values())  # the rest of the line is kept

    agent_version_publish(agent=agent, actor="test-admin", via="tests", note="v1")  # the live version's prompt
    shown = descriptions(client)
    assert shown_in(shown, *secrets) == []
    assert all("Call the backend with" in text for text in shown.values())


def test_the_agents_own_model_key_in_its_prompt_is_masked_in_its_cards_and_mcp_tool(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    agent = make_agent(slug="helper", servers=[], with_demo_rules=False)
    with change_scope(actor="test", via="tests"):
        agent.model_secrets = {"api_key": MODEL_KEY}
        agent.system_prompt = f"Use {MODEL_KEY} for the model."
        agent.save()
    shown = descriptions(client_for(api_caller.raw_key))
    assert shown_in(shown, MODEL_KEY) == []
    assert all("Use *** for the model." in text for text in shown.values())


# --- 3. malformed params are refused, not ignored ------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"includeArtifacts": "yes"}, "'includeArtifacts' must be true or false."),
        ({"includeArtifacts": 1}, "'includeArtifacts' must be true or false."),
        ({"contextId": {"a": 1}}, "'contextId' must be text of at most 200 characters."),
        ({"contextId": 7}, "'contextId' must be text of at most 200 characters."),
    ],
)
def test_list_tasks_refuses_params_of_the_wrong_type(
    api_caller: ApiCaller, quiet: Agent, params: dict[str, Any], named: str
) -> None:
    assert invalid_params(a2a(client_for(api_caller.raw_key), "ListTasks", params)) == named


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"configuration": [1]}, "'configuration' must be an object."),
        ({"metadata": "abc"}, "'metadata' must be an object."),
        ({"metadata": {"context": [1]}}, "'metadata.context' must be an object."),
        (
            {"metadata": {"context": {"contextId": "c-2"}}},
            "'message.contextId' and 'metadata.context.contextId' differ: send one of them, or the same value in both.",
        ),
    ],
)
@pytest.mark.parametrize("method", ["SendMessage", "SendStreamingMessage"])
def test_send_message_refuses_a_configuration_or_metadata_it_cannot_read(
    api_caller: ApiCaller, quiet: Agent, method: str, extra: dict[str, Any], named: str
) -> None:
    params = {"message": message("q", contextId="c-1"), **extra}
    assert invalid_params(a2a(client_for(api_caller.raw_key), method, params)) == named
    assert not Run.objects.exists()


def test_a_request_the_a2a_sdk_builds_with_metadata_and_configuration_is_taken(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    request = SendMessageRequest(
        message=Message(message_id="m-sdk", context_id="대화-sdk", role=Role.ROLE_USER, parts=[Part(text="q")]),
        configuration=SendMessageConfiguration(return_immediately=True, history_length=0),
    )
    request.metadata.update({"context": {"userId": "E-1", "contextId": "대화-sdk"}})
    params = MessageToDict(request)
    task = a2a(client_for(api_caller.raw_key), "SendMessage", params)["result"]["task"]
    assert Run.objects.get(pk=task["id"]).context == {"userId": "E-1", "contextId": "대화-sdk"}
    listed = a2a(client_for(api_caller.raw_key), "ListTasks", {"contextId": "대화-sdk", "includeArtifacts": False})
    assert listed["result"]["totalSize"] == 1
