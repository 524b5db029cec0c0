"""Tool selection: decomposed example queries and the embedding ranker, a service that changed its dimension,
switches and numbers given as texts in the selection editor, and a call outside the hard filters."""

from __future__ import annotations

import json
import re
import unicodedata

import pytest
from django.test import Client

from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry.embeddings import tool_embedding_text
from mcpregistry.models import McpServer, ToolEmbedding
from mcpregistry.services import mcp_tool_update
from tests.agents.test_agent_settings_editor import change_url, field_errors, picker, post_data, selection_inputs
from tests.agents.test_tool_selection import offered_names, run_query, scripted_agent, selections
from tests.conftest import bind_demo_server
from tests.embedding_server import SHORT_DIMENSIONS, EmbeddingServer

pytestmark = pytest.mark.django_db

__all__ = ["picker"]  # the editor tests' fixture, used here

EMBEDDING = {"enabled": True, "top_k": 2, "ranker": "embedding"}
CONTACT_QUERY = "직원 연락처 이메일 찾아줘"


@pytest.fixture
def embeddings(settings):
    with EmbeddingServer() as server:
        settings.PLATFORM_EMBEDDINGS_URL = server.url
        settings.PLATFORM_EMBEDDINGS_MODEL = "hashed-256"
        yield server


def test_an_example_query_typed_decomposed_is_stored_and_embedded_composed_and_ranks_as_typed_composed(
    embeddings,
) -> None:
    server = bind_demo_server()
    ping = server.tools.get(name="ping")
    decomposed = unicodedata.normalize("NFD", CONTACT_QUERY)  # as macOS sends Korean
    mcp_tool_update(tool=ping, actor="admin", via="tests", data={"example_queries": [decomposed]})
    ping.refresh_from_db()
    assert ping.example_queries == [CONTACT_QUERY]
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)

    run = run_query(agent, CONTACT_QUERY)

    first = selections(run)[0]
    assert first["ranker"] == "embedding"
    assert "ping" in offered_names(first)  # its example is the query itself


def test_a_tools_decomposed_description_and_a_decomposed_query_are_embedded_composed(embeddings) -> None:
    server = bind_demo_server()
    ping = server.tools.get(name="ping")
    ping.description = unicodedata.normalize("NFD", "직원 연락처를 찾습니다")  # as a server may describe it
    assert unicodedata.is_normalized("NFC", tool_embedding_text(ping))
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)
    before = len(embeddings.embedded)

    run_query(agent, unicodedata.normalize("NFD", CONTACT_QUERY))

    asked = embeddings.embedded[before:]
    assert len(asked) == 1 and CONTACT_QUERY in asked[0]
    assert unicodedata.is_normalized("NFC", asked[0])


def test_tool_vectors_of_another_dimension_than_the_service_now_answers_are_embedded_again_in_the_run(
    embeddings,
) -> None:
    server = bind_demo_server()  # 256 dimensions cached at discovery
    tools = server.tools.count()
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)
    embeddings.answer = "short"  # another model behind the same URL, no tool's text changed

    before = len(embeddings.embedded)
    run = run_query(agent, "A-1001 자산 상태 알려줘")

    first = selections(run)[0]
    assert first["ranker"] == "embedding" and "fallback" not in first
    assert {len(e.vector) for e in ToolEmbedding.objects.filter(tool__server=server)} == {SHORT_DIMENSIONS}
    assert len(embeddings.embedded) - before == 1 + tools  # the query, then every tool once
    before = len(embeddings.embedded)
    again = selections(run_query(agent, "A-1001 자산 상태 알려줘"))[0]
    assert again["ranker"] == "embedding" and "fallback" not in again
    assert len(embeddings.embedded) - before == 1  # the query only: the tools' new vectors are cached


@pytest.mark.slow
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"enabled": "false", "top_k": 2}', "enabled: must be true or false"),
        ('{"enabled": "0", "top_k": 2}', "enabled: must be true or false"),
        ('{"enabled": 1, "top_k": 2}', "enabled: must be true or false"),
        ('{"enabled": true, "top_k": true}', "top_k: must be a whole number"),
        ('{"enabled": true, "top_k": "5"}', "top_k: must be a whole number"),
        ('{"read_resource_tool": "false"}', "read_resource_tool: must be true or false"),
    ],
)
def test_a_switch_or_a_number_given_as_text_is_refused_naming_the_key(
    admin_client: Client, picker: Agent, raw: str, expected: str
) -> None:
    field = "mcp_context" if "read_resource_tool" in raw else "tool_selection"
    response = admin_client.post(change_url(picker), post_data(picker, **{field: raw}))

    assert response.status_code == 200
    assert expected in field_errors(response.content.decode(), field)
    picker.refresh_from_db()
    assert getattr(picker, field) in ({}, None)


