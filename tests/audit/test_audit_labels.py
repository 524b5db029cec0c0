"""An audit event's codes in words: the list and an event's page name what happened and why in the reader's
language, with the code beside the words; an unknown code is shown as it is."""

from __future__ import annotations

import re

import pytest
from django.utils import translation

from agents.models import Agent, Run
from audit.labels import action_label, reason_label
from audit.services import audit_event_record


@pytest.mark.parametrize(
    ("language", "action", "words"),
    [
        ("en", "tool.call", "tool call"),
        ("ko", "tool.call", "도구 호출"),
        ("ko", "rule.decision", "규칙 판정"),
        ("en", "tool.fallback", "handed to the fallback tool"),
        ("ko", "tool.fallback", "대체 도구로 넘김"),
        ("en", "config.tool_contract.update", "tool contract changed"),
        ("ko", "config.tool_contract.update", "도구 계약 변경"),
        ("ko", "config.api_key.revoke", "API 키 폐기"),
        ("ko", "config.group.create", "그룹 생성"),
        ("ko", "approval.reject", "거부"),
        ("ko", "config.nothing_like_it.update", "config.nothing_like_it.update"),  # no such entity
        ("ko", "config.agent.teleport", "config.agent.teleport"),  # no such change
        ("ko", "something.new", "something.new"),
    ],
)
def test_an_action_is_named_in_the_readers_language(language: str, action: str, words: str) -> None:
    with translation.override(language):
        assert action_label(action) == words


@pytest.mark.parametrize(
    ("language", "reason", "words"),
    [
        ("en", "args:allowed:region", "argument region not an allowed value"),
        ("ko", "args:allowed:region", "인자 region 허용되지 않은 값"),
        ("ko", "args:missing:name", "인자 name 누락"),
        ("ko", "args:unknown:nmae", "알 수 없는 인자 nmae"),
        ("ko", "args:json", "인자가 JSON 객체가 아님"),
        ("ko", "rate_limit", "호출 한도 초과"),
        ("ko", "result:shape", "응답 형식 오류"),
        ("ko", "rule:skipped", "규칙 건너뜀"),
        ("ko", "approval:mismatch", "승인된 인자와 다름"),
        ("en", "mcp:not_loaded:crm", "server crm not connected"),
        ("ko", "args:teleport:x", "args:teleport:x"),
        ("ko", "made:up", "made:up"),
        ("ko", "", ""),
    ],
)
def test_a_reason_is_named_in_the_readers_language(language: str, reason: str, words: str) -> None:
    with translation.override(language):
        assert reason_label(reason) == words


