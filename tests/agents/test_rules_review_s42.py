"""The rule tester and a run share one deterministic stage and agree (review s42):

- a published version whose frozen contract no longer fits its tool: the dry run says what the gate does
  (``tool:out_of_date``, the run fails), not that the call goes out;
- a matched write tried through the gate is not sent, and is told as a run does it (it waits for a person), not
  as a failed call;
- a code rule that changes its input changes neither what the rules after it read nor the run's input;
- an answer template with a long run of ``|`` is checked in linear time;
- the tester's context lines give numbers as text, as callers send them (true, false and null as the rule editor reads them);
- the disabled rules a run would evaluate are listed, global ones too;
- keywords typed with a full-width comma are several keywords."""

from __future__ import annotations

import pytest

from agents.deterministic import placeholder_problems
from agents.models import DeterministicRule, Run
from agents.rule_form import _read_keywords, keywords_text, param_text, param_value
from agents.rule_tester import RuleTesterForm, rules_trial, trials_summary
from agents.services import agent_version_publish
from agents.tools import DeterministicContext, deterministic_tool
from audit.models import AuditEvent
from mcpregistry.models import McpTool, ToolContract
from mcpregistry.services import tool_contract_update
from tests.agents.test_rule_input_forms import run_now


@deterministic_tool(mcp_id="sds-company-data")
def route_popping_data(ctx: DeterministicContext) -> dict | None:
    """Takes the employee out of the data parts it is given, and the name out of the context."""
    for part in ctx.a2a_data or []:
        part.pop("employee", None)
    ctx.context.get("user", {}).pop("name", None)
    return None


@pytest.mark.django_db
def test_the_dry_run_of_a_version_says_the_gate_refuses_an_out_of_date_call(demo_agent, demo_server) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    # Rediscovered: the tool now takes "employee" only, where the version froze "name".
    McpTool.objects.filter(server=demo_server, name="search_employee").update(
        input_schema={
            "type": "object",
            "properties": {"employee": {"type": "string"}},
            "required": ["employee"],
            "additionalProperties": False,
        }
    )
    demo_agent.refresh_from_db()
    query = "김하늘 님 팀 알려줘"

    trials = rules_trial(
        agent=demo_agent,
        query=query,
        context={},
        a2a_data=[],
        execute=False,
        actor="t",
        version=demo_agent.live_version,
    )
    run = run_now(demo_agent, query)

    [matched] = [t for t in trials if t.matched]
    assert matched.tool == "search_employee"
    assert matched.verdict == "tool:out_of_date"
    assert matched.call_failure == "tool:out_of_date"
    assert [r["error"] for r in run.deterministic_results] == ["tool:out_of_date"]
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_failed")
    summary = trials_summary(trials)
    assert "deterministic:tool_failed" in summary
    assert "before the model" not in summary


@pytest.mark.django_db
def test_a_matched_write_tried_through_the_gate_is_not_sent_and_waits_as_in_a_run(demo_agent, demo_server) -> None:
    contract = ToolContract.objects.get(tool__server=demo_server, tool__name="get_asset_status")
    tool_contract_update(contract=contract, actor="t", via="tests", data={"risk": "write"})
    query = "A-1004 상태 알려줘"
    summaries = {}
    for execute in (False, True):
        trials = rules_trial(agent=demo_agent, query=query, context={}, a2a_data=[], execute=execute, actor="t")
        [matched] = [t for t in trials if t.matched]
        assert matched.tool == "get_asset_status"
        assert matched.waits_for_approval
        assert matched.call_failure == ""
        assert matched.result is None  # not sent, nor refused by the gate
        summaries[execute] = trials_summary(trials)
    assert summaries[True] == summaries[False]
    assert "approve" in summaries[True]
    assert "deterministic:tool_failed" not in summaries[True]
    assert not AuditEvent.objects.filter(action="tool.call", tool="get_asset_status").exists()

    run = run_now(demo_agent, query)
    assert run.status == Run.Status.AWAITING_APPROVAL


@pytest.mark.django_db
def test_a_code_rule_that_changes_its_input_changes_nothing_after_it(demo_agent, demo_server) -> None:
    DeterministicRule.objects.create(
        agent=demo_agent, name="pops", order=1, code="tests.agents.test_rules_review_s42.route_popping_data"
    )
    DeterministicRule.objects.create(
        agent=demo_agent,
        server=demo_server,
        name="after",
        order=2,
        tool_name="search_employee",
        when={"data": {"employee": "*"}},
        params={"name": "{data.employee}"},
    )
    data = [{"employee": "김하늘"}]
    context = {"user": {"name": "이몽룡"}}

    trials = rules_trial(agent=demo_agent, query="", context=context, a2a_data=data, execute=False, actor="t")
    run = run_now(demo_agent, "", a2a_data=[{"employee": "김하늘"}], context={"user": {"name": "이몽룡"}})

    after = next(t for t in trials if t.name == "after")
    assert after.matched, after.reason
    assert after.params == {"name": "김하늘"}
    assert (data, context) == ([{"employee": "김하늘"}], {"user": {"name": "이몽룡"}})
    assert [(r["rule"], r["args"]) for r in run.deterministic_results] == [("after", {"name": "김하늘"})]
    assert run.a2a_data == [{"employee": "김하늘"}]
    assert run.context == {"user": {"name": "이몽룡"}}


