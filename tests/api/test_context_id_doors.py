"""A context's ``contextId`` read by one rule on every door (rev34_H):

1. REST, A2A and MCP refused a ``contextId`` that is not text, but an eval case (``eval_case_create``, an eval set's
   import) stored ``{"contextId": 7}`` as it came, and ``run_query --context`` took it: the eval ordered such cases
   as one conversation (``str(7)``), while the history compared the JSON number 7 with "7" and gave each case none
   of the turns before it. Both refuse it now, in the same words (``agents.conversations.context_id_problem``);
2. the check refused ``"contextId": null`` (REST 400, A2A -32602, MCP ``isError``), which had meant no conversation
   (the run its own, as A2A's own ``message.contextId: null`` still is): ``null`` is read as absent on every door,
   and not kept in the run's context.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client

from agent_platform.errors import ApplicationError
from agents.conversations import context_id_of
from agents.models import Agent, Run
from evals.models import EvalCase, EvalSet
from evals.services import eval_case_create, eval_set_apply, eval_set_create
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

REFUSED = "'context.contextId' must be text of 1 to 200 characters."
NOT_TEXT = [7, 1.5, True, {"a": [1]}, ["c"], "", "   ", "x" * 201]


@pytest.fixture(autouse=True)
def _waits_short(settings: Any) -> None:
    """No worker runs here: an MCP call taken waits a second for its run, not a minute."""
    settings.PLATFORM_API_MAX_WAIT_S = 1
    settings.PLATFORM_SSE_MAX_S = 1


@pytest.fixture
def quiet(db: Any) -> Agent:
    """An agent without servers or rules: its runs stay queued (no worker runs in these tests)."""
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


@pytest.fixture
def eval_set(quiet: Agent) -> EvalSet:
    return eval_set_create(actor="test", via="tests", data={"name": "conversation-set", "agent": quiet})


def client_for(caller: ApiCaller) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")


def rpc(client: Client, path: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {"A2A-Version": "1.0"} if path.startswith("/a2a/") else {"Accept": "application/json"}
    response = client.post(path, json.dumps(body), content_type="application/json", headers=headers)
    answered: dict[str, Any] = json.loads(
        b"".join(response.streaming_content) if response.streaming else response.content
    )
    return answered


def message(text: str, **envelope: Any) -> dict[str, Any]:
    return {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}], **envelope}


def run_query(*arguments: str) -> None:
    call_command("run_query", *arguments, stdout=io.StringIO(), stderr=io.StringIO())


# ---- 1. an eval case and run_query refuse what REST refuses -----------------------------------------------------


@pytest.mark.parametrize("context_id", NOT_TEXT)
def test_an_eval_case_whose_context_id_is_not_text_is_refused_at_its_context_field(
    eval_set: EvalSet, context_id: Any
) -> None:
    with pytest.raises(ValidationError) as refused:
        eval_case_create(
            actor="test",
            via="tests",
            data={"eval_set": eval_set, "key": "k", "query": "첫 질문", "context": {"contextId": context_id}},
        )
    assert refused.value.message_dict == {"context": [REFUSED]}
    assert not EvalCase.objects.exists()


def test_an_eval_sets_import_names_the_case_whose_context_id_is_a_number(quiet: Agent) -> None:
    document = {
        "name": "conversation-set",
        "agent": "quiet",
        "cases": [
            {"key": "first", "query": "첫 질문", "context": {"contextId": "conv-1"}},
            {"key": "second", "query": "둘째 질문", "context": {"contextId": 7}},
        ],
    }
    with pytest.raises(ApplicationError) as refused:
        eval_set_apply(document=document, actor="test", via="tests")
    assert refused.value.code == "invalid_eval_set"
    assert f"cases[1].context: {REFUSED}" in refused.value.message
    assert not EvalCase.objects.exists()


def test_an_eval_case_takes_a_text_context_id_and_a_null_one(eval_set: EvalSet) -> None:
    for key, context in (("text", {"contextId": "대화-1"}), ("none", {"contextId": None, "userId": "u"})):
        eval_case_create(
            actor="test", via="tests", data={"eval_set": eval_set, "key": key, "query": "질문", "context": context}
        )
    assert EvalCase.objects.count() == 2


@pytest.mark.parametrize("context_id", [7, {"a": [1]}, ""])
def test_run_query_refuses_a_context_id_that_is_not_text_and_queues_nothing(quiet: Agent, context_id: Any) -> None:
    context = json.dumps({"contextId": context_id, "userId": "u"})
    with pytest.raises(CommandError) as refused:
        run_query("quiet", "첫 질문", "--context", context, "--timeout", "0")
    assert str(refused.value) == REFUSED
    assert not Run.objects.exists()


def test_run_query_reads_a_null_context_id_as_none(quiet: Agent) -> None:
    with pytest.raises(CommandError):  # still queued after 0 s: no worker runs here
        run_query("quiet", "첫 질문", "--context", '{"contextId": null, "userId": "u"}', "--timeout", "0")
    run = Run.objects.get()
    assert run.context == {"userId": "u"}
    assert context_id_of(run) == str(run.id)


def test_the_check_is_still_named_where_it_was_first() -> None:
    from agents import conversations
    from agents.api import a2a

    assert a2a.context_id_problem is conversations.context_id_problem
    assert a2a.CONTEXT_ID_MAX_CHARS == conversations.CONTEXT_ID_MAX_CHARS == 200


# ---- 2. null is no conversation, on every door --------------------------------------------------------------


def test_rest_takes_a_null_context_id_as_none_and_the_run_is_its_own_conversation(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    client = client_for(api_caller)
    plain = client.post(
        "/api/v1/runs",
        {"agent": "quiet", "query": "q", "context": {"contextId": None, "userId": "u"}},
        content_type="application/json",
    )
    assert plain.status_code == 202, plain.content
    run = Run.objects.get(pk=plain.json()["id"])
    assert run.context == {"userId": "u"}
    assert context_id_of(run) == str(run.id)
    # beside a message's contextId it is none, not another one ("differ")
    beside = client.post(
        "/api/v1/runs",
        {"agent": "quiet", "message": message("b", contextId="대화-1"), "context": {"contextId": None}},
        content_type="application/json",
    )
    assert beside.status_code == 202, beside.content
    assert Run.objects.get(pk=beside.json()["id"]).context == {"contextId": "대화-1"}


def test_a2a_takes_a_null_metadata_context_id_as_none(api_caller: ApiCaller, quiet: Agent) -> None:
    client = client_for(api_caller)
    configuration = {"returnImmediately": True}
    alone = rpc(
        client,
        "/a2a/quiet/",
        "SendMessage",
        {
            "message": message("a"),
            "metadata": {"context": {"contextId": None, "userId": "u"}},
            "configuration": configuration,
        },
    )
    task = alone["result"]["task"]
    assert task["contextId"] not in ("", "None")  # a new conversation, as without one
    assert Run.objects.get(pk=task["id"]).context == {"contextId": task["contextId"], "userId": "u"}
    beside = rpc(
        client,
        "/a2a/quiet/",
        "SendMessage",
        {
            "message": message("b", contextId="대화-1"),
            "metadata": {"context": {"contextId": None}},
            "configuration": configuration,
        },
    )
    assert beside["result"]["task"]["contextId"] == "대화-1"


@pytest.mark.slow
def test_mcp_takes_a_null_context_id_as_none_and_its_schema_says_so(api_caller: ApiCaller, quiet: Agent) -> None:
    client = client_for(api_caller)
    call = {"name": "ask_quiet", "arguments": {"query": "q", "context": {"contextId": None, "userId": "u"}}}
    result = rpc(client, "/mcp/", "tools/call", call)["result"]
    assert result.get("isError") is not True, result
    run = Run.objects.get()
    assert run.context == {"userId": "u"}
    assert context_id_of(run) == str(run.id)
    tools = rpc(client, "/mcp/", "tools/list", {})["result"]["tools"]
    accepted = tools[0]["inputSchema"]["properties"]["context"]["properties"]["contextId"]
    assert accepted["type"] == ["string", "null"]


def test_the_rest_schema_says_a_context_id_may_be_null() -> None:
    schema = Client().get("/api/v1/schema/?format=json").json()
    context = schema["components"]["schemas"]["RunCreateRequest"]["properties"]["context"]
    assert context["properties"]["contextId"]["nullable"] is True


def test_a_korean_query_and_context_id_typed_decomposed_are_measured_as_stored(
    api_client, demo_agent, settings
) -> None:
    """Lengths were counted on the text as sent: Korean typed on a Mac (decomposed, 2–3 code points a syllable) was
    refused at some 40% of the limit and told it was past it ("질의가 8000자를 초과합니다." for 4,000 characters).
    Counted composed, as stored: the same words are taken whichever keyboard typed them."""
    import unicodedata

    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 100
    query = ("김하늘님은어느팀소속인가요" * 10)[:100]
    context_id = "대화" * 40  # 80 characters composed, 200 decomposed
    for form in ("NFC", "NFD"):
        response = api_client.post(
            "/api/v1/runs",
            {
                "agent": demo_agent.slug,
                "query": unicodedata.normalize(form, query),
                "context": {"contextId": unicodedata.normalize(form, context_id + form)},
            },
            format="json",
        )
        assert response.status_code == 202, (form, response.content.decode())
    too_long = api_client.post("/api/v1/runs", {"agent": demo_agent.slug, "query": query + "요"}, format="json")
    assert too_long.status_code == 413
