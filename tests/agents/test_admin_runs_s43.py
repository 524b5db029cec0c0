"""The run page shows a successful tool call's answer as the tool gave it: the model reads it in a <tool_data>
block (``gate.ToolResult.for_model``), a person reads the answer, not the block nor its JSON escapes."""

from __future__ import annotations

import html

import pytest

from agents.models import Agent, Run
from audit.visible import tool_data_block

pytestmark = pytest.mark.django_db


def test_a_successful_calls_answer_is_shown_without_the_models_block(admin_client) -> None:  # type: ignore[no-untyped-def]
    agent = Agent.objects.create(slug="ledger", name="장부")
    text = '<b>A&B</b> 줄1\n줄2 "인용"'
    run = Run.objects.create(
        agent=agent,
        query="장부를 보여줘",
        status=Run.Status.SUCCEEDED,
        answer="요약",
        messages=[
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "args": {}},
                                                       {"id": "c2", "name": "rows", "args": {}}]},
            {"type": "tool", "content": tool_data_block(text), "tool_call_id": "c1", "name": "lookup",
             "status": "success"},
            {"type": "tool", "content": tool_data_block({"팀": "물류플랫폼팀", "인원": 2}), "tool_call_id": "c2",
             "name": "rows", "status": "success"},
        ],
    )  # fmt: skip
    page = html.unescape(admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode())
    timeline = page[page.index('id="run-timeline"') : page.index("Raw data")]
    assert "<tool_data>" not in timeline
    assert "\\u003c" not in timeline
    assert text in timeline
    assert '"팀": "물류플랫폼팀"' in timeline
