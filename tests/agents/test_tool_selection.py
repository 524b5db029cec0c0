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


def test_korean_words_are_indexed_as_syllables_and_bigrams_so_a_particle_does_not_hide_the_noun() -> None:
    # Syllables as well as bigrams: a one-syllable noun ("팀") meets itself with a particle ("팀을").
    assert tokens("자산의 상태") == ["자", "산", "의", "자산", "산의", "상", "태", "상태"]
    assert set(tokens("자산")) <= set(tokens("자산을 조회"))
    assert set(tokens("팀")) <= set(tokens("팀을 알려줘"))
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    from mcpregistry.services import mcp_tool_update

    for tool in demo_server.tools.filter(name__in=["ping", "get_asset_status"]):
        mcp_tool_update(tool=tool, actor="admin", via="tests", data={"tags": ["자산"]})
    agent = make_agent(slug="pins", servers=[demo_server], provider="scripted", with_demo_rules=False)
    selection = {"enabled": True, "top_k": 3, "pinned": ["ping"], "tags": ["자산"]}
    agent_update(agent=agent, actor="admin", via="tests", data={"tool_selection": selection})
    event = AuditEvent.objects.filter(action="config.agent.update").latest("id")
    assert event.args == {"tool_selection": [{}, selection]}
    assert event.actor == "admin"


# ---- Korean forms in the lexical ranker --------------------------------------------------------------------------


def test_hangul_written_against_latin_letters_or_digits_is_split_from_them() -> None:
    assert tokens("VPN이 안돼요")[:2] == ["vpn", "이"]
    assert "1001" in tokens("A-1001의 상태") and "의" in tokens("A-1001의 상태")
    assert {"3", "매출"} <= set(tokens("3월매출"))
    docs = [
        ToolDoc(name="reset_vpn", description="VPN 접속 문제 해결"),
        ToolDoc(name="list_sales", description="월별 매출 집계"),
        ToolDoc(name="other", description="기타 도구 목록"),
    ]
    ranker = LexicalRanker(docs)
    for query, expected in [("VPN이 안돼요", "reset_vpn"), ("3월매출 알려줘", "list_sales")]:
        scores = ranker.score(query)
        assert max(scores, key=scores.__getitem__) == expected, (query, scores)


def test_a_one_syllable_noun_meets_itself_with_a_particle_and_decomposed_korean_meets_composed() -> None:
    import unicodedata

    docs = [
        ToolDoc(name="list_team_members", description="팀 구성원 목록"),
        ToolDoc(name="get_asset_status", description=unicodedata.normalize("NFD", "자산 상태 조회")),
        ToolDoc(name="other", description="기타"),
    ]
    ranker = LexicalRanker(docs)
    scores = ranker.score("팀을 알려줘")
    assert max(scores, key=scores.__getitem__) == "list_team_members", scores
    scores = ranker.score(unicodedata.normalize("NFD", "자산 상태"))
    assert max(scores, key=scores.__getitem__) == "get_asset_status", scores
    assert tokens(unicodedata.normalize("NFD", "자산")) == tokens("자산")


# ---- hard filters, fallbacks, the ranking text -------------------------------------------------------------------


def test_the_hard_filters_hold_also_when_the_agent_has_no_more_tools_than_top_k(demo_server) -> None:
    for name in ("get_asset_status", "get_asset_status_backup"):
        mcp_tool_update(tool=demo_server.tools.get(name=name), actor="admin", via="tests", data={"tags": ["자산"]})
    agent = scripted_agent(
        demo_server,
        [{"tool_calls": [{"name": "ping", "args": {}}]}, {"content": "done"}],
        {"enabled": True, "top_k": 10, "tags": ["자산"], "max_widenings": 0},
    )
    run = run_query(agent, "A-1001 자산 상태")

    first = selections(run)[0]
    assert sorted(offered_names(first)) == ["get_asset_status", "get_asset_status_backup"]
    assert first["ranker"] == "none"  # no more tools than top_k pass the filter: offered without ranking
    assert AuditEvent.objects.get(run_id=run.id, tool="ping").reason == "tool:not_offered"


