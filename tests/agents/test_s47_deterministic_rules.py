"""Rule matching after the s47 review: a path step that is a digit but no decimal number (``①``, ``²``) names no
list item, and a rule's condition, its params or its answer template that holds one is a value (skipped, or the
tool's own text), never the ``ValueError`` that ended its run ``internal``."""

from __future__ import annotations

import pytest

from agents.deterministic import RuleSpec, decide, render_answer
from agents.models import Agent, DeterministicRule
from tests.agents.test_deterministic_rules import no_model_was_called, run, seed_agent  # noqa: F401 - a fixture


def rule(**fields: object) -> RuleSpec:
    return RuleSpec(rule_id=1, name="행 조회", mcp_id="sds-company-data", tool_name="get_asset", **fields)  # type: ignore[arg-type]


def test_a_circled_digit_in_a_data_condition_is_a_path_absent_from_a_list() -> None:
    decided = decide(
        rule(when={"data": {"rows.①": "*"}}),
        query="자산 조회",
        context={},
        a2a_data=[{"rows": ["A-1004"]}],
        available_tools={"get_asset"},
    )
    assert (decided.matched, decided.code, decided.reason) == (False, "rule:data", "data.rows.① absent")
    # An object's key written so is found as it is, and a decimal index (full-width too) still reads a list.
    keyed = decide(
        rule(when={"data": {"rows.①": "*"}}, params={"first": "{data.rows.0}", "wide": "{data.rows.０}"}),
        query="자산 조회",
        context={},
        a2a_data=[{"rows": {"①": "A-1004"}}, {"rows": ["A-1001"]}],
        available_tools={"get_asset"},
    )
    assert (keyed.matched, keyed.params) == (True, {"first": "A-1001", "wide": "A-1001"})


def test_a_superscript_digit_in_a_context_placeholder_skips_the_rule() -> None:
    decided = decide(
        rule(params={"owner": "{context.owners.²}"}),
        query="자산 조회",
        context={"owners": ["김하늘", "이서준", "박민지"]},
        a2a_data=None,
        available_tools={"get_asset"},
    )
    assert (decided.matched, decided.code, decided.reason) == (False, "rule:params", "no value for {context.owners.²}")


def test_a_circled_digit_in_an_answer_template_reads_as_no_value() -> None:
    value = {"count": 2, "assets": [{"model": "그램 16"}, {"model": "델 모니터"}]}
    phrased = render_answer(
        "첫 자산: {result.assets.①.model|없음} ({result.count}건)", query="q", match={}, params={}, value=value
    )
    assert phrased == "첫 자산: 없음 (2건)"
    # Without its own words for no value, the answer is the tool's own text.
    plain = render_answer("{result.assets.①.model}", query="q", match={}, params={}, value=value)
    assert plain == '{"count": 2, "assets": [{"model": "그램 16"}, {"model": "델 모니터"}]}'


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["route_that_exits", "route_that_parses_its_query"])
def test_a_code_rule_that_calls_sys_exit_fails_its_run_as_a_rule_error(seed_agent: Agent, name: str) -> None:  # noqa: F811
    """``SystemExit`` out of a code rule (``sys.exit()``, argparse refusing its input) left the stage and the
    engine: in a worker's pool process it ended the process, the run redelivered to fail the same way until its
    deliveries ran out. It is the rule's bug, told as ``deterministic:rule_error`` before the model is asked, as a
    rule that raises anything else (and as a flow's ``sys.exit()``)."""
    DeterministicRule.objects.create(agent=seed_agent, name=name, code=f"tests.deterministic_defect_rules.{name}")
    result = run(seed_agent, "주문 조회")
    assert (result.status, result.error_code) == ("failed", "deterministic:rule_error")
    assert "SystemExit" in result.error_message
    assert no_model_was_called(result)


@pytest.mark.django_db
def test_a_code_rules_params_nested_past_what_json_writes_are_a_rule_error(seed_agent: Agent) -> None:  # noqa: F811
    """A ``RecursionError`` out of the params' JSON check ended the run ``internal``."""
    name = "route_with_params_nested_too_deep"
    DeterministicRule.objects.create(agent=seed_agent, name=name, code=f"tests.deterministic_defect_rules.{name}")
    result = run(seed_agent, "주문 조회")
    assert (result.status, result.error_code) == ("failed", "deterministic:rule_error")
    assert no_model_was_called(result)
