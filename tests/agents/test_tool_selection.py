"""Top-K tool selection (seed 003 §5), forced first calls (seed 002 §7.1) and the self-correction cap (seed 003
§6), on the real demo server through the gate; only the model is scripted (Bedrock answered by Stubber)."""

from __future__ import annotations

import io
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber
from django.core.exceptions import ValidationError

from agents import providers
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_update, agent_version_publish, deterministic_rule_update, run_create
from agents.tool_selection import EmbeddingRanker, LexicalRanker, ToolDoc, ToolSelectionSettings, select_tools, tokens
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolEmbedding
from mcpregistry.services import mcp_tool_update, tool_contract_update
from tests.conftest import bind_demo_server, make_agent
from tests.embedding_server import EmbeddingServer

pytestmark = pytest.mark.django_db

DEMO_TOOLS = {
    "search_employee",
    "list_team_members",
    "get_asset",
    "list_projects",
    "get_asset_status",
    "get_asset_status_backup",
    "ping",
}


def selections(run: Run) -> list[dict]:
    return [m for m in run.messages if m.get("type") == "tool_selection"]


def offered_names(entry: dict) -> list[str]:
    return [o["name"] for o in entry["offered"]]


def ai_turns(run: Run) -> list[dict]:
    return [m for m in run.conversation if m["type"] == "ai"]


def scripted_agent(server: McpServer, script: list[dict], selection: dict, *, rules: bool = False) -> Agent:
    agent = make_agent(slug="picker", servers=[server], provider="scripted", script=script, with_demo_rules=rules)
    agent.tool_selection = selection
    agent.save()
    return agent


