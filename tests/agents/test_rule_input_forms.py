"""What a rule reads, whatever form it comes in, and what the rule tester tests:

- Korean typed decomposed (NFD: macOS, iOS, a pasted file name) meets the rules written composed (NFC), in the
  query, the context and the data; a run stores its input composed, so its tools get it composed too;
- a regex that backtracks catastrophically gives up on a query made for it, instead of holding the worker;
- the rule tester tests what live traffic runs (the live version's frozen rules), or the agent as stored or a
  numbered version when asked, and reads its input as a run stores it (the servers' secrets masked);
- an admin rule for a server the agent does not bind fails only the runs it matches (it failed every run)."""

from __future__ import annotations

import time
import unicodedata

import pytest
from django.core.exceptions import ValidationError

from agents.deterministic import WhenSpec, match_conditions, placeholder_problems, render_params
from agents.execution import run_execute
from agents.models import DeterministicRule, Run
from agents.rule_tester import rules_trial
from agents.services import agent_version_publish, deterministic_rule_update, run_create, run_input_guarded
from tests.conftest import DEMO_SECRET

QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def nfd(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    assert decomposed != text
    return decomposed


def run_now(agent, query: str, **kwargs) -> Run:
    run = run_create(agent_slug=agent.slug, query=query, api_key=None, **kwargs)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def test_keywords_regexes_context_and_data_meet_decomposed_korean() -> None:
    when = {
        "all_keywords": ["주문"],
        "regex": r"(?P<팀>[가-힣]+팀)",
        "context": {"team": "클라우드운영팀"},
        "data": {"고객.등급": "우수"},
    }
    matched, reason, groups = match_conditions(  # the input as a run stores it
        when,
        query=run_input_guarded(nfd("주문 건은 클라우드운영팀 담당"), []),
        context=run_input_guarded({"team": nfd("클라우드운영팀")}, []),
        a2a_data=run_input_guarded([{nfd("고객"): {nfd("등급"): nfd("우수")}}], []),
        available_tools=set(),
    )
    assert (matched, reason) == (True, "matched")
    assert groups == {"팀": "클라우드운영팀"}  # composed: what the tool is sent


@pytest.mark.django_db
def test_a_decomposed_question_runs_the_rules_a_composed_one_does(demo_agent) -> None:
    composed = run_now(demo_agent, QUESTION)
    decomposed = run_now(demo_agent, nfd(QUESTION))

    assert decomposed.status == Run.Status.SUCCEEDED
    assert [r["tool"] for r in decomposed.deterministic_results] == ["search_employee"]
    assert decomposed.answer == composed.answer and "클라우드운영팀" in decomposed.answer
    assert decomposed.query == QUESTION  # stored composed


def test_a_catastrophic_regex_gives_up_on_a_query_made_for_it() -> None:
    when = WhenSpec.model_validate({"regex": "(a|aa)+$"}).model_dump(exclude_defaults=True)
    began = time.monotonic()
    matched, reason, _groups = match_conditions(
        when, query="a" * 60 + "!", context={}, a2a_data=None, available_tools=set()
    )
    assert time.monotonic() - began < 5  # unbounded, 2^60 steps
    assert not matched and reason.startswith("regex gave up after 0.1 s")
    assert match_conditions(when, query="aaa", context={}, a2a_data=None, available_tools=set())[0]


def test_a_placeholder_inside_text_writes_a_value_as_the_answer_template_does() -> None:
    rendered = render_params(
        {"note": "고객 {data.customer} 태그 {data.tags} vip={context.vip}"},
        query="",
        context={"vip": True},
        a2a_data=[{"customer": {"name": "김"}, "tags": ["a", "b"]}],
        match={},
    )
    assert rendered == {"note": '고객 {"name": "김"} 태그 a, b vip=true'}


def test_a_korean_group_name_is_a_placeholder_in_the_params_as_in_the_answer() -> None:
    when = {"regex": r"(?P<팀>[가-힣]+팀)"}
    assert placeholder_problems(when, {"team": "{match.팀}"}, "{match.팀} 소속") == {}
    assert render_params({"team": "{match.팀}"}, query="", context={}, a2a_data=None, match={"팀": "인사팀"}) == {
        "team": "인사팀"
    }


@pytest.mark.django_db
def test_an_empty_keyword_is_refused_where_the_conditions_change(demo_agent, demo_server) -> None:
    from agents.services import deterministic_rule_create, deterministic_rule_update

    data = {"agent": demo_agent, "server": demo_server, "name": "빈 키워드", "tool_name": "search_employee"}
    with pytest.raises(ValidationError) as refused:
        deterministic_rule_create(actor="t", via="tests", data={**data, "when": {"any_keywords": ["", "팀"]}})
    assert "any_keywords: an empty keyword matches every query" in str(refused.value)
    stored = DeterministicRule.objects.create(**data, when={"any_keywords": ["", "팀"]}, params={"name": "{query}"})
    deterministic_rule_update(rule=stored, actor="t", via="tests", data={"order": 9})  # stored before: it saves


@pytest.mark.django_db
def test_the_tester_tests_the_live_version_unless_asked_for_the_agent_as_stored(admin_client, demo_agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="search_employee")
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"enabled": False})  # a draft change
    demo_agent.refresh_from_db()

    run = run_now(demo_agent, QUESTION)
    live = rules_trial(
        agent=demo_agent,
        query=QUESTION,
        context={},
        a2a_data=[],
        execute=False,
        actor="t",
        version=demo_agent.live_version,
    )
    assert [r["tool"] for r in run.deterministic_results] == ["search_employee"]
    assert {t.tool for t in live if t.matched} == {"search_employee"}

    page = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": QUESTION}).content.decode()
    assert "Tested: the rules, servers and contracts of company-assistant v1 (live)." in page
    stored = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": QUESTION, "tested": "stored"}
    ).content.decode()
    assert "of company-assistant as stored." in stored and "search_employee" not in stored.split("Tested:")[1]
    missing = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": QUESTION, "tested": "version", "version": 9}
    ).content.decode()
    assert "company-assistant has no version 9; its versions: 1" in missing