def test_a_whole_number_written_as_a_float_is_still_taken(admin_client: Client, picker: Agent) -> None:
    response = admin_client.post(change_url(picker), post_data(picker, tool_selection='{"top_k": 2.0}'))

    assert response.status_code == 302
    picker.refresh_from_db()
    assert picker.tool_selection == {"top_k": 2.0}


def test_a_switch_stored_as_text_before_is_shown_as_runs_read_it_and_saved_back_unchanged_stays_off(
    admin_client: Client, picker: Agent
) -> None:
    Agent.objects.filter(pk=picker.pk).update(tool_selection={"enabled": "false", "top_k": 2})  # stored before
    page = admin_client.get(change_url(picker)).content.decode()
    box = re.search(r'<input type="checkbox" name="tool_selection__enabled"[^>]*>', page)
    assert box is not None and "checked" not in box.group(0)

    # The browser posts what it shows: the box unchecked.
    data = post_data(picker, **selection_inputs(top_k="2"))
    data["tool_selection__json_shown"] = json.dumps({"enabled": "false", "top_k": 2})
    response = admin_client.post(change_url(picker), data)

    assert response.status_code == 302
    picker.refresh_from_db()
    assert picker.tool_selection == {"enabled": False, "top_k": 2}


def test_a_call_to_a_tool_outside_the_hard_filters_is_refused_without_using_up_a_widening(
    demo_server: McpServer,
) -> None:
    for name in ("get_asset_status", "get_asset_status_backup", "get_asset", "list_projects"):
        mcp_tool_update(tool=demo_server.tools.get(name=name), actor="admin", via="tests", data={"tags": ["자산"]})
    agent = scripted_agent(
        demo_server,
        [
            {"tool_calls": [{"name": "ping", "args": {}}]},  # untagged: outside the filter for good
            {"tool_calls": [{"name": "list_projects", "args": {}}]},  # tagged, not offered: widens
            {"tool_calls": [{"name": "list_projects", "args": {}}]},
            {"content": "done"},
        ],
        {"enabled": True, "top_k": 1, "tags": ["자산"], "widen_step": 1, "max_widenings": 1},
    )

    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    turns = selections(run)
    assert len(offered_names(turns[1])) == 1  # ping's refusal widened nothing
    assert ("list_projects", "widened") in [(o["name"], o["why"]) for o in turns[2]["offered"]]
    calls = [(e.tool, e.reason) for e in AuditEvent.objects.filter(run_id=run.id).order_by("pk") if e.tool]
    assert ("ping", "tool:not_offered") in calls
    assert [reason for tool, reason in calls if tool == "list_projects"][-1] != "tool:not_offered"


@pytest.mark.slow
def test_a_service_answering_queries_in_another_dimension_than_tools_is_not_asked_for_every_tool_each_run(
    embeddings, monkeypatch
) -> None:
    """Every run embedded every tool again, failed, and fell back, for good: the failure is remembered."""
    import tests.embedding_server as embedding_server
    from mcpregistry import embeddings as embedding_module

    query = "A-1001 자산 상태 알려줘"
    server = bind_demo_server()
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)
    answered = embedding_server.answered_vector
    # The query (a one-text request of the run's query) comes back shorter; the tools' texts as before.
    monkeypatch.setattr(
        embedding_server, "answered_vector", lambda t, a: answered(t, "short") if query in t else answered(t, a)
    )
    try:
        per_run = []
        for _ in range(3):
            before = len(embeddings.embedded)
            selection = selections(run_query(agent, query))[0]
            per_run.append((len(embeddings.embedded) - before, selection["ranker"], selection["fallback"]))
    finally:
        embedding_module._reembed_failed.clear()
    tools = server.tools.count()
    assert per_run[0][0] == 1 + tools  # the query, then every tool once
    assert [n for n, _ranker, _why in per_run[1:]] == [1, 1]  # the query alone
    assert all(ranker == "lexical" for _n, ranker, _why in per_run)
    assert all(f"query vector has {SHORT_DIMENSIONS} dimensions" in why for _n, _ranker, why in per_run), per_run
