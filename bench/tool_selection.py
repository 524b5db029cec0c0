"""Top-K tool selection: how often the right tools are among the offered few, how long selecting takes, and how
many prompt tokens it saves against sending every tool's schema.

Run from the repo root: ``python -m bench.tool_selection [--k 5]``.

The registry is built as the platform builds it: the demo server (``sds-company-data``, a real stdio process)
and the local tools are discovered, ``server-everything`` too where ``tests/thirdparty.py`` has installed it,
and generated servers add tools with realistic Korean and English descriptions (HR, finance, IT, facilities,
sales, logistics, ...) until there are at least 300. Each tool is an ``McpTool`` row, created through the
audited services. The labelled query set holds the seed's tool questions (seed 001's eval set, with their
multi-tool labels) and paraphrased questions for generated tools, Korean and English, worded unlike the
descriptions (at least 100 in all). One generated server is wordy (``WORDY_TOOLS``: descriptions that list the
common request words over and over, labelled for no query, competing with every other tool), and four questions
say, word for word or nearly, an example query an admin wrote on a generated tool (``ADMIN_EXAMPLES``).

For each ranker: ``recall_at_5`` / ``recall_at_3`` (share of a query's labelled tools among the first 5 / 3),
``mrr`` (reciprocal rank of the first labelled tool), ``selection_ms_p50`` (one ``select_tools`` call: scoring
300+ tools and building the offer). The embedding ranker uses ``PLATFORM_EMBEDDINGS_URL`` /
``PLATFORM_EMBEDDINGS_MODEL`` when set, else the tests' local hashed-bigram embedder (a stand-in that needs
no model: its figures say nothing about a real embedding model). ``prompt_tokens_saved_ratio`` (last) compares
the prompt (query + tool specs, tokens estimated as characters / 4, as the scripted model counts them) with the
top-K offer against the prompt with every tool, measured in the same run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
from typing import Any

from bench._stats import median, positive_int

# (English object, Korean object, domain in English, domain in Korean, id argument)
OBJECTS: list[tuple[str, str, str, str]] = [
    ("leave request", "휴가 신청", "HR", "인사"),
    ("payslip", "급여 명세서", "HR", "인사"),
    ("attendance record", "근태 기록", "HR", "인사"),
    ("training course", "교육 과정", "HR", "인사"),
    ("job posting", "채용 공고", "HR", "인사"),
    ("performance review", "인사 평가", "HR", "인사"),
    ("expense report", "경비 정산", "finance", "재무"),
    ("budget", "부서 예산", "finance", "재무"),
    ("invoice", "청구서", "finance", "재무"),
    ("exchange rate", "환율", "finance", "재무"),
    ("tax invoice", "세금계산서", "finance", "재무"),
    ("corporate card", "법인카드", "finance", "재무"),
    ("support ticket", "장애 티켓", "IT", "IT"),
    ("user account", "사용자 계정", "IT", "IT"),
    ("password", "비밀번호", "IT", "IT"),
    ("vpn access", "VPN 접속 권한", "IT", "IT"),
    ("software license", "소프트웨어 라이선스", "IT", "IT"),
    ("server", "서버", "IT", "IT"),
    ("deployment", "배포", "IT", "IT"),
    ("backup job", "백업 작업", "IT", "IT"),
    ("meeting room", "회의실", "facilities", "총무"),
    ("parking spot", "주차 자리", "facilities", "총무"),
    ("access card", "출입카드", "facilities", "총무"),
    ("parcel", "택배", "facilities", "총무"),
    ("cafeteria menu", "구내식당 메뉴", "facilities", "총무"),
    ("office supply", "사무용품", "facilities", "총무"),
    ("customer", "고객 정보", "sales", "영업"),
    ("sales order", "주문", "sales", "영업"),
    ("quotation", "견적서", "sales", "영업"),
    ("contract", "계약서", "sales", "영업"),
    ("inventory", "재고", "logistics", "물류"),
    ("shipment", "배송", "logistics", "물류"),
    ("warehouse", "창고", "logistics", "물류"),
    ("vehicle", "법인 차량", "logistics", "물류"),
    ("purchase order", "구매 발주", "procurement", "구매"),
    ("supplier", "협력사", "procurement", "구매"),
    ("business trip", "출장", "travel", "출장"),
    ("flight booking", "항공권 예약", "travel", "출장"),
    ("hotel booking", "호텔 예약", "travel", "출장"),
    ("security incident", "보안 사고", "security", "보안"),
    ("audit finding", "감사 지적사항", "compliance", "감사"),
    ("policy document", "사내 규정 문서", "compliance", "감사"),
    ("newsletter", "사내 소식지", "communications", "홍보"),
    ("survey", "설문조사", "communications", "홍보"),
    ("calendar event", "일정", "productivity", "업무"),
    ("task", "할 일", "productivity", "업무"),
    ("document", "공유 문서", "productivity", "업무"),
    ("email draft", "메일 초안", "productivity", "업무"),
    ("translation", "번역 요청", "productivity", "업무"),
    ("weather forecast", "날씨 예보", "general", "일반"),
]

# (verb for the tool name, English description pattern, Korean description pattern)
ACTIONS: list[tuple[str, str, str]] = [
    ("get", "Get one {en} by its id with all details.", "{ko} 한 건의 상세 정보를 ID로 조회합니다."),
    ("list", "List {en}s, filtered by owner, team or period.", "{ko} 목록을 담당자, 팀 또는 기간별로 보여줍니다."),
    ("create", "Create a new {en} (submit a request).", "새 {ko}을(를) 등록하거나 신청합니다."),
    ("update", "Update or change an existing {en}.", "기존 {ko}의 내용을 수정하거나 변경합니다."),
    ("cancel", "Cancel or delete a {en}.", "{ko}을(를) 취소하거나 삭제합니다."),
    ("search", "Search {en}s by keyword.", "키워드로 {ko}을(를) 검색합니다."),
]

# Questions, worded unlike the descriptions: (verb, Korean pattern, English pattern).
PHRASES: list[tuple[str, str, str]] = [
    ("get", "{ko} 자세히 좀 보여줘, 번호는 {n}번이야", "show me the details of {en} number {n}"),
    ("list", "우리 팀 {ko} 목록 전부 알려줘", "which {en}s does my team have this month?"),
    ("create", "{ko} 새로 신청하고 싶어요", "I need to submit a new {en}"),
    ("update", "{ko} 내용 좀 변경해 주세요", "please change my {en}"),
    ("cancel", "어제 올린 {ko} 취소해 줘", "cancel the {en} I made yesterday"),
    ("search", "'{kw}' 들어간 {ko} 검색해줘", "find {en}s mentioning '{kw}'"),
]

SEED_QUESTIONS: list[tuple[str, list[str]]] = [
    ("김하늘 님은 어느 팀 소속인가요?", ["search_employee"]),
    (
        "'프린터가 고장 났어요' 문의 부서를 분류하고 48건이 12% 늘면 몇 건인지 계산해줘.",
        ["classify_request", "calculate"],
    ),
    ("이서준 님이 소속된 팀에서 진행 중인 프로젝트를 알려주세요.", ["search_employee", "list_projects"]),
    ("A-1001 자산의 현재 상태를 알려주세요.", ["get_asset_status"]),
    ("클라우드운영팀 인원은 몇 명이야?", ["list_team_members"]),
    ("박도윤 님이 가진 노트북 자산 목록 보여줘", ["get_asset"]),
]


# A server that writes its tools' descriptions to be offered for every question (text the platform does not
# control): the common request words, Korean and English, over and over. Its tools are labelled for no query.
WORDY_SERVER = "gen-wordy-hub"
WORDY_WORDS = (
    "무엇이든 조회, 검색, 확인해서 알려줘, 정보, 현황, 목록 좀 보여줘, 자세히, 오늘, 이번 달, 내, 우리 팀, 찾아줘, "
    "관련, 할 일, 일정, 규정. Look up, find, search, show, list, get details, what's on my today, anything."
)
WORDY_TOOLS = ["ask_anything", "find_everything", "lookup_info", "quick_search", "smart_answer"]

# Questions an admin wrote on a tool's page (example queries, through the audited service) and the labelled query
# that says them: word for word, or nearly. Each is made of common words the wordy server's text lists too.
ADMIN_EXAMPLES: list[tuple[str, str, str]] = [
    ("list_task", "오늘 내가 할 일 목록 좀 알려줘", "오늘 내가 할 일 목록 좀 알려줘"),
    ("get_attendance_record", "이번 달 내 근태 현황 확인해서 알려줘", "이번 달 내 근태 현황 확인해서 알려줘"),
    ("list_calendar_event", "what's on my schedule today?", "what's on my schedule today?"),
    ("search_policy_document", "재택근무 규정 찾아줘", "재택근무 관련 규정 좀 찾아줘"),
]


def slug(text: str) -> str:
    return text.replace(" ", "_")


def generated_tools() -> list[dict[str, Any]]:
    tools = []
    for en, ko, domain, domain_ko in OBJECTS:
        for verb, en_pattern, ko_pattern in ACTIONS:
            tools.append(
                {
                    "server": f"gen-{slug(domain.lower())}",
                    "name": f"{verb}_{slug(en)}",
                    "description": f"[{domain_ko}] {ko_pattern.format(ko=ko)} {en_pattern.format(en=en)}",
                    "input_schema": {
                        "type": "object",
                        "properties": {
                            f"{slug(en)}_id": {"type": "string"},
                            **({"keyword": {"type": "string"}} if verb == "search" else {}),
                            **({"owner": {"type": "string"}, "period": {"type": "string"}} if verb == "list" else {}),
                        },
                    },
                }
            )
    for name in WORDY_TOOLS:
        tools.append(
            {
                "server": WORDY_SERVER,
                "name": name,
                "description": f"{name.replace('_', ' ')}: " + " ".join([WORDY_WORDS] * 3),
                "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
            }
        )
    return tools


def labelled_queries() -> list[tuple[str, list[str]]]:
    queries = list(SEED_QUESTIONS)
    for i, (en, ko, _domain, _domain_ko) in enumerate(OBJECTS):
        # Two questions per object, Korean and English, on different actions: 100 generated questions.
        for j, language in ((i % 6, "ko"), ((i + 3) % 6, "en")):
            verb, ko_pattern, en_pattern = PHRASES[j]
            text = (ko_pattern if language == "ko" else en_pattern).format(ko=ko, en=en, n=100 + i, kw="긴급")
            queries.append((text, [f"{verb}_{slug(en)}"]))
    queries += [(query, [tool]) for tool, _example, query in ADMIN_EXAMPLES]
    return queries


def installed_everything() -> Any:
    """``server-everything`` where the third-party tests installed it (looked up before the bench moves
    ``PLATFORM_VAR_DIR`` to its temporary folder), else None."""
    node = shutil.which("node")
    if not node:
        return None
    from tests.thirdparty import _everything_installed

    return _everything_installed(node)


def build_registry(progress: Any, everything: Any) -> list[str]:
    """Bind and discover the real servers, add the generated ones; returns the servers' ids."""
    from django.core.management import call_command

    from mcpregistry.models import McpServer, McpTool
    from mcpregistry.services import mcp_server_create, mcp_server_discover, mcp_tool_create, mcp_tool_update

    call_command("seed_demo", "--no-discover", stdout=io.StringIO())
    demo = McpServer.objects.get(mcp_id="sds-company-data")
    report = mcp_server_discover(server=demo, actor="bench", via="bench")
    if not report.ok:
        raise SystemExit(f"the demo server could not be discovered: {report.error}")
    ids = ["sds-company-data", "local"]
    if everything is not None:
        command = everything.stdio()
        server = mcp_server_create(
            actor="bench",
            via="bench",
            data={
                "mcp_id": "everything",
                "name": "server-everything",
                "command": command.command,
                "args": command.args,
                "timeout_s": 30,
            },
        )
        if mcp_server_discover(server=server, actor="bench", via="bench").ok:
            ids.append("everything")
    servers: dict[str, McpServer] = {}
    for spec in generated_tools():
        server = servers.get(spec["server"])
        if server is None:
            server = mcp_server_create(
                actor="bench",
                via="bench",
                data={
                    "mcp_id": spec["server"],
                    "name": spec["server"],
                    "transport": "streamable_http",
                    "url": f"https://tools.example.com/{spec['server']}/mcp",
                },
            )
            servers[spec["server"]] = server
            ids.append(server.mcp_id)
        mcp_tool_create(
            server=server,
            name=spec["name"],
            actor="bench",
            via="bench",
            data={"description": spec["description"], "input_schema": spec["input_schema"]},
        )
    for tool_name, example, _query in ADMIN_EXAMPLES:
        tool = McpTool.objects.get(server__mcp_id__startswith="gen-", name=tool_name)
        mcp_tool_update(tool=tool, actor="bench", via="bench", data={"example_queries": [example]})
    progress(f"registry: {len(ids)} servers")
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--k", type=positive_int, default=5)
    parser.add_argument("--repeat", type=positive_int, default=5, help="timing passes over the query set")
    options = parser.parse_args()

    from bench._django import setup_django

    everything = installed_everything()
    setup_django()
    import logging

    logging.disable(logging.INFO)  # the embedding client logs every request

    def progress(message: str) -> None:
        print(message, file=sys.stderr)

    from agents.engine import _tool_index, tool_specs
    from agents.tool_offer import tool_doc
    from agents.tool_selection import EmbeddingRanker, LexicalRanker, ToolSelectionSettings, select_tools
    from mcpregistry.embeddings import embedding_ranker_inputs
    from mcpregistry.models import McpServer

    ids = build_registry(progress, everything)

    class Plan:
        servers = list(McpServer.objects.filter(mcp_id__in=ids).prefetch_related("tools"))
        frozen_contracts = None  # the registry's contracts, as a run of an agent never published

    index = _tool_index(Plan)  # type: ignore[arg-type]
    docs = [tool_doc(name, server, tool) for name, (server, tool) in index.items()]
    specs = {s["function"]["name"]: s for s in tool_specs(index)}
    queries = labelled_queries()
    missing = {t for _q, labels in queries for t in labels if t not in index}
    if missing:
        raise SystemExit(f"labelled tools missing from the registry: {sorted(missing)}")
    progress(f"{len(index)} tools, {len(queries)} labelled queries")

    from contextlib import ExitStack

    stack = ExitStack()
    if not os.environ.get("PLATFORM_EMBEDDINGS_URL"):
        from django.conf import settings

        from tests.embedding_server import EmbeddingServer

        embedder = stack.enter_context(EmbeddingServer())
        settings.PLATFORM_EMBEDDINGS_URL, settings.PLATFORM_EMBEDDINGS_MODEL = embedder.url, "hashed-256"
    rankers: dict[str, Any] = {"lexical": LexicalRanker(docs)}
    inputs = embedding_ranker_inputs({name: tool for name, (_server, tool) in index.items()})
    if inputs is not None:
        rankers["embedding"] = EmbeddingRanker(*inputs)
    settings_k = ToolSelectionSettings(enabled=True, top_k=options.k)

    lines: list[str] = []
    offered_sizes: list[int] = []
    for name, ranker in rankers.items():
        hits5 = hits3 = rr = 0.0
        times: list[float] = []
        for _ in range(options.repeat):
            for text, _labels in queries:
                selection = select_tools(ranker=ranker, text=text, candidates=docs, settings=settings_k)
                times.append(selection.elapsed_ms)
        for text, labels in queries:
            scores = ranker.score(text)
            ranked = sorted(index, key=lambda n: (-scores.get(n, 0.0), n))
            hits5 += sum(1 for t in labels if t in ranked[:5]) / len(labels)
            hits3 += sum(1 for t in labels if t in ranked[:3]) / len(labels)
            first = min(ranked.index(t) for t in labels)
            rr += 1 / (first + 1)
            if name == "lexical":
                offered_sizes.append(
                    len(select_tools(ranker=ranker, text=text, candidates=docs, settings=settings_k).offered)
                )
        n = len(queries)
        lines += [
            f"{name}_recall_at_5: {hits5 / n:.3f}",
            f"{name}_recall_at_3: {hits3 / n:.3f}",
            f"{name}_mrr: {rr / n:.3f}",
            f"{name}_selection_ms_p50: {median(times):.3f}",
        ]
    stack.close()

    all_specs_chars = len(json.dumps(list(specs.values()), ensure_ascii=False))
    full = selected = 0
    for (text, _labels), size in zip(queries, offered_sizes, strict=True):
        offer = select_tools(ranker=rankers["lexical"], text=text, candidates=docs, settings=settings_k).offered
        assert len(offer) == size
        full += (len(text) + all_specs_chars) // 4
        selected += (len(text) + len(json.dumps([specs[o] for o in offer], ensure_ascii=False))) // 4
    print(f"tools: {len(index)}")
    print(f"queries: {len(queries)}")
    print(f"servers: {len(ids)}")
    print(f"top_k: {options.k}")
    for line in lines:
        print(line)
    print(f"prompt_tokens_all_tools: {full / len(queries):.0f}")
    print(f"prompt_tokens_top_k: {selected / len(queries):.0f}")
    print(f"prompt_tokens_saved_ratio: {1 - selected / full:.3f}")


if __name__ == "__main__":
    main()