@pytest.mark.django_db
def test_the_tester_masks_a_servers_secret_in_its_input_as_a_run_does(admin_client, demo_agent, demo_server) -> None:
    DeterministicRule.objects.filter(agent=demo_agent).delete()
    DeterministicRule.objects.create(
        agent=demo_agent,
        server=demo_server,
        name="echo",
        order=1,
        tool_name="search_employee",
        when={"any_keywords": ["찾아"]},
        params={"name": "{query}"},
    )
    query = f"{DEMO_SECRET} 찾아"
    page = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": query}).content.decode()
    run = run_now(demo_agent, query)

    assert DEMO_SECRET not in page and "*** 찾아" in page
    assert [r["args"] for r in run.deterministic_results] == [{"name": "*** 찾아"}]


@pytest.mark.django_db
def test_an_admin_rule_for_an_unbound_server_fails_only_the_runs_it_matches(demo_agent) -> None:
    from mcpregistry.models import McpServer

    other = McpServer.objects.create(mcp_id="elsewhere", name="elsewhere", url="http://127.0.0.1:9/mcp")
    DeterministicRule.objects.create(  # stored as it may be (an import, an unbinding): the service now refuses it
        agent=demo_agent, server=other, name="left behind", order=0, tool_name="x", when={"any_keywords": ["zzz"]}
    )
    answered = run_now(demo_agent, QUESTION)
    matched = run_now(demo_agent, "zzz")

    assert answered.status == Run.Status.SUCCEEDED, (answered.error_code, answered.error_message)
    assert (matched.status, matched.error_code) == (Run.Status.FAILED, "mcp:not_loaded:elsewhere")
    assert "MCP 'elsewhere'의 tool이 로드되지 않음" in matched.error_message


@pytest.mark.django_db
def test_a_rule_for_a_server_its_agent_does_not_bind_is_refused(demo_agent) -> None:
    from agents.services import deterministic_rule_create
    from mcpregistry.models import McpServer

    other = McpServer.objects.create(mcp_id="elsewhere", name="elsewhere", url="http://127.0.0.1:9/mcp")
    with pytest.raises(ValidationError) as refused:
        deterministic_rule_create(
            actor="t",
            via="tests",
            data={"agent": demo_agent, "server": other, "name": "r", "tool_name": "x", "when": {}},
        )
    assert "which this agent does not bind" in str(refused.value)


