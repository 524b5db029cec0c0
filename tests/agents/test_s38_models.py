"""The model call, where it went wrong: a conversation's earlier answers sent whole (a budgeted conversation stuck
for good on ``budget:run_ceiling``), Bedrock's prompt-cache writes never counted, a streamed error event never
retried, and a deleted API key's turns given to runs with no key. Only the model is scripted: Bedrock through
botocore's Stubber, the OpenAI-compatible provider through a local HTTP server (tests/openai_server.py)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from agents.budgets import budget_create, budget_reserve
from agents.execution import conversation_history, run_execute
from agents.models import ApiKey, Run
from tests.agents.test_model_defects import bedrock_agent, executed, stubbed_bedrock  # noqa: F401 - a fixture
from tests.agents.test_openai_compatible import openai_agent
from tests.conftest import ApiCaller, make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

# agents.execution's bounds on an earlier turn's text and on the earlier turns together, and its mark of a cut.
HISTORY_TEXT_CHARS, HISTORY_CHARS, HISTORY_CUT_MARK = 2_000, 12_000, "…(cut)"

ANSWER = ("박도윤 님은 물류플랫폼팀 소속이며 현재 차세대 물류 플랫폼 구축 프로젝트를 맡고 있습니다. " * 30)[:1200]


def earlier(agent: Any, context_id: str, answers: list[str]) -> None:
    for i, answer in enumerate(answers):
        Run.objects.create(
            agent=agent,
            query=f"질문 {i}",
            answer=answer,
            status=Run.Status.SUCCEEDED,
            context={"contextId": context_id},
        )


def sent_texts(server: ScriptedOpenAIServer, index: int = 0) -> list[tuple[str, str]]:
    return [(m["role"], str(m.get("content") or "")) for m in server.requests[index]["body"]["messages"][1:]]


# --- 1. a conversation's earlier answers are bounded ----------------------------------------------------------


@pytest.mark.slow
def test_a_budgeted_conversation_of_long_answers_goes_on_with_its_newest_turns(demo_server) -> None:
    # Ten earlier answers of 1,200 Korean characters under the default reservation (20,000 tokens): every later turn
    # failed budget:run_ceiling, and a failed run never joins the conversation.
    with ScriptedOpenAIServer([{"content": "세 번째 답"}, {"content": "네 번째 답"}]).running() as server:
        agent = openai_agent(server, demo_server, slug="history-budget")
        budget_create(actor="t", via="tests", data={"agent": agent, "period": "day", "max_tokens": 10_000_000})
        earlier(agent, "c-ko", [f"{i}번 답: {ANSWER}" for i in range(10)])
        runs = []
        for query in ("다음", "또 다음"):
            run = Run.objects.create(agent=agent, query=query, context={"contextId": "c-ko"})
            budget_reserve(run=run, agent=agent, api_key=None)
            run_execute(run_id=str(run.id))
            run.refresh_from_db()
            runs.append(run)
    assert [(r.status, r.error_code) for r in runs] == [(Run.Status.SUCCEEDED, "")] * 2, runs[0].error_message
    first, second = sent_texts(server, 0), sent_texts(server, 1)
    # The newest turns, whole and in order, the question last; the oldest dropped.
    assert first[-1] == ("user", "다음") and second[-1] == ("user", "또 다음")
    assert first[-3] == ("user", "질문 9") and first[-2] == ("assistant", f"9번 답: {ANSWER}")
    assert 2 <= len(first) - 1 < 20
    assert second[-3:-1] == [("user", "다음"), ("assistant", "세 번째 답")]


@pytest.mark.slow
def test_earlier_answers_are_cut_and_the_oldest_dropped_without_a_budget(demo_server) -> None:
    big = "가나다라마바사아자차" * 20_000  # 200,000 characters each
    with ScriptedOpenAIServer([{"content": "답"}]).running() as server:
        agent = openai_agent(server, demo_server, slug="history-big")
        earlier(agent, "c-big", [big] * 10)
        run = executed(agent, "다음", context={"contextId": "c-big"})
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    sent = sent_texts(server)
    cut = big[:HISTORY_TEXT_CHARS] + HISTORY_CUT_MARK
    assert sent[-1] == ("user", "다음")
    assert [text for role, text in sent[:-1] if role == "assistant"] == [cut] * (len(sent[:-1]) // 2)
    assert 0 < sum(len(text) for _role, text in sent[:-1]) <= HISTORY_CHARS
    assert [text for role, text in sent[:-1] if role == "user"][-1] == "질문 9"  # the newest kept
    assert len(json.dumps(run.messages, ensure_ascii=False)) < 3 * HISTORY_CHARS  # the run's stored copy too


def test_an_earlier_answer_is_cut_between_syllables_typed_decomposed() -> None:
    agent = make_agent(slug="cut", servers=[], with_demo_rules=False)
    decomposed = "\u1100\u1175\u11b7" * 3_000  # 김 typed as its three jamo, 9,000 code points
    earlier(agent, "c-nfd", [decomposed])
    run = Run.objects.create(agent=agent, query="다음", context={"contextId": "c-nfd"})
    (turn,) = conversation_history(run)
    kept = turn["answer"].removesuffix(HISTORY_CUT_MARK)
    assert turn["answer"].endswith(HISTORY_CUT_MARK) and kept == "김" * len(kept) and 0 < len(kept) <= 2_000


# --- 2. Bedrock's prompt-cache writes are counted ---------------------------------------------------------------


def test_bedrock_cache_writes_told_by_their_lifetime_are_counted(demo_server, stubbed_bedrock) -> None:  # noqa: F811
    reply = {
        "output": {"message": {"role": "assistant", "content": [{"text": "답입니다."}]}},
        "stopReason": "end_turn",
        "usage": {
            "inputTokens": 100,
            "outputTokens": 10,
            "totalTokens": 1110,
            "cacheReadInputTokens": 0,
            "cacheWriteInputTokens": 1000,
            "cacheDetails": [{"ttl": "5m", "inputTokens": 400}, {"ttl": "1h", "inputTokens": 600}],
        },
        "metrics": {"latencyMs": 5},
    }
    stubbed_bedrock.add_response("converse", reply)
    run = executed(bedrock_agent(demo_server, "cache-writes"), "안녕?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.token_usage["input_tokens"] == 1100
    assert run.token_usage["cache_creation_tokens"] == 1000


# --- 3. a streamed error event is the kind its code names -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_overloaded_servers_error_object_is_retried_streamed_or_not(demo_server, stream: bool) -> None:
    overloaded = {"error_object": {"message": "model overloaded", "code": 503}}
    with ScriptedOpenAIServer([overloaded, {"content": "끝"}]).running() as server:
        agent = openai_agent(
            server, demo_server, slug=f"overloaded-{stream}", stream=stream, retry={"max_attempts": 3, "backoff_s": 0}
        )
        run = executed(agent, "질문")
    assert (run.status, run.answer, len(server.requests)) == (Run.Status.SUCCEEDED, "끝", 2), run.error_code


# --- 4. a deleted key's turns are no keyless run's --------------------------------------------------------------


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
def test_a_deleted_keys_turns_are_not_given_to_a_run_with_no_key(demo_server, api_caller: ApiCaller) -> None:
    with ScriptedOpenAIServer([{"content": "키A에게만 준 답"}, {"content": "운영자 답"}]).running() as server:
        agent = openai_agent(server, demo_server, slug="deleted-key")
        client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
        posted = client.post(
            "/api/v1/runs",
            {"agent": agent.slug, "query": "키A의 비밀 질문", "context": {"contextId": "conv-x"}},
            content_type="application/json",
        )
        keyed = Run.objects.get(pk=posted.json()["id"])
        run_execute(run_id=str(keyed.pk))
        keyed.refresh_from_db()
        assert keyed.status == Run.Status.SUCCEEDED, keyed.error_message
        # A key deleted before deleting a key with runs was refused (``api_key_delete``): its runs keep no key.
        ApiKey.objects.filter(pk=api_caller.key.pk).delete()
        context = json.dumps({"contextId": "conv-x"})
        call_command("run_query", agent.slug, "운영자 질문", "--context", context, "--inline", stdout=StringIO())
        operator = Run.objects.filter(api_key=None, query="운영자 질문").get()
    assert operator.status == Run.Status.SUCCEEDED, operator.error_message
    assert sent_texts(server, 1) == [("user", "운영자 질문")]
    # The keyless runs' own conversation goes on; an API run whose key was deleted before it ran is given none.
    later = Run.objects.create(agent=agent, query="다음", context={"contextId": "conv-x"})
    assert conversation_history(later) == [{"query": "운영자 질문", "answer": "운영자 답"}]
    orphan = Run.objects.create(agent=agent, query="다음", context={"contextId": "conv-x"}, request_digest="0" * 64)
    assert conversation_history(orphan) == []