def test_an_answer_template_with_a_long_run_of_bars_is_checked_in_linear_time() -> None:
    # Quadratic before: 9.6 s at 40,000 bars, minutes at this size.
    problems = placeholder_problems({}, {}, "{a" + "|" * 300_000)
    assert problems == {"answer_template": ["a brace that opens or closes no placeholder: write {result.KEY} whole"]}
    closed = placeholder_problems({}, {}, "x {a|" + "|" * 300_000 + "} y")
    assert closed["answer_template"][0].startswith("{a||")
    assert closed["answer_template"][0].endswith("}: the words after | cannot hold |, { or }")
    assert placeholder_problems({}, {}, "{result.owner|a|b} and {query}")["answer_template"] == [
        "{result.owner|a|b}: the words after | cannot hold |, { or }"
    ]
    assert placeholder_problems({}, {}, "{result.owner|nobody} {query}") == {}


@pytest.mark.django_db
def test_the_testers_context_lines_give_numbers_as_text_as_callers_send_them(demo_agent, demo_server) -> None:
    """Numbers are text, as callers send ids; ``true``/``false``/``null`` are read as the rule editor reads them
    (s47: a boolean condition written in the editor as ``vip=true`` meets a run's JSON ``true``, never text)."""
    lines = 'empno=1234\n\nvip=true\nnone=null\nname="2024"\nuser={"id": 7}'
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "사번 조회", "context": lines})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["context"] == {
        "empno": "1234",
        "vip": True,
        "none": None,
        "name": "2024",
        "user": {"id": 7},
    }
    typed = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "context": '{"empno": 1234}'})
    assert typed.is_valid(), typed.errors
    assert typed.cleaned_data["context"] == {"empno": 1234}  # JSON stays typed
    bad = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "context": "empno=1\nempno=2"})
    assert not bad.is_valid()
    assert "line 2" in bad.errors["context"][0]

    DeterministicRule.objects.create(
        agent=demo_agent,
        server=demo_server,
        name="by number",
        order=1,
        tool_name="search_employee",
        when={"all_keywords": ["사번"]},
        params={"name": "{context.empno}"},
    )
    trials = rules_trial(
        agent=demo_agent, query="사번 조회", context=form.cleaned_data["context"], a2a_data=[], execute=False, actor="t"
    )
    run = run_now(demo_agent, "사번 조회", context={"empno": "1234"})
    assert (trials[0].params, trials[0].verdict) == ({"name": "1234"}, "ok")
    assert [(r["args"], r.get("error")) for r in run.deterministic_results] == [({"name": "1234"}, None)]


@pytest.mark.django_db
def test_the_disabled_rules_a_run_would_evaluate_are_listed_global_ones_too(
    admin_client, demo_agent, demo_server
) -> None:
    common = {"tool_name": "search_employee", "when": {"all_keywords": ["팀"]}, "params": {"name": "x"}}
    DeterministicRule.objects.create(
        agent=None, server=demo_server, name="global off", order=1, enabled=False, **common
    )
    DeterministicRule.objects.create(
        agent=demo_agent, server=demo_server, name="own off", order=2, enabled=False, **common
    )
    DeterministicRule.objects.create(
        agent=None,
        name="global code off",
        order=3,
        enabled=False,
        code="tests.agents.test_rules_review_s42.route_popping_data",
    )
    # Not of this agent: its server is not bound.
    other = demo_server.__class__.objects.create(mcp_id="not-bound", name="not bound", transport="stdio")
    DeterministicRule.objects.create(agent=None, server=other, name="elsewhere off", order=4, enabled=False, **common)

    page = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "김하늘 님 팀", "tested": "stored"}
    ).content.decode()

    assert "Not evaluated, disabled: global off, own off, global code off." in page


def test_keywords_typed_with_a_full_width_comma_are_several() -> None:
    assert _read_keywords("인원，명단") == ["인원", "명단"]
    assert _read_keywords("인원、명단, 목록") == ["인원", "명단", "목록"]
    assert param_value("3F，4F", "list") == ["3F", "4F"]
    # A word holding one is shown as JSON, so that it reads back as itself.
    assert _read_keywords(keywords_text(["인원，명단"])) == ["인원，명단"]
    assert param_value(param_text(["3F，4F"], "list"), "list") == ["3F，4F"]