@pytest.mark.django_db
def test_an_agent_keeps_the_servers_its_enabled_rules_call(demo_agent, demo_server) -> None:
    from agents.services import agent_update

    with pytest.raises(ValidationError) as refused:
        agent_update(agent=demo_agent, actor="t", via="tests", servers=[])
    assert "These enabled rules call a server the agent would no longer bind" in str(refused.value)
    assert "(sds-company-data)" in str(refused.value)
    assert list(demo_agent.servers.all()) == [demo_server]

    DeterministicRule.objects.filter(agent=demo_agent).update(enabled=False)
    agent_update(agent=demo_agent, actor="t", via="tests", servers=[])
    assert not demo_agent.servers.exists()


@pytest.mark.django_db
def test_the_agent_page_says_which_rules_keep_a_server_bound(admin_client, demo_server) -> None:
    from agents.models import Agent
    from tests.agents.test_agent_form import agent_post

    assert admin_client.post("/admin/agents/agent/add/", agent_post(servers=[demo_server.pk])).status_code == 302
    agent = Agent.objects.get(slug="flowing")
    DeterministicRule.objects.create(
        agent=agent, server=demo_server, name="사원 조회", order=1, tool_name="search_employee", when={}
    )

    page = admin_client.post(f"/admin/agents/agent/{agent.pk}/change/", agent_post(servers=[]))

    assert page.status_code == 200
    assert "These enabled rules call a server the agent would no longer bind: 사원 조회 (sds-company-data)" in (
        page.content.decode()
    )
    assert list(agent.servers.all()) == [demo_server]


def test_composing_keeps_a_compatibility_hanja_as_written() -> None:
    from agent_platform.text import nfc

    written = "\uf914 " + unicodedata.normalize("NFD", "김하늘")  # 樂 (KS X 1001's duplicate), decomposed Korean
    assert nfc(written) == "\uf914 김하늘"


def test_the_new_reasons_read_in_korean() -> None:
    from django.utils import translation

    from agents.decision_reasons import reason_text
    from audit.labels import reason_label

    with translation.override("ko"):
        assert (
            reason_text("regex gave up after 0.1 s on this query")
            == "정규식이 이 질의에서 0.1초 후 검사를 포기했습니다"
        )
        assert reason_label("args:unknown") == "도구에 없는 인자"


@pytest.mark.django_db
def test_the_tester_takes_a_typed_version_number_and_asks_for_one_it_lacks(admin_client, demo_agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    typed = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": QUESTION, "tested": "live", "version": 1}
    ).content.decode()
    assert "of company-assistant v1 (live)." in typed
    missing = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": QUESTION, "tested": "version"}
    ).content.decode()
    assert "Enter a version number (its versions: 1)." in missing


@pytest.mark.django_db
def test_a_forced_tool_choice_must_name_a_tool_of_the_chosen_servers(admin_client, demo_server) -> None:
    from tests.agents.test_agent_form import agent_post

    post = agent_post(
        model_provider="openai_compatible",
        model_id="m",
        servers=[demo_server.pk],
        model_params='{"base_url": "https://llm.example.com/v1", "tool_choice": "no_such_tool"}',
    )
    page = admin_client.post("/admin/agents/agent/add/", post).content.decode()
    assert "tool_choice: &#x27;no_such_tool&#x27; is no tool of the chosen servers" in page
    post["model_params"] = '{"base_url": "https://llm.example.com/v1", "tool_choice": "search_employee"}'
    assert admin_client.post("/admin/agents/agent/add/", post).status_code == 302


@pytest.mark.django_db
def test_the_tester_says_what_a_run_would_do_and_names_the_disabled_rules(admin_client, demo_agent) -> None:
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="list_projects")
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"enabled": False})
    matched = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": QUESTION}).content
    page = matched.decode()
    assert "rules matched: a run calls sds-company-data.search_employee before the model." in page
    assert f"Not evaluated, disabled: {rule.name}." in page
    none = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "안녕하세요"}).content
    assert "No rule matched: a run goes to the model" in none.decode()


@pytest.mark.django_db
def test_the_tester_says_a_run_would_fail_at_a_rule_for_an_unbound_server(admin_client, demo_agent) -> None:
    from mcpregistry.models import McpServer

    other = McpServer.objects.create(mcp_id="elsewhere", name="elsewhere", url="http://127.0.0.1:9/mcp")
    DeterministicRule.objects.create(
        agent=demo_agent, server=other, name="left behind", order=0, tool_name="x", when={"any_keywords": ["zzz"]}
    )
    page = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "zzz"}).content.decode()
    assert "A run would fail at rule left behind (mcp:not_loaded:elsewhere" in page
