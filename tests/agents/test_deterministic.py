from __future__ import annotations

from agents.deterministic import RuleSpec, decide, placeholder_problems, render_answer, render_params


def test_a_regex_named_group_fills_the_params_template() -> None:
    rule = RuleSpec(
        rule_id=1,
        name="소속",
        mcp_id="sds",
        tool_name="search_employee",
        when={"regex": r"(?P<name>[가-힣]{2,4})\s*님", "any_keywords": ["소속"]},
        params={"name": "{match.name}"},
    )
    decision = decide(rule, query="김하늘 님은 어느 팀 소속인가요?", context={}, a2a_data=None, available_tools=set())
    assert decision.matched
    assert decision.params == {"name": "김하늘"}


def test_all_keywords_must_all_be_present() -> None:
    rule = RuleSpec(
        1, "주문", "orders", "get_order", when={"all_keywords": ["주문", "조회"]}, params={"query": "{query}"}
    )
    assert decide(rule, query="주문 조회 부탁해", context={}, a2a_data=None, available_tools=set()).params == {
        "query": "주문 조회 부탁해"
    }
    skipped = decide(rule, query="주문 취소", context={}, a2a_data=None, available_tools=set())
    assert not skipped.matched
    assert "조회" in skipped.reason


def test_a_rule_with_no_matching_keyword_is_skipped_with_a_reason() -> None:
    rule = RuleSpec(1, "인원", "sds", "list_team_members", when={"any_keywords": ["인원", "명단"]})
    decision = decide(rule, query="날씨 어때?", context={}, a2a_data=None, available_tools=set())
    assert not decision.matched
    assert decision.reason == "none of the keywords present"


def test_context_and_data_placeholders_keep_their_types() -> None:
    params = render_params(
        {"customer_id": "{context.userId}", "limit": "{data.page.size}", "note": "q={query}"},
        query="고객 조회",
        context={"userId": "u-1"},
        a2a_data=[{"page": {"size": 2}}],
        match={},
    )
    assert params == {"customer_id": "u-1", "limit": 2, "note": "q=고객 조회"}


def test_a_missing_placeholder_value_skips_the_rule() -> None:
    rule = RuleSpec(1, "crm", "crm", "get_customer", when={}, params={"id": "{context.userId}"})
    decision = decide(rule, query="hi", context={}, a2a_data=None, available_tools=set())
    assert not decision.matched
    assert "context.userId" in decision.reason


def test_an_answer_template_reads_keys_of_a_json_result() -> None:
    text = render_answer(
        "{result.name} 님은 {result.team} 소속입니다.",
        query="",
        match={},
        params={},
        value={"name": "김하늘", "team": "클라우드운영팀"},
    )
    assert text == "김하늘 님은 클라우드운영팀 소속입니다."


def test_an_answer_template_falls_back_to_the_tools_own_text() -> None:
    text = render_answer("{result.team}", query="", match={}, params={}, value="'홍길동' 직원을 찾을 수 없습니다.")
    assert text == "'홍길동' 직원을 찾을 수 없습니다."


def test_an_answer_template_takes_a_key_from_every_item_of_a_list_and_reads_as_a_list() -> None:
    assets = {"count": 2, "assets": [{"model": "갤럭시북4 프로", "type": "노트북"}, {"model": "U2723QE"}]}
    projects = [{"name": "차세대 물류 플랫폼 구축"}, {"name": "클라우드 비용 최적화"}]

    def render(template: str, value: object) -> str:
        return render_answer(template, query="q", match={}, params={"owner": "김하늘"}, value=value)

    assert render("{params.owner} 님 자산 {result.count}건: {result.assets.*.model}", assets) == (
        "김하늘 님 자산 2건: 갤럭시북4 프로, U2723QE"
    )
    assert render("프로젝트: {result.*.name}", projects) == "프로젝트: 차세대 물류 플랫폼 구축, 클라우드 비용 최적화"
    assert render("종류: {result.assets.*.type}", assets) == "종류: 노트북"  # items without the key are left out
    assert render("{result.*.name}", "'물류팀' 팀의 프로젝트가 없습니다.") == "'물류팀' 팀의 프로젝트가 없습니다."
    assert placeholder_problems({}, {}, "{result.assets.*.model} {result.*.name}") == {}


def test_a_broken_regex_is_told_once_in_plain_words_not_as_missing_groups_too() -> None:
    from pydantic import ValidationError

    from agents.deterministic import WhenSpec
    from mcpregistry.contracts import spec_problems

    try:
        WhenSpec.model_validate({"regex": "(?P<name>[가-힣"})
    except ValidationError as exc:
        assert spec_problems(exc, WhenSpec) == [
            "regex: not a valid regular expression: a character set [ is not closed with ] (at character 10)"
        ]
    else:
        raise AssertionError("a broken regex was taken")
    assert placeholder_problems({"regex": "(?P<name>[가-힣"}, {"who": "{match.name}"}, "") == {}
