"""The embedding ranker checks every vector where it enters (the service's answer at discovery and at run start, the
cache, the query's): an answer of NaN, ``[]`` or another dimension never fails a run, is never stored, and is never
ranked with; the run ranks lexically and its trace says why. The real demo server over stdio and the tests' real
HTTP embedding server; only the model is scripted."""

from __future__ import annotations

import math

import pytest

from agents.models import Run
from mcpregistry.models import McpServer, ToolEmbedding
from mcpregistry.services import mcp_tool_update
from tests.agents.test_tool_selection import DEMO_TOOLS, offered_names, run_query, scripted_agent, selections
from tests.conftest import bind_demo_server
from tests.embedding_server import DIMENSIONS, SHORT_DIMENSIONS, EmbeddingServer

pytestmark = pytest.mark.django_db

EMBEDDING = {"enabled": True, "top_k": 2, "ranker": "embedding"}


@pytest.fixture
def embeddings(settings):
    with EmbeddingServer() as server:
        settings.PLATFORM_EMBEDDINGS_URL = server.url
        settings.PLATFORM_EMBEDDINGS_MODEL = "hashed-256"
        yield server


def stored_vectors(server: McpServer) -> dict[str, list[float]]:
    return {e.tool.name: e.vector for e in ToolEmbedding.objects.filter(tool__server=server).select_related("tool")}


def all_finite(vectors: dict[str, list[float]]) -> bool:
    return all(v and all(math.isfinite(x) for x in v) for v in vectors.values())


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("nan", "embedding:query vector has a value that is not a finite number"),
        ("empty", "embedding:query vector is empty"),
        # (The model behind the URL changed, the query shorter than the cached tools: the run embeds the tools
        # again and ranks with them, tests/agents/test_tool_selection_s42.py.)
    ],
)
def test_a_query_vector_that_cannot_be_ranked_with_falls_back_to_lexical_and_the_trace_says_why(
    embeddings, answer, why
) -> None:
    server = bind_demo_server()
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)
    embeddings.answer = answer

    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert (first["ranker"], first["fallback"]) == ("lexical", why)
    assert offered_names(first)[0] == "get_asset_status"
    assert all(math.isfinite(o["score"]) for o in first["offered"])


def test_a_stale_tool_vector_answered_as_nan_at_run_start_is_not_stored_and_the_run_ranks_lexically(
    embeddings,
) -> None:
    server = bind_demo_server()
    before = stored_vectors(server)
    mcp_tool_update(tool=server.tools.get(name="ping"), actor="admin", via="tests", data={"tags": ["헬스체크"]})
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)
    embeddings.answer = "nan"

    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert (first["ranker"], first["fallback"]) == (
        "lexical",
        "embedding:tool vector has a value that is not a finite number",
    )
    assert stored_vectors(server) == before  # the stale one kept, to be recomputed when the service answers again


@pytest.mark.parametrize("answer", ["nan", "empty"])
def test_a_discovery_answered_vectors_that_are_not_vectors_stores_none_and_succeeds(embeddings, answer) -> None:
    embeddings.answer = answer
    server = bind_demo_server()  # asserts the discovery's report is ok
    assert server.tools.count() == len(DEMO_TOOLS)
    assert stored_vectors(server) == {}


def test_when_the_service_answers_another_dimension_for_a_stale_tool_every_tool_is_embedded_again(embeddings) -> None:
    server = bind_demo_server()
    embeddings.answer = "short"  # another model behind the same URL and model name
    mcp_tool_update(tool=server.tools.get(name="ping"), actor="admin", via="tests", data={"tags": ["헬스체크"]})
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)

    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert (first["ranker"], first.get("fallback")) == ("embedding", None)
    vectors = stored_vectors(server)
    assert set(vectors) == DEMO_TOOLS
    assert {len(v) for v in vectors.values()} == {SHORT_DIMENSIONS}


def test_a_cached_vector_that_is_not_one_is_embedded_again_not_left_out_of_the_ranking(embeddings) -> None:
    server = bind_demo_server()
    ToolEmbedding.objects.filter(tool__server=server, tool__name="get_asset_status").update(vector=[])
    ToolEmbedding.objects.filter(tool__server=server, tool__name="ping").update(vector=[1.0, 2.0])
    computed = len(embeddings.embedded)
    agent = scripted_agent(server, [{"content": "ok"}], EMBEDDING)

    run = run_query(agent, "get asset status A-1001 자산 상태")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert (first["ranker"], first.get("fallback")) == ("embedding", None)
    assert "get_asset_status" in offered_names(first)
    vectors = stored_vectors(server)
    assert {len(v) for v in vectors.values()} == {DIMENSIONS}
    assert all_finite(vectors)
    # The empty one and the one of another dimension are recomputed (the cache disagreeing on its dimension, all
    # of them are: which dimension is the model's is not known), then the query.
    assert len(embeddings.embedded) == computed + len(DEMO_TOOLS) + 1