def run_query(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


# ---- the ranker on its own --------------------------------------------------------------------------------------


def test_korean_words_are_indexed_as_syllable_bigrams_so_a_particle_does_not_hide_the_noun() -> None:
    assert tokens("자산의 상태") == ["자산", "산의", "상태"]
    assert set(tokens("자산")) <= set(tokens("자산을 조회"))
    assert tokens("get_assetStatus for the Teams") == ["get", "asset", "status", "team"]


def test_the_lexical_ranker_puts_the_tool_that_fits_a_korean_query_first() -> None:
    docs = [
        ToolDoc(
            name="get_asset_status", description="자산 ID로 자산의 현재 상태를 조회합니다", argument_names=("asset_id",)
        ),
        ToolDoc(
            name="search_employee", description="이름으로 직원의 소속 팀과 직무를 찾습니다", argument_names=("name",)
        ),
        ToolDoc(name="list_projects", description="팀의 진행 중인 프로젝트 목록", argument_names=("team",)),
        ToolDoc(name="convert_currency", description="Convert an amount between currencies", tags=("환율",)),
    ]
    ranker = LexicalRanker(docs)
    for query, expected in [
        ("A-1001 자산 상태가 어때?", "get_asset_status"),
        ("박도윤 님은 어느 팀 소속이야?", "search_employee"),
        ("물류플랫폼팀 프로젝트 알려줘", "list_projects"),
        ("오늘 달러 환율로 100달러는?", "convert_currency"),
        ("convert 100 USD to KRW", "convert_currency"),
    ]:
        scores = ranker.score(query)
        assert max(scores, key=scores.__getitem__) == expected, (query, scores)


def test_hard_filters_keep_a_pinned_tool_out_when_its_server_is_filtered_out() -> None:
    docs = [ToolDoc(name="a", mcp_id="one", description="alpha"), ToolDoc(name="b", mcp_id="two", description="beta")]
    settings = ToolSelectionSettings(enabled=True, top_k=1, pinned=["b"], servers=["one"])
    selection = select_tools(ranker=LexicalRanker(docs), text="beta", candidates=docs, settings=settings)
    assert selection.offered == ["a"]
    assert selection.candidates == 1


# ---- selection in a run ------------------------------------------------------------------------------------------


def test_a_korean_query_offers_the_model_only_the_top_k_tools_and_the_trace_records_their_scores(demo_server) -> None:
    agent = scripted_agent(
        demo_server,
        [{"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]}, {"content": "done"}],
        {"enabled": True, "top_k": 2},
    )
    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert first["turn"] == 1 and first["ranker"] == "lexical" and first["candidates"] == len(DEMO_TOOLS)
    assert offered_names(first)[0] == "get_asset_status"
    assert len(first["offered"]) == 2
    assert all(o["why"] == "ranked" for o in first["offered"])
    assert first["offered"][0]["score"] > first["offered"][1]["score"] > 0
    # What was bound to the model is what the trace says was offered.
    assert ai_turns(run)[0]["data"]["response_metadata"]["bound_tools"] == offered_names(first)
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call", tool="get_asset_status")
    assert event.ok


def test_selection_stays_off_when_the_agent_has_no_more_tools_than_k(demo_server) -> None:
    agent = scripted_agent(demo_server, [{"content": "hi"}], {"enabled": True, "top_k": 7})
    run = run_query(agent, "A-1001 자산 상태")
    assert selections(run) == []
    assert set(ai_turns(run)[0]["data"]["response_metadata"]["bound_tools"]) == DEMO_TOOLS


def test_pinned_and_rule_named_tools_are_always_offered(demo_server) -> None:
    agent = scripted_agent(
        demo_server, [{"content": "done"}], {"enabled": True, "top_k": 1, "pinned": ["ping"]}, rules=True
    )
    # The demo rule "직원 소속 조회" matches and names search_employee; the ranker prefers the asset tools.
    run = run_query(agent, "박도윤 님 소속 팀과 자산 상태 자산 상태")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    why = {o["name"]: o["why"] for o in selections(run)[0]["offered"]}
    assert why["ping"] == "pinned"
    assert why["search_employee"] == "rule"
    assert list(why.values()).count("ranked") == 1


def test_a_call_to_an_existing_tool_that_was_not_offered_is_refused_listing_the_offer_and_widens_the_next_turn(
    demo_server,
) -> None:
    agent = scripted_agent(
        demo_server,
        [
            {"tool_calls": [{"name": "ping", "args": {}}]},
            {"tool_calls": [{"name": "ping", "args": {}}]},
            {"content": "{last_tool_result}"},
        ],
        {"enabled": True, "top_k": 2, "max_widenings": 1},
    )
    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first, second = selections(run)[:2]
    assert "ping" not in offered_names(first)
    refused = AuditEvent.objects.get(run_id=run.id, tool="ping", reason="tool:not_offered")
    assert refused.mcp_id == "sds-company-data" and refused.attempt == 0
    for name in offered_names(first):
        assert name in refused.result
    # Widened for the next turn: the asked tool and widen_step more ranked ones; the second call goes through.
    assert {o["name"]: o["why"] for o in second["offered"]}["ping"] == "widened"
    assert len(second["offered"]) > len(first["offered"])
    assert AuditEvent.objects.get(run_id=run.id, tool="ping", action="tool.call", attempt=1).ok


def test_widening_is_bounded(demo_server) -> None:
    agent = scripted_agent(
        demo_server,
        [
            {"tool_calls": [{"name": "ping", "args": {}}]},
            {"tool_calls": [{"name": "ping", "args": {}}]},
            {"content": "x"},
        ],
        {"enabled": True, "top_k": 2, "max_widenings": 0},
    )
    run = run_query(agent, "A-1001 자산 상태 알려줘")
    assert AuditEvent.objects.filter(run_id=run.id, tool="ping", reason="tool:not_offered").count() == 2
    assert all("ping" not in offered_names(s) for s in selections(run))


# ---- the self-correction cap -------------------------------------------------------------------------------------


def test_a_model_repeating_a_bad_call_has_the_tool_withdrawn_after_the_contracts_cap(demo_server) -> None:
    tool = demo_server.tools.get(name="search_employee")
    tool_contract_update(contract=tool.contract, actor="admin", via="tests", data={"correction_cap": 2})
    bad = {"tool_calls": [{"name": "search_employee", "args": {}}]}
    agent = scripted_agent(demo_server, [bad, bad, bad, bad, {"content": "gave up"}], {})
    agent.max_iterations = 10
    agent.save()
    run = run_query(agent, "박도윤 님 팀?")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    reasons = list(
        AuditEvent.objects.filter(run_id=run.id, tool="search_employee").order_by("id").values_list("reason", flat=True)
    )
    assert reasons == ["args:missing:name", "args:missing:name", "tool:withdrawn", "tool:withdrawn"]
    withdrawn = [m for m in run.messages if m.get("type") == "tool_withdrawn"]
    assert withdrawn == [{"type": "tool_withdrawn", "tool": "search_employee", "corrections": 2}]
    # The model is no longer offered the tool after the cap.
    bound = [t["data"]["response_metadata"]["bound_tools"] for t in ai_turns(run)]
    assert "search_employee" in bound[1] and "search_employee" not in bound[2]


def test_a_published_version_keeps_the_correction_cap_it_froze_though_the_draft_raises_it(demo_server) -> None:
    tool = demo_server.tools.get(name="search_employee")
    tool_contract_update(contract=tool.contract, actor="admin", via="tests", data={"correction_cap": 2})
    bad = {"tool_calls": [{"name": "search_employee", "args": {}}]}
    agent = scripted_agent(demo_server, [bad, bad, bad, {"content": "gave up"}], {})
    agent.max_iterations = 10
    agent.save()
    version = agent_version_publish(agent=agent, actor="admin", via="tests")
    assert version.content["contracts"][f"{demo_server.mcp_id}/search_employee"]["correction_cap"] == 2
    tool.contract.refresh_from_db()
    tool_contract_update(contract=tool.contract, actor="admin", via="tests", data={"correction_cap": 5})

    run = run_create(agent_slug=agent.slug, query="박도윤 님 팀?", api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.version) == (Run.Status.SUCCEEDED, version), run.error_message
    reasons = list(
        AuditEvent.objects.filter(run_id=run.id, tool="search_employee").order_by("id").values_list("reason", flat=True)
    )
    assert reasons == ["args:missing:name", "args:missing:name", "tool:withdrawn"]
    assert [m for m in run.messages if m.get("type") == "tool_withdrawn"] == [
        {"type": "tool_withdrawn", "tool": "search_employee", "corrections": 2}
    ]


# ---- forced first tools ------------------------------------------------------------------------------------------


def test_a_forced_first_tool_is_passed_as_tool_choice_on_the_first_turn_only(demo_server) -> None:
    agent = scripted_agent(
        demo_server,
        [{"tool_calls": [{"name": "ping", "args": {}}]}, {"content": "pong"}],
        {"enabled": True, "top_k": 2, "force_first_tool": "ping"},
    )
    run = run_query(agent, "A-1001 자산 상태 알려줘")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first, second = (t["data"]["response_metadata"] for t in ai_turns(run))
    assert (first["tool_choice"], second["tool_choice"]) == ("ping", None)
    assert "ping" in first["bound_tools"]
    assert {o["name"]: o["why"] for o in selections(run)[0]["offered"]}["ping"] == "forced"
    # The forced call still goes through the gate.
    assert AuditEvent.objects.get(run_id=run.id, tool="ping", action="tool.call").ok


def test_forcing_is_refused_for_a_provider_that_cannot_force_a_tool(demo_server) -> None:
    agent = make_agent(slug="plain", servers=[demo_server], provider="offline", with_demo_rules=False)
    with pytest.raises(ValidationError) as caught:
        agent_update(agent=agent, actor="admin", via="tests", data={"tool_selection": {"force_first_tool": "any"}})
    assert "offline" in str(caught.value.message_dict["tool_selection"])
    with pytest.raises(ValidationError) as caught:
        agent_update(agent=agent, actor="admin", via="tests", data={"tool_selection": {"top_k": 0}})
    assert "top_k" in str(caught.value.message_dict["tool_selection"])
    agent.refresh_from_db()
    assert agent.tool_selection == {}


@pytest.fixture
def stubbed_bedrock(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    stubber = Stubber(client)
    monkeypatch.setattr(providers, "bedrock_runtime_client", lambda *, region_name, timeout_s=60.0: client)
    with stubber:
        yield stubber
    stubber.assert_no_pending_responses()


def converse_reply(content: list[dict], stop_reason: str) -> dict:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 100, "outputTokens": 10, "totalTokens": 110},
        "metrics": {"latencyMs": 5},
    }


def tool_config(names: list[str], choice: dict | None) -> dict:
    """What ChatBedrockConverse must send: only the offered tools, and the forced choice if any."""
    config: dict = {"tools": [{"toolSpec": {"name": n, "description": ANY, "inputSchema": ANY}} for n in names]}
    if choice is not None:
        config["toolChoice"] = choice
    return config


def test_bedrock_receives_only_the_offered_tools_and_the_forced_tool_choice(demo_server, stubbed_bedrock) -> None:
    agent = make_agent(slug="bedrock-picker", servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent_update(
        agent=agent,
        actor="admin",
        via="tests",
        data={
            "model_id": "anthropic.claude-3-haiku-20240307-v1:0",
            "model_params": {"region_name": "us-east-1"},
            "tool_selection": {"enabled": True, "top_k": 1, "force_first_tool": "get_asset_status"},
        },
    )
    expected_first = {
        "modelId": "anthropic.claude-3-haiku-20240307-v1:0",
        "messages": ANY,
        "system": ANY,
        "inferenceConfig": ANY,
        "toolConfig": tool_config(["get_asset_status"], {"tool": {"name": "get_asset_status"}}),
    }
    tool_use = {"toolUse": {"toolUseId": "tu-1", "name": "get_asset_status", "input": {"asset_id": "A-1001"}}}
    stubbed_bedrock.add_response("converse", converse_reply([tool_use], "tool_use"), expected_first)
    expected_second = {**expected_first, "toolConfig": tool_config(["get_asset_status"], None)}
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "정상입니다."}], "end_turn"), expected_second)

    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.answer == "정상입니다."
    assert AuditEvent.objects.get(run_id=run.id, action="tool.call", tool="get_asset_status").ok


