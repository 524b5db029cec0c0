"""A published version's page reads as a review: the agent's settings by their labels, the rules in order in
words, each frozen tool contract in words (arguments, result, on failure, the rest), the JSON folded beneath; the
diff page shows changed text as written."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import translation

from agents.models import Agent, DeterministicRule
from agents.services import agent_update, agent_version_publish, deterministic_rule_update
from mcpregistry.contract_words import argument_words, failure_words, other_words, result_words
from mcpregistry.models import ToolContract

pytestmark = pytest.mark.django_db


def test_a_contract_reads_in_words() -> None:
    assert argument_words("region", {"type": "str", "required": True, "allowed": ["busan", "jeju"]}) == (
        "region: text (str), required, one of: busan, jeju"
    )
    assert argument_words("limit", {"type": "int", "min": 1, "max": 50}) == (
        "limit: whole number (int), optional, 1 to 50"
    )
    assert result_words({"type": "dict", "required": ["status"], "fields": {"count": {"type": "int", "min": 0}}}) == [
        "object (dict), keys status required",
        "count: whole number (int), at least 0",
    ]
    assert result_words({}) == ["no constraint"]
    contract = ToolContract(
        retry={"max_attempts": 3, "on": ["timeout", "rate_limit"], "backoff_base_s": 2.0, "backoff_cap_s": 4.0},
        timeout_s=2.0,
        fallback_tool="get_asset_status_backup",
        memo_ttl_s=60,
        idempotency_arg="request_id",
    )
    assert failure_words(contract) == [
        "up to 3 attempts on timeout, rate limit (backoff 2–4 s)",
        "timeout 2 s",
        "fallback: get_asset_status_backup (suggest it to the model)",
    ]
    assert other_words(contract) == [
        "memoized within a run",
        "reused across runs for 60 s",
        "idempotency key in request_id",
        "3 argument corrections per run",
        "unknown arguments: refuse the call",
    ]
    assert failure_words(ToolContract(retry={"max_attempts": 1}))[:2] == [
        "one attempt, no retry",
        "timeout: the server's",
    ]
    with translation.override("ko"):
        assert failure_words(contract)[0] == "타임아웃, 속도 제한에 최대 3회 시도 (대기 2~4초)"


def test_the_version_page_shows_settings_rules_and_contracts_in_words(admin_client: Client, demo_agent: Agent) -> None:
    params = {"temperature": 0.2, "retry": {"max_attempts": 2, "on": ["timeout"]}}
    agent_update(agent=demo_agent, actor="test-admin", via="tests", data={"model_params": params})
    version = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    page = admin_client.get(f"/admin/agents/agentversion/{version.pk}/change/").content.decode()
    assert "<th>System prompt</th>" in page and "<th>Max iterations</th><td>6</td>" in page
    assert "<li>retry.max_attempts = 2</li><li>retry.on = [&quot;timeout&quot;]</li><li>temperature = 0.2</li>" in page
    assert "offline (answers from deterministic results, no network) <code>offline</code>" in page
    assert "sds-company-data · search_employee" in page and "any of these keywords:" in page
    assert "<code>sds-company-data/get_asset_status</code><br>read" in page
    assert "asset_id: text (str), required" in page
    assert "up to 3 attempts on timeout, rate limit, transport error (backoff 2–4 s) · timeout 2 s · fallback:" in page
    assert "the content as frozen (JSON)" in page and "&quot;contracts&quot;" in page
    korean = admin_client.get(f"/admin/agents/agentversion/{version.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko")
    text = korean.content.decode()
    assert "실패하면:" in text and "규칙 (순서대로)" in text and "asset_id: 텍스트 (str), 필수" in text


def test_the_diff_page_shows_changed_text_as_written(admin_client: Client, demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="get_asset_status")
    deterministic_rule_update(rule=rule, actor="test-admin", via="tests", data={"answer_template": "줄 하나\n줄 둘"})
    v2 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    page = admin_client.get(f"/admin/agents/agentversion/{v2.pk}/diff/").content.decode()
    assert "줄 하나\n줄 둘</pre>" in page  # its lines, not a JSON string with \n in it
    assert "&quot;줄 하나" not in page
    # A change of type alone still reads as a change: "5" (text) and 5 (a number).
    deterministic_rule_update(rule=rule, actor="test-admin", via="tests", data={"params": {"asset_id": "5"}})
    v3 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    page = admin_client.get(f"/admin/agents/agentversion/{v3.pk}/diff/").content.decode()
    assert "&quot;5&quot;</pre>" in page
