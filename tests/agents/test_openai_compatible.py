"""The ``openai_compatible`` provider end to end: langchain-openai's ChatOpenAI over real HTTP against a local
OpenAI-compatible server that returns scripted tool calls (plain JSON and streaming SSE), every tool call through
the gate against the demo MCP server."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import translation

from agents.budgets import budget_create, budget_reserve
from agents.execution import run_execute
from agents.model_texts import attempts_text
from agents.models import Agent, Run
from agents.services import agent_update
from audit.models import AuditEvent
from tests.conftest import make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

MODEL_KEY = "sk-local-model-key-7f3a9c"
TWO_TOOL_CALLS = [
    {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
    {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}]},
    {"content": "박도윤 님은 물류플랫폼팀이며 프로젝트는 {last_tool_result}"},
]


def openai_agent(server, demo_server, *, slug: str = "local-llm", **params) -> Agent:
    agent = make_agent(slug=slug, servers=[demo_server], provider="openai_compatible", with_demo_rules=False)
    agent.model_id = "qwen2.5-7b-instruct"
    agent.model_params = {"base_url": server.base_url, "temperature": 0.1, "max_tokens": 512, **params}
    agent.model_secrets = {"api_key": MODEL_KEY}
    agent.full_clean()
    agent.save()
    return agent


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_openai_compatible_agent_completes_a_react_run_with_two_tool_calls_through_the_gate(
    demo_server, stream: bool
) -> None:
    with ScriptedOpenAIServer(TWO_TOOL_CALLS).running() as server:
        agent = openai_agent(server, demo_server, stream=stream)
        run = submit(agent, "박도윤 님 팀과 프로젝트?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.answer.startswith("박도윤 님은 물류플랫폼팀이며 프로젝트는")
    assert "차세대 물류 플랫폼 구축" in run.answer
    events = list(AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id"))
    assert [(e.source, e.tool, e.ok) for e in events] == [
        ("agent", "search_employee", True),
        ("agent", "list_projects", True),
    ]
    assert events[0].args == {"name": "박도윤"}
    assert [s["type"] for s in run.messages if s["type"] in {"human", "ai", "tool"}] == [
        "human",
        "ai",
        "tool",
        "ai",
        "tool",
        "ai",
    ]
    # What went over the wire: the model, its parameters, the tools, the key as a bearer, and the tool results.
    assert len(server.requests) == 3
    first = server.requests[0]
    assert first["headers"]["authorization"] == f"Bearer {MODEL_KEY}"
    assert first["body"]["model"] == "qwen2.5-7b-instruct"
    assert first["body"]["temperature"] == 0.1
    assert bool(first["body"].get("stream")) is stream
    assert {t["function"]["name"] for t in first["body"]["tools"]} >= {"search_employee", "list_projects"}
    tool_turn = [m for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert "물류플랫폼팀" in tool_turn[0]["content"]
    # Tokens of all three calls, with the prompt-cache reads the server reported.
    assert run.token_usage["model_calls"] == 3
    assert run.token_usage["input_tokens"] == 300
    assert run.token_usage["output_tokens"] == 30
    assert run.token_usage["cache_read_tokens"] == 120


def test_the_model_key_is_encrypted_at_rest_and_never_in_the_trace_or_the_audit(demo_server, monkeypatch) -> None:
    """The key is set as an administrator sets it, through the audited service: its change is recorded by the
    secret's name (``set: [api_key]``), never its value, and the stored event carries the key nowhere."""
    from django.db import connection

    from audit.services import audit_event_record

    recorded: list[dict[str, Any]] = []

    def spy(**event: Any) -> Any:
        recorded.append(event)
        return audit_event_record(**event)

    turns = [{"content": f"echo {MODEL_KEY}"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server)
        Agent.objects.filter(pk=agent.pk).update(model_secrets={})  # stored without a key: the service sets it
        agent.refresh_from_db()
        before = AuditEvent.objects.count()
        with monkeypatch.context() as patched:
            patched.setattr("audit.changes.audit_event_record", spy)
            agent_update(agent=agent, actor="test-admin", via="tests", data={"model_secrets": {"api_key": MODEL_KEY}})
        run = submit(agent, "hello")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {MODEL_KEY}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT model_secrets FROM agents_agent WHERE id = %s", [agent.pk])
        (stored,) = cursor.fetchone()
    assert stored.startswith("fernet:") and MODEL_KEY not in stored
    assert MODEL_KEY not in run.answer and MODEL_KEY not in str(run.messages)
    # What the change recorded, before the audit's masking: the secret's name only.
    assert [(e["action"], e["args"]) for e in recorded] == [
        ("config.agent.update", {"model_secrets": {"set": ["api_key"]}})
    ]
    change = AuditEvent.objects.get(id__gt=before, action="config.agent.update")
    result = change.result or {}
    assert (change.actor, result.get("id"), result.get("via")) == ("test-admin", agent.pk, "tests")
    assert MODEL_KEY not in json.dumps(change.args) and MODEL_KEY not in json.dumps(change.result)
    # Stored as recorded: the field's name reads as a secret's to the masking, but its diff names secrets only (it
    # was stored as "***", hiding which secret was set).
    assert change.args == {"model_secrets": {"set": ["api_key"]}}


def test_the_key_may_come_from_the_workers_environment(demo_server, monkeypatch, settings) -> None:
    monkeypatch.setenv("LOCAL_LLM_KEY", "sk-from-env-51b2")
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["LOCAL_LLM_KEY"]
    with ScriptedOpenAIServer([{"content": "ok"}]).running() as server:
        agent = openai_agent(server, demo_server)
        agent.model_secrets = {"api_key": {"from_env": "LOCAL_LLM_KEY"}}
        agent.full_clean()
        agent.save()
        run = submit(agent, "hi")
    assert run.status == Run.Status.SUCCEEDED
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-from-env-51b2"


def test_a_key_in_the_model_parameters_or_an_unlisted_variable_is_refused(demo_server) -> None:
    agent = Agent(slug="x", name="x", model_provider="openai_compatible", model_id="m")
    agent.model_params = {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-plain"}
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "model_params" in refused.value.message_dict
    agent.model_params = {"base_url": "http://127.0.0.1:9/v1"}
    agent.model_secrets = {"api_key": {"from_env": "DATABASE_URL"}}
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "model_secrets" in refused.value.message_dict


def test_a_base_url_on_a_metadata_address_is_refused() -> None:
    agent = Agent(slug="meta", name="meta", model_provider="openai_compatible", model_id="m")
    agent.model_params = {"base_url": "http://169.254.169.254/v1"}
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "model_params" in refused.value.message_dict


def test_a_throttled_call_is_retried_and_the_run_still_succeeds(demo_server) -> None:
    turns = [{"status": 429, "error": "slow down"}, {"content": "done after a retry"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, retry={"max_attempts": 3, "backoff_s": 0})
        run = submit(agent, "hi")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.answer == "done after a retry"
    assert len(server.requests) == 2


def test_throttling_past_the_retries_fails_the_run_with_model_throttled(demo_server) -> None:
    turns = [{"status": 429, "error": "slow down"}] * 3
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, retry={"max_attempts": 2, "backoff_s": 0})
        run = submit(agent, "hi")
    assert run.status == Run.Status.FAILED
    assert run.error_code == "model:throttled"
    with translation.override(run.agent.language):  # the run's language: the platform's words in it
        assert attempts_text(2) in run.error_message
    assert len(server.requests) == 2
    assert {"type": "model_error", "reason": "model:throttled", "attempts": 2} in run.messages


def test_a_request_the_server_refuses_as_invalid_is_not_retried(demo_server) -> None:
    turns = [{"status": 400, "error": "context length exceeded"}, {"content": "never"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, retry={"backoff_s": 0})
        run = submit(agent, "hi")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:validation")
    assert len(server.requests) == 1


def test_a_server_that_is_not_there_fails_the_run_with_model_connection(demo_server) -> None:
    from tests.postgres import free_port

    agent = make_agent(slug="nowhere", servers=[demo_server], provider="openai_compatible", with_demo_rules=False)
    agent.model_id = "m"
    agent.model_params = {"base_url": f"http://127.0.0.1:{free_port()}/v1", "retry": {"backoff_s": 0}}
    agent.save()
    run = submit(agent, "hi")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")


@pytest.mark.slow
def test_a_server_too_slow_for_the_timeout_fails_the_run_with_model_timeout(demo_server) -> None:
    turns = [{"delay_s": 3, "content": "late"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, timeout_s=0.5, retry={"max_attempts": 1})
        run = submit(agent, "hi")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:timeout")


def test_a_forced_tool_choice_is_sent_to_the_server(demo_server) -> None:
    turns = [{"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]}, {"content": "ok"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, tool_choice="search_employee")
        submit(agent, "hi")
    assert server.requests[0]["body"]["tool_choice"] == {"type": "function", "function": {"name": "search_employee"}}


@pytest.mark.slow
def test_the_agents_forced_first_tool_is_sent_on_the_first_turn_only_and_the_call_goes_through_the_gate(
    demo_server,
) -> None:
    from agents.services import agent_update

    turns = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
        {"content": "박도윤 님은 {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, slug="forced-llm")
        agent_update(
            agent=agent, actor="admin", via="tests", data={"tool_selection": {"force_first_tool": "search_employee"}}
        )
        run = submit(Agent.objects.get(pk=agent.pk), "박도윤 님 팀?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first, second = server.requests
    assert first["body"]["tool_choice"] == {"type": "function", "function": {"name": "search_employee"}}
    assert second["body"].get("tool_choice") in (None, "auto")
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.source, event.tool, event.ok, event.args) == ("agent", "search_employee", True, {"name": "박도윤"})
    # "any": some tool must be called first.
    with ScriptedOpenAIServer(turns).running() as server:
        agent_update(
            agent=agent,
            actor="admin",
            via="tests",
            data={
                "tool_selection": {"force_first_tool": "any"},
                "model_params": {**agent.model_params, "base_url": server.base_url},
            },
        )
        submit(Agent.objects.get(pk=agent.pk), "박도윤 님 팀?")
    assert server.requests[0]["body"]["tool_choice"] == "required"


def test_a_conversation_gives_the_model_its_earlier_turns_and_only_its_own(demo_server) -> None:
    turns = [{"content": "첫 답입니다."}, {"content": "둘째 답입니다."}, {"content": "다른 대화의 답."}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, slug="chatty-llm")

        def ask(query: str, context_id: str) -> Run:
            run = Run.objects.create(agent=agent, query=query, context={"contextId": context_id})
            run_execute(run_id=str(run.id))
            run.refresh_from_db()
            return run

        assert ask("김하늘 님은 누구인가요?", "conv-1").status == Run.Status.SUCCEEDED
        assert ask("그분의 팀은요?", "conv-1").status == Run.Status.SUCCEEDED
        assert ask("새 질문", "conv-2").status == Run.Status.SUCCEEDED
    first, second, other = ([(m["role"], m["content"]) for m in r["body"]["messages"][1:]] for r in server.requests)
    assert first == [("user", "김하늘 님은 누구인가요?")]
    assert second == [("user", "김하늘 님은 누구인가요?"), ("assistant", "첫 답입니다."), ("user", "그분의 팀은요?")]
    assert other == [("user", "새 질문")]


def test_under_a_budget_each_request_caps_its_output_to_what_is_left_of_the_runs_reservation(demo_server) -> None:
    with ScriptedOpenAIServer(TWO_TOOL_CALLS).running() as server:
        agent = openai_agent(server, demo_server, max_tokens=None)
        budget_create(
            actor="test-admin",
            via="tests",
            data={"agent": agent, "period": "day", "max_tokens": 1_000_000, "run_reservation_tokens": 20_000},
        )
        run = Run.objects.create(agent=agent, query="박도윤 님 팀과 프로젝트?")
        budget_reserve(run=run, agent=agent, api_key=None)
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # langchain-openai sends the cap as ``max_completion_tokens`` (OpenAI's current name for ``max_tokens``).
    caps = [r["body"].get("max_completion_tokens", r["body"].get("max_tokens")) for r in server.requests]
    assert len(caps) == 3 and all(isinstance(cap, int) and 0 < cap < 20_000 for cap in caps), caps
    # The first call's input bound counts the tool schemas byte by byte; later calls find them in the input the
    # server reported, so their caps are what the reservation leaves after the tokens spent so far.
    assert caps[1] > caps[2] and caps[0] < caps[1]


def test_the_models_key_is_masked_in_what_the_process_logs(demo_server, masked_caplog) -> None:  # type: ignore[no-untyped-def]

    key = "local-llm-Q8w2Zr5xTn"  # no well-known key shape: only its registration can mask it
    caplog = masked_caplog  # its handler masks as the platform's do
    with ScriptedOpenAIServer(TWO_TOOL_CALLS).running() as server:
        agent = openai_agent(server, demo_server, slug="logs-key")
        agent.model_secrets = {"api_key": key}
        agent.save()
        run = submit(agent, "박도윤 님 팀과 프로젝트?")
    assert run.status == Run.Status.SUCCEEDED
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {key}"
    # What a provider's client logs of its request (httpx and openai do, at DEBUG) is masked.
    logging.getLogger("openai._base_client").warning("request options: api key %s", key)
    assert "api key ***" in caplog.text and key not in caplog.text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_call_whose_arguments_are_no_json_is_refused_to_the_model_which_corrects_it(
    demo_server, stream: bool
) -> None:
    """A model that writes arguments that are no JSON (keys and text unquoted) gets its call refused as args:json with what to do
    next, through the gate and its audit, and calls again; the run no longer ends on a turn that seems empty."""
    turns = [
        {"tool_calls": [{"name": "search_employee", "raw_arguments": "{name: 박도윤}"}]},
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
        {"content": "찾았습니다: {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, stream=stream)
        run = submit(agent, "박도윤 님은 어느 팀?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "물류플랫폼팀" in run.answer
    events = list(AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id"))
    assert [(e.tool, e.ok, e.reason) for e in events] == [
        ("search_employee", False, "args:json"),
        ("search_employee", True, ""),
    ]
    assert events[0].args == {"_raw": "{name: 박도윤}"}  # what the model wrote, recorded as written
    # The model was told, under its own call's id, and the trace shows the call with its text.
    refused = [m for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert len(refused) == 1 and "args:json" in refused[0]["content"]
    asked = next(m for m in server.requests[1]["body"]["messages"] if m["role"] == "assistant")["tool_calls"][0]
    assert asked["id"] == refused[0]["tool_call_id"]
    first_ai = next(m for m in run.messages if m["type"] == "ai" and m.get("tool_calls"))
    assert first_ai["tool_calls"][0]["args"] == "{name: 박도윤}"


def test_the_model_is_told_the_limits_the_contract_sets_before_a_call_is_refused_for_them(demo_server) -> None:
    from mcpregistry.models import ToolContract

    contract = ToolContract.objects.get(tool__server=demo_server, tool__name="list_projects")
    contract.args = {
        **contract.args,
        "team": {"type": "str", "required": True, "allowed": ["물류플랫폼팀", "AI연구팀"]},
    }
    contract.save()
    with ScriptedOpenAIServer([{"content": "네"}]).running() as server:
        agent = openai_agent(server, demo_server)
        run = submit(agent, "프로젝트?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    [spec] = [t for t in server.requests[0]["body"]["tools"] if t["function"]["name"] == "list_projects"]
    team = spec["function"]["parameters"]["properties"]["team"]
    assert team["enum"] == ["물류플랫폼팀", "AI연구팀"] and team["type"] == "string"
    assert "team" in spec["function"]["parameters"]["required"]


@pytest.mark.slow
def test_a_budgeted_run_does_not_send_a_timed_out_call_again(demo_server) -> None:
    """The provider may have finished and billed a call whose answer never came: a budgeted run's reservation
    bounds each call once, so a timed-out call is not sent a second (and third) time."""
    from agents.budgets import budget_create
    from agents.services import run_create

    turns = [{"delay_s": 2, "content": "late"}, {"content": "second"}, {"content": "third"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, timeout_s=0.5, retry={"max_attempts": 3, "backoff_s": 0})
        budget_create(
            actor="test-admin",
            via="tests",
            data={"agent": agent, "period": "day", "max_tokens": 100_000, "run_reservation_tokens": 20_000},
        )
        run = run_create(agent_slug=agent.slug, query="안녕하세요", api_key=None)  # reserves its share
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        requests = len(server.requests)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:timeout")
    assert requests == 1