@pytest.mark.slow
def test_the_fallback_the_gate_tells_the_model_to_use_is_offered_on_the_next_turn() -> None:
    server = bind_demo_server(failure_mode="bad_schema")
    agent = scripted_agent(
        server,
        [
            {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
            {"tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}]},
            {"content": "{last_tool_result}"},
        ],
        {"enabled": True, "top_k": 1, "max_widenings": 0},
    )
    run = run_query(agent, "A-1001 자산 상태")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first, second = selections(run)[:2]
    assert "get_asset_status_backup" not in offered_names(first)
    assert {o["name"]: o["why"] for o in second["offered"]}["get_asset_status_backup"] == "fallback"
    told = next(m["data"] for m in run.conversation if m["type"] == "tool")
    assert "get_asset_status_backup" in told["content"]  # the gate's message: use the fallback
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert calls.get(tool="get_asset_status").reason == "result:shape"
    assert calls.get(tool="get_asset_status_backup").ok


def test_the_ranker_reads_the_text_of_a_bedrock_turn_not_its_tool_use_blocks(demo_server) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from agents.engine import _tool_index, tool_specs
    from agents.tool_offer import ToolOffer

    class Plan:  # what the index reads of a run's plan
        servers = [demo_server]
        frozen_contracts = None

    index = _tool_index(Plan)  # type: ignore[arg-type]
    offer = ToolOffer(
        index=index,
        specs={s["function"]["name"]: s for s in tool_specs(index)},
        settings=ToolSelectionSettings(enabled=True, top_k=1),
        query="A-1001 자산 상태",
    )
    turn = AIMessage(
        content=[
            {"type": "text", "text": "조회하겠습니다"},
            {"type": "tool_use", "id": "tooluse_1", "name": "get_asset_status", "input": {"asset_id": "A-1001"}},
        ]
    )
    text = offer._ranking_text([HumanMessage("A-1001 자산 상태"), turn])
    assert "조회하겠습니다" in text
    assert "tooluse_1" not in text and "tool_use" not in text and "input" not in text


# ---- the embedding ranker unavailable ----------------------------------------------------------------------------


def test_an_embedding_client_that_cannot_be_built_falls_back_to_lexical_and_the_trace_says_why(
    demo_server, settings, monkeypatch, tmp_path
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))  # "/nonexistent" may exist (root)
    settings.PLATFORM_EMBEDDINGS_URL, settings.PLATFORM_EMBEDDINGS_MODEL = "bedrock", "amazon.titan-embed-text-v2:0"
    agent = scripted_agent(demo_server, [{"content": "ok"}], {"enabled": True, "top_k": 2, "ranker": "embedding"})

    run = run_query(agent, "A-1001 자산 상태")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first = selections(run)[0]
    assert (first["ranker"], first["fallback"]) == ("lexical", "embedding:NoRegionError")
    assert offered_names(first)[0] == "get_asset_status"


def test_the_embedding_ranker_with_no_service_configured_ranks_lexically_and_says_so(demo_server, settings) -> None:
    settings.PLATFORM_EMBEDDINGS_URL = ""
    agent = scripted_agent(demo_server, [{"content": "ok"}], {"enabled": True, "top_k": 2, "ranker": "embedding"})
    run = run_query(agent, "A-1001 자산 상태")
    first = selections(run)[0]
    assert (first["ranker"], first["fallback"]) == ("lexical", "embedding:not_configured")


class RefusingEmbeddings:
    """An OpenAI-compatible ``/embeddings`` endpoint that refuses every request (400: not retried), counting them."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                payload = b'{"error": {"message": "down", "type": "invalid_request_error"}}'
                self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> RefusingEmbeddings:
        import threading

        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow
def test_after_one_embedding_failure_the_run_ranks_lexically_without_asking_the_service_again(
    embeddings, settings
) -> None:
    server = bind_demo_server()  # the tools' vectors are cached: the run asks the service for its query only
    agent = scripted_agent(
        server,
        [
            {"tool_calls": [{"name": "ping", "args": {}}]},
            {"tool_calls": [{"name": "ping", "args": {"x": 1}}]},
            {"content": "ok"},
        ],
        {"enabled": True, "top_k": 2, "ranker": "embedding", "pinned": ["ping"]},
    )
    with RefusingEmbeddings() as refusing:
        settings.PLATFORM_EMBEDDINGS_URL = refusing.url
        run = run_query(agent, "A-1001 자산 상태")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    turns = selections(run)
    assert [(s["ranker"], s.get("fallback")) for s in turns] == [
        ("lexical", "embedding:BadRequestError"),
        ("lexical", None),
        ("lexical", None),
    ]
    assert refusing.requests == 1


# ---- the admin form's checks -------------------------------------------------------------------------------------


def test_the_form_refuses_unknown_tags_pinned_tools_outside_the_filters_and_embedding_without_a_service(
    demo_server, settings
) -> None:
    from agents.agent_settings_form import agent_tool_names, selection_problems

    mcp_tool_update(tool=demo_server.tools.get(name="get_asset"), actor="admin", via="tests", data={"tags": ["자산"]})
    names = agent_tool_names([demo_server])

    def problems(value: dict) -> list[str]:
        return selection_problems(value, tool_names=names, server_ids=[demo_server.mcp_id])

    assert problems({"enabled": True, "tags": ["자산"], "pinned": ["get_asset"]}) == []
    (unknown,) = problems({"tags": ["assets"]})
    assert unknown == "tags: assets is not a tag of this agent's tools; their tags are: 자산"
    (hidden,) = problems({"tags": ["자산"], "pinned": ["ping"], "force_first_tool": "get_asset"})
    assert hidden.startswith("pinned, force_first_tool: ping is outside the servers and tags chosen")
    settings.PLATFORM_EMBEDDINGS_URL = ""
    (ranker,) = problems({"enabled": True, "ranker": "embedding"})
    assert ranker.startswith("ranker: the embedding ranker needs an embedding service")