def visible(html: str) -> str:
    """The page's text as a reader sees it: tags (and the break hints between a code's parts) removed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.replace("<wbr>", "")))


@pytest.mark.django_db
def test_the_list_names_each_event_in_words_with_its_code(auditor_client) -> None:
    agent = Agent.objects.create(slug="ledger", name="장부")
    run = Run.objects.create(agent=agent, query="A-1001 상태")
    audit_event_record(
        source="agent", run_id=run.pk, mcp_id="sds-company-data", tool="list_team_members", ok=False,
        reason="args:allowed:region", attempt=2, latency_ms=3.5, actor="api_key:apk_abc",
    )  # fmt: skip
    audit_event_record(source="admin", action="config.tool_contract.update", mcp_id="crm", tool="lookup", actor="ann")
    page = auditor_client.get("/admin/audit/auditevent/", HTTP_ACCEPT_LANGUAGE="ko")
    text = visible(page.content.decode())
    assert [column for column in page.context["cl"].list_display if column != "action_checkbox"] == [
        "id", "when", "event", "tool_column", "outcome_column", "latency", "run_link", "actor_column",
    ]  # fmt: skip
    for shown in (
        "도구 호출 에이전트 (모델) tool.call",  # what, who asked (the source), the code
        "인자 region 허용되지 않은 값 args:allowed:region",
        "args:allowed:region 2번째 시도 3.5",
        "sds-company-data list_team_members",
        f"ledger {str(run.pk)[:8]}",
        "도구 계약 변경 관리자 config.tool_contract.update",
        "API 키 apk_abc… api_key:apk_abc",  # who acted in words, above the code the filters use
    ):
        assert shown in text, shown
    assert f'href="/admin/agents/run/{run.pk}/change/"' in page.content.decode()
    assert "ann ann" not in text  # a username has no other words: once
    audit_event_record(source="agent", run_id=run.pk, mcp_id="crm", tool="slow", latency_ms=900.0, actor="x")
    for column, key in (("latency", lambda e: e.latency_ms or 0), ("run_link", lambda e: e.agent_slug or "")):
        position = page.context["cl"].list_display.index(column)
        listed = auditor_client.get(f"/admin/audit/auditevent/?o=-{position}").context["cl"].result_list
        assert [key(e) for e in listed] == sorted((key(e) for e in listed), reverse=True), column
    actions = next(spec for spec in page.context["cl"].filter_specs if spec.parameter_name == "action")
    assert ("tool.call", "도구 호출") in actions.lookup_choices
    reasons = next(spec for spec in page.context["cl"].filter_specs if spec.parameter_name == "reason")
    assert list(reasons.lookup_choices) == [("args:allowed:region", "인자 region 허용되지 않은 값")]


@pytest.mark.django_db
def test_an_events_page_shows_its_codes_in_words_and_its_numbers_rounded(auditor_client) -> None:
    event = audit_event_record(
        source="deterministic", mcp_id="crm", tool="lookup", ok=False, reason="timeout", latency_ms=4072.4961050000275
    )
    page = auditor_client.get(f"/admin/audit/auditevent/{event.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko")
    text = visible(page.content.decode())
    assert "도구 호출 tool.call" in text and "제한 시간 내 응답 없음 timeout" in text
    assert "4,072.5" in text and "4072.496" not in text  # the raw float is not listed before the fields
    assert text.index("ID:") < text.index("도구 호출 tool.call") < text.index("제한 시간 내 응답 없음 timeout")


@pytest.mark.django_db
def test_the_list_leaves_out_skipped_rule_decisions_in_a_click(auditor_client) -> None:
    for reason in ("rule:skipped", "rule:skipped", "rule:matched"):
        audit_event_record(source="deterministic", action="rule.decision", tool="lookup", reason=reason, attempt=0)
    audit_event_record(source="deterministic", tool="lookup", ok=True)
    page = auditor_client.get("/admin/audit/auditevent/", HTTP_ACCEPT_LANGUAGE="ko")
    reasons = next(spec for spec in page.context["cl"].filter_specs if spec.parameter_name == "reason")
    assert reasons.lookup_choices[0] == ("!rule:skipped", "건너뛴 규칙 판정 빼고 모두")

    fewer = auditor_client.get("/admin/audit/auditevent/?reason=!rule:skipped", HTTP_ACCEPT_LANGUAGE="ko")
    listed = fewer.context["cl"].result_list
    assert sorted(e.reason for e in listed if e.source == "deterministic") == ["", "rule:matched"]
    assert "rule:skipped" not in {e.reason for e in listed}
    assert "reason=%21rule%3Askipped" in fewer.context["audit_export_url"]  # the export takes the same events


@pytest.mark.django_db
def test_a_calls_arguments_are_a_row_each_on_its_events_page(auditor_client) -> None:
    event = audit_event_record(
        source="agent", mcp_id="crm", tool="lookup", args={"name": "김하늘", "limit": 5, "code": "5"}, ok=True
    )
    page = auditor_client.get(f"/admin/audit/auditevent/{event.pk}/change/").content.decode()
    table = re.search(r'<table class="audit-arg-rows">.*?</table>', page, re.S)
    assert table is not None
    assert re.findall(r"<tr><th><code>(.*?)</code></th><td>(.*?)</td></tr>", table.group(0)) == [
        ("name", "김하늘"),
        ("limit", "5"),
        ("code", "&quot;5&quot;"),
    ]
    raw = audit_event_record(source="agent", mcp_id="crm", tool="lookup", args={"_raw": "{name: 김하늘}"}, ok=False)
    page = auditor_client.get(f"/admin/audit/auditevent/{raw.pk}/change/").content.decode()
    assert "<tr><th><code>_raw</code></th><td>{name: 김하늘}</td></tr>" in page


@pytest.mark.django_db
def test_the_exports_take_the_lists_date_drill_down_and_say_they_do_not_search(auditor_client) -> None:
    from urllib.parse import parse_qs, urlsplit

    audit_event_record(source="agent", mcp_id="s", tool="t", ok=True)

    def export_query(url: str) -> dict[str, list[str]]:
        page = auditor_client.get(url)
        assert page.status_code == 200
        return parse_qs(urlsplit(page.context["audit_export_url"]).query)

    assert export_query("/admin/audit/auditevent/?created_at__year=2026&created_at__month=12&created_at__day=5") == {
        "since": ["2026-12-05"],
        "until": ["2026-12-05"],  # a bare date: to the end of that day, as the list's drill-down
    }
    assert export_query("/admin/audit/auditevent/?created_at__year=2024&created_at__month=2&tool=t") == {
        "since": ["2024-02-01"],
        "until": ["2024-02-29"],
        "tool": ["t"],
    }
    # Within a period already chosen, the tighter ends.
    assert export_query("/admin/audit/auditevent/?created_at__year=2026&since=2026-03-10") == {
        "since": ["2026-03-10"],
        "until": ["2026-12-31"],
    }
    searched = auditor_client.get("/admin/audit/auditevent/?q=zzz").content.decode()
    assert "not the search box" in searched
    assert "not the search box" not in auditor_client.get("/admin/audit/auditevent/").content.decode()


@pytest.mark.parametrize(
    "code",
    [
        "max_iterations",
        "model:throttled",
        "model:timeout",
        "model:connection",
        "model:validation",
        "model:auth",
        "model:error",
        "model:max_tokens",
        "model:empty",
        "model:context_window",
        "model:content_filter",
        "model:malformed",
        "retries_exhausted",
        "config:model_endpoint_changed",
    ],
)
def test_every_way_a_run_can_end_has_words(code: str) -> None:
    # Codes the engine writes as a run's error: the runs list and a run's page showed them bare.
    with translation.override("en"):
        assert reason_label(code) != code
    with translation.override("ko"):
        assert reason_label(code) != code and re.search("[가-힣]", reason_label(code))


def test_a_tool_withdrawn_by_the_platform_is_not_said_to_be_withdrawn_by_its_server() -> None:
    with translation.override("en"):
        assert reason_label("tool:withdrawn") == "tool withdrawn after repeated invalid arguments"