# ---- admin-written tags and example queries ----------------------------------------------------------------------


def test_tags_and_example_queries_are_edited_through_the_audited_service_and_steer_selection(demo_server) -> None:
    tool = demo_server.tools.get(name="ping")
    mcp_tool_update(
        tool=tool, actor="admin", via="tests", data={"tags": ["헬스체크"], "example_queries": ["서버 살아 있어?"]}
    )
    change = AuditEvent.objects.filter(action="config.mcp_tool.update").latest("id")
    assert change.args["tags"] == [[], ["헬스체크"]]
    assert change.args["example_queries"] == [[], ["서버 살아 있어?"]]
    with pytest.raises(ValidationError):
        mcp_tool_update(tool=tool, actor="admin", via="tests", data={"tags": "not a list"})

    agent = scripted_agent(demo_server, [{"content": "ok"}], {"enabled": True, "top_k": 1})
    run = run_query(agent, "서버 살아 있어? 헬스체크 해줘")
    assert offered_names(selections(run)[0]) == ["ping"]


# ---- the embedding ranker ----------------------------------------------------------------------------------------


@pytest.fixture
def embeddings(settings):
    with EmbeddingServer() as server:
        settings.PLATFORM_EMBEDDINGS_URL = server.url
        settings.PLATFORM_EMBEDDINGS_MODEL = "hashed-256"
        yield server


