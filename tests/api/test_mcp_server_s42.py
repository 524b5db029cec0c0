"""The MCP server's ``tools/call`` refused by a spent budget: its ``isError`` result carries what the REST API and
A2A carry beside the text (the refusal's reason, when the period resets, and the ``Retry-After`` delay); the text
alone lost them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.budgets import budget_create, period_bounds
from agents.models import Agent, BudgetUsage, Run
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def tools_call(caller: ApiCaller, arguments: dict[str, Any]) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "ask_company-assistant", "arguments": arguments},
    }
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    response = client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json"}
    )
    assert response.status_code == 200 and not response.streaming, response  # refused: no run to wait for
    return response.json()


def test_a_call_refused_by_a_spent_budget_says_why_and_when_to_call_again(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 100, "run_reservation_tokens": 100},
    )
    # One token of it used today: a run's reservation of 100 no longer fits.
    BudgetUsage.objects.update_or_create(
        budget=budget, period_start=period_bounds("day", timezone.now())[0], defaults={"used_tokens": 1}
    )
    result = tools_call(api_caller, {"query": "안녕"})["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("budget_exceeded: ")
    structured = result["structuredContent"]
    # What the REST API answers the same submission with: its fields and its Retry-After.
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    rest = client.post("/api/v1/runs", {"agent": "company-assistant", "query": "안녕"}, "application/json")
    assert rest.status_code == 429, rest.content
    fields = rest.json()["error"]["fields"]
    assert structured["code"] == "budget_exceeded"
    assert structured["reason"] == fields["reason"] and structured["reason"]
    assert structured["resets_at"] == fields["resets_at"] and structured["resets_at"]
    assert 0 < structured["retryAfter"] <= int(rest["Retry-After"]) + 1
    assert not Run.objects.exists()


def test_a_call_refused_for_its_input_names_its_code(api_caller: ApiCaller, demo_agent: Agent) -> None:
    result = tools_call(api_caller, {"query": "x", "context": {"contextId": "  "}})["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["code"] == result["content"][0]["text"].split(":", 1)[0]
