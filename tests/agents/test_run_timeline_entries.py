"""Every entry of a run's trace reads as a step in words, in the order it happened: the tool selection of each
turn, calls made in parallel, a withdrawn tool, the MCP prompt and resources, a flow's nodes, a model's failure;
a rejected approval, a model's read of a resource and a guardrail's stop say what they were; the summary says the
run's tokens, model calls, cost and where its time went."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Agent, Run
from audit.services import audit_event_record
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

RAW_TYPES = (
    "tool_selection",
    "parallel_calls",
    "tool_withdrawn",
    "model_error",
    "prompt",
    "resource",
    "resource_tool",
    "flow_node",
)

TRACE: list[dict[str, Any]] = [
    {"type": "rule", "rule": "팀 조회", "rule_id": 1, "mcp_id": "sds", "tool": "team", "matched": True,
     "params": {"name": "김"}},
    {"type": "deterministic_call", "rule_id": 1, "mcp_id": "sds", "tool": "team", "args": {"name": "김"}, "ok": True,
     "value": {"team": "A"}, "latency_ms": 3.2},
    {"type": "prompt", "mcp_id": "sds", "name": "greeting", "ok": True, "error": "", "arguments": {"team": "A"},
     "delivered": "data"},
    {"type": "prompt", "mcp_id": "sds", "name": "bad", "ok": False, "error": "prompt:unknown"},
    {"type": "resource", "mcp_id": "sds", "uri": "demo://x", "ok": True, "error": "", "chars": 120},
    {"type": "resource", "mcp_id": "gone", "uri": "demo://y", "ok": False, "error": "mcp:not_loaded:gone"},
    {"type": "resource_tool", "offered": False, "error": "config:tool_name_conflict", "mcp_id": "sds",
     "message": "The read_resource tool is not offered"},
    {"type": "flow_node", "node": "lookup", "updated": ["team"]},
    # What the ReAct loop notes is appended before the conversation's messages (agents.engine).
    {"type": "tool_selection", "turn": 1, "ranker": "lexical", "candidates": 12,
     "offered": [{"name": "team", "score": 0.9, "why": "rule"}, {"name": "org", "score": 0.41, "why": "ranked"}],
     "selection_ms": 0.3, "fallback": "embedding:not_configured"},
    {"type": "parallel_calls", "calls": [{"call_id": "c1", "tool": "team", "start_ms": 0.1, "end_ms": 5.0},
                                         {"call_id": "c2", "tool": "org", "start_ms": 0.2, "end_ms": 6.0}],
     "max_overlap": 2},
    {"type": "model_error", "reason": "model:rate_limited", "attempts": 3},
    {"type": "system", "content": "sys"},
    {"type": "human", "content": "q"},
    {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "team", "args": {"name": "김"}},
                                                 {"id": "c2", "name": "org", "args": {}}]},
    {"type": "tool", "content": "결과", "tool_call_id": "c1", "name": "team", "status": "success"},
    {"type": "tool", "content": "조직", "tool_call_id": "c2", "name": "org", "status": "success"},
    {"type": "ai", "content": "", "guardrail": {"stop_reason": "guardrail_intervened"}},
]  # fmt: skip


def steps(page: str) -> list[tuple[str, str, str]]:
    """(classes, label, the step's text) of each step of a page's timeline."""
    found = []
    for classes, body in re.findall(r'<li class="step (.*?)">(.*?)</li>', page, re.S):
        label = re.search(r'<b class="step-label">(.*?)</b>', body, re.S)
        text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))).strip()
        found.append((classes, html.unescape(label.group(1)) if label else "", text))
    return found


def timeline(client: Any, run: Run, language: str = "en") -> list[tuple[str, str, str]]:
    client.cookies["django_language"] = language
    response = client.get(f"/admin/agents/run/{run.pk}/timeline/")
    assert response.status_code == 200
    return steps(response.content.decode())


def labels(found: list[tuple[str, str, str]]) -> list[str]:
    return [label for _classes, label, _text in found]


def a_run(**fields: Any) -> Run:
    agent = Agent.objects.filter(slug="ledger").first() or Agent.objects.create(slug="ledger", name="장부")
    return Run.objects.create(agent=agent, query="q", **{"status": Run.Status.SUCCEEDED, "answer": "끝", **fields})


def step_with(found: list[tuple[str, str, str]], words: str) -> tuple[str, str, str]:
    return next(s for s in found if words in s[2])


@pytest.mark.parametrize("language", ["en", "ko"])
def test_no_trace_entry_reads_as_raw_json_or_its_type_key(admin_client, language: str) -> None:
    found = timeline(admin_client, a_run(messages=TRACE), language)
    assert not [s for s in found if "step-other" in s[0]]
    assert not set(labels(found)) & set(RAW_TYPES)
    assert not any('"type":' in text for _c, _l, text in found)


def test_each_new_entry_says_what_happened_in_words(admin_client) -> None:
    found = timeline(admin_client, a_run(messages=TRACE))
    selection = step_with(found, "tools offered for turn 1")
    assert "team (named by a rule), org (ranked 0.41)" in selection[2]
    assert (
        "ranker: lexical (BM25, no network) (lexical)" in selection[2]
        and "fell back:" in selection[2]
        and "embedding:not_configured" in selection[2]
    )
    parallel = step_with(found, "ran in parallel")
    assert "team, org" in parallel[2] and "at most 2 at once, 0.1–6 ms" in parallel[2]
    prompts = [s for s in found if s[1] == "MCP prompt"]
    assert "sds/greeting" in prompts[0][2] and "attached as data" in prompts[0][2] and "status-ok" in prompts[0][0]
    assert "status-failed" in prompts[1][0] and "prompt:unknown" in prompts[1][2]
    resources = [s for s in found if s[1] == "MCP resource read"]
    assert "status-ok" in resources[0][0] and "120 characters" in resources[0][2]
    assert "status-failed" in resources[1][0] and "mcp:not_loaded:gone" in resources[1][2]
    offered = step_with(found, "read_resource tool")
    assert "not offered" in offered[2] and "The server sds has a tool of that name" in offered[2]
    assert "updated: team" in step_with(found, "flow node")[2]
    failure = step_with(found, "model call failed")
    assert "status-failed" in failure[0] and "model:rate_limited" in failure[2] and "3 attempt(s)" in failure[2]
    guarded = next(s for s in found if s[1] == "model turn 2")
    assert "status-degraded" in guarded[0] and "stopped by a guardrail" in guarded[2]


def test_what_the_loop_noted_sits_beside_the_turn_it_belongs_to(admin_client) -> None:
    order = labels(timeline(admin_client, a_run(messages=TRACE)))
    assert order.index("system message") < order.index("tool selection") < order.index("model turn 1")
    assert order.index("model turn 1") < order.index("ran in parallel") < order.index("tool call")
    assert order.index("model turn 2") < order.index("model call failed") < order.index("answer")


def test_a_real_withdrawn_tool_is_said_after_the_call_that_withdrew_it(admin_client, demo_server) -> None:
    bad = {"name": "search_employee", "args": {"nope": 1}}
    agent = make_agent(
        slug="wd",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [bad]}, {"tool_calls": [bad]}, {"tool_calls": [bad]}, {"tool_calls": [bad]},
                {"content": "끝"}],
    )  # fmt: skip
    run = Run.objects.create(agent=agent, query="홍길동 팀 알려줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    found = timeline(admin_client, run)
    order = labels(found)
    withdrawn = order.index("tool withdrawn")
    assert order[withdrawn - 2 : withdrawn + 2] == ["model turn 3", "tool call", "tool withdrawn", "model turn 4"]
    assert "withdrawn for the rest of the run after 3 calls with invalid arguments" in found[withdrawn][2]


def test_a_models_read_of_a_resource_shows_its_audited_outcome(admin_client) -> None:
    run = a_run(
        messages=[
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "read_resource", "args": {"uri": "demo://doc"}}]},
            {"type": "tool", "content": "문서 내용", "tool_call_id": "c1", "name": "read_resource", "status": "success"},
        ]
    )  # fmt: skip
    audit_event_record(
        source="agent", action="resource.read", run_id=run.pk, mcp_id="everything", tool="demo://doc", call_id="c1",
        ok=True, attempt=1, latency_ms=12.0, actor="local",
    )  # fmt: skip
    call = step_with(timeline(admin_client, run), "문서 내용")
    assert "not audited" not in call[2] and "status-ok" in call[0] and "1 attempt(s)" in call[2]


def test_the_summary_says_tokens_model_calls_cost_and_where_the_time_went(admin_client) -> None:
    Agent.objects.create(slug="ledger", name="장부", model_provider=Agent.Provider.BEDROCK)  # a model's run
    run = a_run(
        timings={"deterministic_ms": 3.5, "model_ms": 120.25, "tools_ms": 40, "total_ms": 170.5},
        token_usage={"input_tokens": 1200, "output_tokens": 80, "total_tokens": 1280, "model_calls": 2,
                     "cache_read_tokens": 1000, "model_calls_saved": 1},
        cost_micros=1234,
    )  # fmt: skip
    admin_client.cookies["django_language"] = "en"
    page = html.unescape(admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode())
    summary = re.sub(r"<[^>]+>", " ", page[page.index('class="run-summary"') : page.index('id="run-timeline"')])
    for words in (
        "170.5 ms in all",
        "deterministic 3.5 ms · model 120.25 ms · tools 40 ms",
        "tokens: 1,200 in, 80 out, 1,000 read from the cache",
        "model calls: 2 (1 saved by rules)",
        "cost: US$0.001234",
    ):
        assert words in summary, words


@pytest.mark.django_db
def test_a_conversations_earlier_answers_are_not_this_runs_model_turns_on_its_page(demo_server) -> None:
    """Tool selection for turn 1 went before the first *earlier* answer of the conversation (the engine counts only
    the run's own turns since the earlier answers stopped using up its iterations)."""
    from agents.admin_runs import _in_order, _trace_entries, run_timeline
    from agents.execution import run_execute
    from agents.models import Run

    script = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
        {"content": "답: {last_tool_result}"},
    ]
    agent = make_agent(
        slug="hist-page", servers=[demo_server], provider="scripted", script=script, with_demo_rules=False
    )
    agent.tool_selection = {"enabled": True, "top_k": 1}
    agent.save()
    for i in range(2):
        Run.objects.create(
            agent=agent, query=f"q{i}", answer=f"a{i}", status=Run.Status.SUCCEEDED, context={"contextId": "c-9"}
        )
    run = Run.objects.create(agent=agent, query="박도윤 님 팀?", context={"contextId": "c-9"})
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)

    ordered = _in_order([e for e in _trace_entries(run) if isinstance(e, dict)], {})
    first_selection = next(i for i, e in enumerate(ordered) if e.get("type") == "tool_selection")
    this_question = next(i for i, e in enumerate(ordered) if e.get("type") == "human" and e.get("content") == run.query)
    assert first_selection > this_question
    labels = [step.label for step in run_timeline(run)]
    assert labels.count("earlier answer in the conversation") == 2
    assert "model turn 1" in labels and "model turn 3" not in labels
