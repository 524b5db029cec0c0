"""A rule decision's stored reason (stable English, as the stage writes it) is shown in the reader's language."""

from __future__ import annotations

import pytest
from django.utils import translation

from agents.decision_reasons import reason_text
from agents.deterministic import RuleSpec, decide


@pytest.mark.parametrize(
    ("reason", "korean"),
    [
        ("matched", "일치"),
        ("none of the keywords present", "질의에 키워드가 하나도 없음"),
        ("regex did not match", "정규식이 일치하지 않음"),
        ("keyword missing: 소속", "키워드 없음: 소속"),
        ("context.tier is not 3", "context.tier 값이 3이(가) 아님"),
        ("data.order.id absent", "data.order.id 없음"),
        ("tool search_employee not available", "search_employee 도구를 쓸 수 없음"),
        ("no value for {match.name}", "{match.name}에 넣을 값이 없음"),
        ("a reason the stage does not write", "a reason the stage does not write"),
    ],
)
def test_each_reason_the_stage_writes_reads_in_korean(reason: str, korean: str) -> None:
    with translation.override("ko"):
        assert reason_text(reason) == korean


def test_the_reasons_a_rule_really_gives_are_all_known() -> None:
    """The reasons above are the ones evaluate_rule writes: a new one left untranslated fails here."""
    rules = [
        RuleSpec(rule_id=1, name="a", mcp_id="m", tool_name="t", when={"all_keywords": ["팀", "소속"]}),
        RuleSpec(rule_id=2, name="b", mcp_id="m", tool_name="t", when={"any_keywords": ["자산"]}),
        RuleSpec(rule_id=3, name="c", mcp_id="m", tool_name="t", when={"regex": "(?P<n>A-\\d+)"}),
        RuleSpec(rule_id=4, name="d", mcp_id="m", tool_name="t", when={"context": {"tier": 3}}),
        RuleSpec(rule_id=5, name="e", mcp_id="m", tool_name="t", when={"data": {"order.id": "*"}}),
        RuleSpec(rule_id=6, name="f", mcp_id="m", tool_name="t", when={"tool_available": "x"}),
        RuleSpec(rule_id=7, name="g", mcp_id="m", tool_name="t", params={"n": "{context.user}"}),
    ]
    with translation.override("ko"):
        for rule in rules:
            decision = decide(rule, query="팀 질문", context={}, a2a_data=[], available_tools=set())
            assert not decision.matched
            assert reason_text(decision.reason) != decision.reason, decision.reason
