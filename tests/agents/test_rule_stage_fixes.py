"""Defects of the deterministic stage and the rule tester found in review: a code rule's parameters are shown
masked as their audit event records them (the run's trace and page, the rule tester), while the tool is sent
them as they are; a rule that ends the run is a decision in the trace, the run's events and the audit; the rule
tester's JSON nests no deeper than the API's; keywords meet a query across no-break spaces and full-width
letters."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

from agents.deterministic import match_conditions
from agents.models import Agent, DeterministicRule, Run, RunEvent
from agents.rule_tester import RuleTrial, rules_trial
from agents.tools import DeterministicContext, deterministic_tool
from audit.masking import MASK
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests.agents.test_rule_input_forms import run_now
from tests.conftest import DEMO_SECRET, make_agent

pytestmark = pytest.mark.django_db

HERE = "tests.agents.test_rule_stage_fixes"
PASSWORD = "hunter2-Zq9x"
TEAM_QUERY = "김하늘 님은 어느 팀 소속인가요?"
TRIED = "Rules, in evaluation order"  # the heading of a trial's results


@deterministic_tool(mcp_id="sds-company-data")
def route_with_secrets(ctx: DeterministicContext) -> dict[str, Any]:
    """Sends the server's own bound secret (in a text) and a value under a secret key name."""
    return {"tool_name": "search_employee", "params": {"name": f"김하늘 {DEMO_SECRET}", "password": PASSWORD}}


@deterministic_tool(mcp_id="sds-company-data")
def route_that_raises(ctx: DeterministicContext) -> dict[str, Any]:
    raise KeyError("orderId")


def _agent_with_code_rule(slug: str, server: McpServer, function: str, *, demo_rules: bool = False) -> Agent:
    agent = make_agent(slug=slug, servers=[server], with_demo_rules=demo_rules)
    DeterministicRule.objects.create(agent=agent, name=function, order=500, code=f"{HERE}.{function}")
    return agent


def _page_text(response: Any) -> str:
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def _trial(agent: Agent, query: str, *, execute: bool = False) -> list[RuleTrial]:
    return rules_trial(agent=agent, query=query, context={}, a2a_data=[], execute=execute, actor="rule-tester:t")


# ---- 1. a code rule's parameters, masked wherever they are shown ---------------------------------------------------