def test_the_embedding_ranker_uses_vectors_cached_at_discovery_and_recomputes_a_changed_one(embeddings) -> None:
    server = bind_demo_server()  # discovery computes the vectors
    assert ToolEmbedding.objects.filter(tool__server=server, model="hashed-256").count() == len(DEMO_TOOLS)
    computed = len(embeddings.embedded)
    agent = scripted_agent(server, [{"content": "ok"}], {"enabled": True, "top_k": 2, "ranker": "embedding"})

    run = run_query(agent, "get asset status A-1001 자산 상태")

    first = selections(run)[0]
    assert first["ranker"] == "embedding"
    assert "get_asset_status" in offered_names(first)
    # The run embedded its query only: the tools' vectors came from the cache.
    assert len(embeddings.embedded) == computed + 1
    ping = server.tools.get(name="ping")
    before = ToolEmbedding.objects.get(tool=ping).vector
    mcp_tool_update(tool=ping, actor="admin", via="tests", data={"tags": ["헬스체크", "health"]})
    run_query(agent, "health check")
    assert len(embeddings.embedded) == computed + 1 + 2  # the changed tool, then the query
    assert ToolEmbedding.objects.get(tool=ping).vector != before


def test_an_embedding_outage_falls_back_to_the_lexical_ranker(embeddings, settings) -> None:
    server = bind_demo_server()
    agent = scripted_agent(server, [{"content": "ok"}], {"enabled": True, "top_k": 2, "ranker": "embedding"})
    embeddings.httpd.shutdown()
    embeddings.httpd.server_close()
    settings.PLATFORM_EMBEDDINGS_TIMEOUT_S = 2

    run = run_query(agent, "A-1001 자산 상태 알려줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert first["ranker"] == "lexical"
    assert first["fallback"].startswith("embedding:")
    assert offered_names(first)[0] == "get_asset_status"


def test_a_matched_rule_forces_the_models_first_tool_over_the_agents_setting(demo_server) -> None:
    agent = scripted_agent(
        demo_server,
        [{"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}]}, {"content": "done"}],
        {"force_first_tool": "any"},
        rules=True,
    )
    rule = agent.rules.get(name="직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"force_first_tool": "list_projects"})
    run = run_query(agent, "박도윤 님 소속 팀의 프로젝트")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert ai_turns(run)[0]["data"]["response_metadata"]["tool_choice"] == "list_projects"
    # A query no forcing rule matches keeps the agent's own setting.
    run = run_query(agent, "A-1001 자산 상태")
    assert ai_turns(run)[0]["data"]["response_metadata"]["tool_choice"] == "any"


def test_a_rule_cannot_force_a_tool_for_an_agent_whose_provider_cannot(demo_agent) -> None:
    rule = demo_agent.rules.first()
    with pytest.raises(ValidationError) as caught:
        deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"force_first_tool": "any"})
    assert "offline" in str(caught.value.message_dict["force_first_tool"])


def test_bedrock_embeddings_through_langchain_aws_fill_the_cache_and_rank_a_query(demo_server, settings, monkeypatch):
    from botocore.response import StreamingBody

    from mcpregistry import embeddings as tool_embeddings
    from tests.embedding_server import hashed_vector

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    monkeypatch.setattr(tool_embeddings, "bedrock_embeddings_client", lambda: client)
    settings.PLATFORM_EMBEDDINGS_URL, settings.PLATFORM_EMBEDDINGS_MODEL = "bedrock", "amazon.titan-embed-text-v2:0"
    tools = list(demo_server.tools.all())
    query = "get asset status 자산 상태"

    def answer(stubber: Stubber, text: str) -> None:
        payload = json.dumps({"embedding": hashed_vector(text), "inputTextTokenCount": 3}).encode()
        stubber.add_response(
            "invoke_model",
            {"body": StreamingBody(io.BytesIO(payload), len(payload)), "contentType": "application/json"},
            {
                "body": json.dumps({"inputText": text.replace("\n", " ")}),  # langchain-aws flattens lines
                "modelId": "amazon.titan-embed-text-v2:0",
                "accept": "application/json",
                "contentType": "application/json",
            },
        )

    with Stubber(client) as stubber:
        for tool in tools:
            answer(stubber, tool_embeddings.tool_embedding_text(tool))
        answer(stubber, query)
        vectors, embed_query = tool_embeddings.embedding_ranker_inputs({t.name: t for t in tools})
        scores = EmbeddingRanker(vectors, embed_query).score(query)
        stubber.assert_no_pending_responses()
    assert ToolEmbedding.objects.filter(model="bedrock:amazon.titan-embed-text-v2:0").count() == len(tools)
    assert "get_asset_status" in sorted(scores, key=scores.__getitem__, reverse=True)[:2]


def test_an_admin_edits_a_tools_tags_and_example_queries_on_its_page_and_the_change_is_audited(
    demo_server, admin_client
) -> None:
    tool = demo_server.tools.get(name="ping")
    contract = tool.contract
    form = {
        "enabled": "on",
        "tags": json.dumps(["헬스체크"], ensure_ascii=False),
        "example_queries": json.dumps(["서버 살아 있어?"], ensure_ascii=False),
        "contract-TOTAL_FORMS": "1",
        "contract-INITIAL_FORMS": "1",
        "contract-MIN_NUM_FORMS": "0",
        "contract-MAX_NUM_FORMS": "1",
        "contract-0-id": str(contract.pk),
        "contract-0-tool": str(tool.pk),
        "contract-0-risk": contract.risk,
        "contract-0-args": json.dumps(contract.args),
        "contract-0-unknown_args": contract.unknown_args,
        "contract-0-returns": json.dumps(contract.returns),
        "contract-0-retry": json.dumps(contract.retry),
        "contract-0-timeout_s": "",
        "contract-0-fallback_tool": "",
        "contract-0-fallback_policy": contract.fallback_policy,
        "contract-0-memo": "on" if contract.memo else "",
        "contract-0-memo_ttl_s": "",
        "contract-0-idempotency_arg": "",
        "contract-0-correction_cap": "2",
    }
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    tool.refresh_from_db()
    assert (tool.tags, tool.example_queries, tool.contract.correction_cap) == (["헬스체크"], ["서버 살아 있어?"], 2)
    tool_change = AuditEvent.objects.filter(action="config.mcp_tool.update", tool="ping").latest("id")
    assert tool_change.args == {"tags": [[], ["헬스체크"]], "example_queries": [[], ["서버 살아 있어?"]]}
    contract_change = AuditEvent.objects.filter(action="config.tool_contract.update", tool="ping").latest("id")
    assert contract_change.args["correction_cap"] == [3, 2]


def test_an_agents_tool_selection_and_pinning_are_changed_through_the_audited_service(demo_server) -> None:
    agent = make_agent(slug="pins", servers=[demo_server], provider="scripted", with_demo_rules=False)
    selection = {"enabled": True, "top_k": 3, "pinned": ["ping"], "tags": ["자산"]}
    agent_update(agent=agent, actor="admin", via="tests", data={"tool_selection": selection})
    event = AuditEvent.objects.filter(action="config.agent.update").latest("id")
    assert event.args == {"tool_selection": [{}, selection]}
    assert event.actor == "admin"