def test_a_code_rules_params_are_masked_in_the_trace_as_its_audit_event_masks_them_and_sent_as_they_are(
    demo_server: McpServer, auditor_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _agent_with_code_rule("secretive", demo_server, "route_with_secrets")
    sent: list[dict[str, Any]] = []
    real_call = gate.call

    def call_recorded(**kwargs: Any) -> gate.ToolResult:
        sent.append(kwargs["args"])
        return real_call(**kwargs)

    monkeypatch.setattr(gate, "call", call_recorded)
    run = run_now(agent, "q")

    assert sent == [{"name": f"김하늘 {DEMO_SECRET}", "password": PASSWORD}]  # the tool is sent the real ones
    decision = next(entry for entry in run.messages if entry.get("type") == "rule")
    audited = AuditEvent.objects.get(run_id=run.id, action="rule.decision")
    assert decision["params"] == audited.args == {"name": f"김하늘 {MASK}", "password": MASK}
    stored = json.dumps([run.messages, list(RunEvent.objects.filter(run=run).values_list("data", flat=True))])
    assert DEMO_SECRET not in stored and PASSWORD not in stored
    page = _page_text(auditor_client.get(f"/admin/agents/run/{run.pk}/change/"))  # "arguments (masked)"
    assert f"김하늘 {MASK}" in page
    assert DEMO_SECRET not in page and PASSWORD not in page


@pytest.mark.parametrize("execute", [False, True], ids=["dry run", "through the gate"])
def test_the_rule_tester_shows_a_code_rules_params_masked_as_a_run_records_them(
    admin_client: Any, demo_server: McpServer, execute: bool
) -> None:
    agent = _agent_with_code_rule("secretive", demo_server, "route_with_secrets")
    (trial,) = _trial(agent, "q", execute=execute)
    assert trial.params == {"name": f"김하늘 {MASK}", "password": MASK}
    form = {"agent": agent.pk, "query": "q", **({"execute": "on"} if execute else {})}
    page = _page_text(admin_client.post("/admin/agents/rule-tester/", form))
    assert f"김하늘 {MASK}" in page
    assert DEMO_SECRET not in page and PASSWORD not in page


# ---- 2. a rule that ends the run is a decision too -------------------------------------------------------------------


def test_a_rule_that_raises_is_recorded_in_the_trace_the_events_and_the_audit_with_its_reason_code(
    demo_server: McpServer,
) -> None:
    agent = _agent_with_code_rule("raising", demo_server, "route_that_raises", demo_rules=True)
    rule = agent.rules.get(name="route_that_raises")
    run = run_now(agent, TEAM_QUERY)

    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:rule_error")
    assert run.error_message == "확정 호출된 MCP 단계에서 오류가 발생했습니다: route_that_raises raised KeyError"
    assert run.messages[-1] == {
        "type": "rule",
        "rule_id": rule.pk,
        "rule": "route_that_raises",
        "matched": False,
        "reason": "deterministic:rule_error",
        "params": None,
        "mcp_id": "sds-company-data",
        "tool": "",
    }
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", "data"))
    assert [kind for kind, _data in events][-2:] == ["rule", "status"]
    assert events[-2][1]["reason"] == "deterministic:rule_error"
    audited = list(AuditEvent.objects.filter(run_id=run.id).order_by("id"))
    recorded = [(e.action, e.reason) for e in audited]
    assert recorded[0] == ("rule.decision", "rule:matched") and recorded[1][0] == "tool.call"
    assert recorded[-1] == ("rule.decision", "deterministic:rule_error")  # the last, in the order of the stage
    failed = audited[-1]
    assert (failed.call_id, failed.ok, failed.source) == (f"rule:{rule.pk}", False, "deterministic")
    assert failed.result["message"] == run.error_message
    # The rule tester runs the same stage: the same decision, at the same rule.
    last = _trial(agent, TEAM_QUERY)[-1]
    assert (last.name, last.failed) == ("route_that_raises", True)
    assert last.reason == f"deterministic:rule_error: {run.error_message}"


def test_a_matched_rule_whose_server_is_disabled_is_recorded_as_mcp_not_loaded(demo_server: McpServer) -> None:
    agent = make_agent(slug="unloaded", servers=[demo_server])
    McpServer.objects.filter(pk=demo_server.pk).update(enabled=False)
    run = run_now(agent, TEAM_QUERY)

    assert (run.status, run.error_code) == (Run.Status.FAILED, "mcp:not_loaded:sds-company-data")
    assert run.error_message == "MCP 'sds-company-data'의 tool이 로드되지 않음"
    audited = AuditEvent.objects.get(run_id=run.id, action="rule.decision", ok=False)
    assert (audited.reason, audited.mcp_id, audited.tool) == (
        "mcp:not_loaded:sds-company-data",
        "sds-company-data",
        "search_employee",
    )
    assert RunEvent.objects.filter(run=run, kind="rule", data__reason="mcp:not_loaded:sds-company-data").exists()


# ---- 3. the rule tester's JSON nests no deeper than the API's -------------------------------------------------------


def _nested(depth: int) -> str:
    """A JSON object ``depth`` levels deep."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def _field_errors(page: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", e) for e in re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)]


@pytest.mark.parametrize(
    ("field", "text", "depth"),
    [
        *(("context", _nested, depth) for depth in (33, 700, 5000)),
        *(("a2a_data", lambda depth: f"[{_nested(depth - 1)}]", depth) for depth in (33, 700, 5000)),
        # A KEY=value line's value is JSON where it reads as JSON (past Python's parser's own limit it is text).
        *(("context", lambda depth: f"order={_nested(depth - 1)}", depth) for depth in (33, 700)),
    ],
    ids=[*(f"context JSON {d}" for d in (33, 700, 5000)), *(f"data JSON {d}" for d in (33, 700, 5000))]
    + [f"context line {d}" for d in (33, 700)],
)
def test_the_rule_testers_json_deeper_than_the_api_takes_is_refused_in_the_apis_words(
    admin_client: Any, demo_agent: Agent, settings: Any, field: str, text: Any, depth: int
) -> None:
    assert settings.PLATFORM_API_MAX_JSON_DEPTH == 32
    page = _page_text(
        admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "q", field: text(depth)})
    )
    assert "JSON nested deeper than 32 levels." in _field_errors(page)
    assert TRIED not in page


def test_the_rule_testers_json_as_deep_as_the_api_takes_is_tried(admin_client: Any, demo_agent: Agent) -> None:
    page = _page_text(
        admin_client.post(
            "/admin/agents/rule-tester/",
            {"agent": demo_agent.pk, "query": TEAM_QUERY, "context": _nested(32), "a2a_data": f"[{_nested(31)}]"},
        )
    )
    assert _field_errors(page) == []
    assert TRIED in page


# ---- 4. keywords across spaces and widths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "query"),
    [
        ("몇 명", "클라우드운영팀 몇\u00a0명인가요?"),  # a no-break space, pasted from a web page
        ("몇 명", "클라우드운영팀 몇\u3000명인가요?"),  # an ideographic space, from a Korean input method
        ("몇 명", "클라우드운영팀 몇  \t명인가요?"),  # a run of whitespace
        ("VPN", "ＶＰＮ 접속이 안 돼요"),  # full-width letters
        ("ｖｐｎ", "VPN 접속이 안 돼요"),  # and the other way round
    ],
)
def test_a_keyword_meets_the_query_across_spaces_and_widths(keyword: str, query: str) -> None:
    for when in ({"all_keywords": [keyword]}, {"any_keywords": ["없는 말", keyword]}):
        assert match_conditions(when, query=query, context={}, a2a_data=None, available_tools=set())[:2] == (
            True,
            "matched",
        )


def test_a_keyword_still_misses_what_the_query_does_not_say_and_a_regex_meets_full_width_text() -> None:
    def matched(when: dict[str, Any], query: str) -> bool:
        return match_conditions(when, query=query, context={}, a2a_data=None, available_tools=set())[0]

    # A keyword's space between two Hangul syllables may be left out (since 2026-12-06), never added: "몇명" is not
    # looked for across words ("사원" in "회사 원격").
    assert matched({"all_keywords": ["몇 명"]}, "몇명인가요?") and not matched(
        {"all_keywords": ["몇명"]}, "몇 명인가요?"
    )
    assert not matched({"all_keywords": ["VPN"]}, "V P N")
    # A query typed in full-width mode meets a regex as a keyword does (since 2026-12-07: "Ａ-１００４" met no
    # `A-\d{4}` rule while "ＶＰＮ" met the keyword "VPN"): tried as typed, then compatibility-composed (NFKC).
    assert matched({"regex": "VPN"}, "ＶＰＮ 접속")
    assert matched({"regex": "ＶＰＮ"}, "ＶＰＮ 접속")
    # A keyword's own spaces around it stay (one each): " VPN " is a word of its own.
    assert matched({"all_keywords": [" VPN "]}, "사내\u00a0ＶＰＮ\u3000접속")
    assert not matched({"all_keywords": [" VPN "]}, "사내 VPN접속")


def test_the_rule_tester_and_a_run_match_a_keyword_across_a_no_break_space(
    demo_agent: Agent, admin_client: Any
) -> None:
    query = "클라우드운영팀 몇\u00a0명인가요?"
    matched = [t.tool for t in _trial(demo_agent, query) if t.matched]
    assert matched == ["list_team_members"]
    run = run_now(demo_agent, query)
    assert [r["tool"] for r in run.deterministic_results] == ["list_team_members"]
