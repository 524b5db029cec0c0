"""An eval case's and set's JSON fields as inputs named for what they hold (``evals/case_editor.py``): what an
admin types is stored as the JSON the scoring reads; a page sent back unchanged changes nothing; a value the
inputs cannot show is shown as JSON (nothing is lost by opening a case); lines that do not read are refused,
naming the line, and shown again as typed."""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent
from audit.models import AuditEvent
from evals.models import EvalCase, EvalSet
from evals.scoring import MAX_METRICS, RATE_METRICS
from evals.services import eval_case_create, eval_set_create
from mcpregistry.models import McpServer, McpTool

pytestmark = pytest.mark.django_db


class _Form(HTMLParser):
    """What a browser would send for the page's change form: each input, checked box, textarea and selection."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.data: list[tuple[str, str]] = []
        self._textarea: str | None = None
        self._select: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name", "")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio"):
                if "checked" in a:
                    self.data.append((name, a.get("value") or "on"))
            else:
                self.data.append((name, a.get("value", "")))
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.data.append((self._select, a.get("value", "")))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea" and self._textarea is not None:
            text = "".join(self._text)
            self.data.append((self._textarea, text[1:] if text.startswith("\n") else text))
            self._textarea = None
        elif tag == "select":
            self._select = None


def sent_back(page: str, **changes: str) -> dict[str, Any]:
    """The page's form as a browser sends it, with ``changes`` typed into it."""
    parser = _Form()
    start = page.index('id="evalset_form"')
    parser.feed(page[start : page.index("</form>", start)])
    data: dict[str, Any] = {}
    for name, value in parser.data:
        if "__prefix__" in name:
            continue
        data.setdefault(name, []).append(value)
    data.update({k: [v] for k, v in changes.items()})
    return data


TOOLS = ("get_asset", "list_projects", "search_employee", "search_employee_backup")


@pytest.fixture
def eval_set() -> EvalSet:
    """A set whose agent binds a server with the tools the cases name (a case may name only tools that exist)."""
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    server = McpServer.objects.create(mcp_id="company", name="company", command=sys.executable, args=[])
    for name in TOOLS:
        McpTool.objects.create(server=server, name=name, discovered_at=timezone.now())
    agent.servers.set([server])
    return eval_set_create(actor="test", via="tests", data={"name": "seed", "agent": agent})


def case(eval_set: EvalSet, **fields: Any) -> EvalCase:
    data = {"eval_set": eval_set, "key": "q1", "query": "김하늘 님은 어느 팀?", "case_type": "single_tool", **fields}
    return eval_case_create(actor="test", via="tests", data=data)


def page_of(client: Client, eval_set: EvalSet) -> str:
    return client.get(f"/admin/evals/evalset/{eval_set.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()


def refused(client: Client, eval_set: EvalSet, **typed: str) -> str:
    """The set's page sent back with ``typed`` in it, refused (in Korean): the page that says why."""
    response = client.post(
        f"/admin/evals/evalset/{eval_set.pk}/change/",
        sent_back(page_of(client, eval_set), **typed),
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert response.status_code == 200
    return response.content.decode()


def test_what_an_admin_types_is_stored_as_the_json_the_scoring_reads(admin_client: Client, eval_set: EvalSet) -> None:
    stored = case(eval_set)
    typed = {
        "cases-0-expected_tools__lines": "search_employee\n  name=김하늘\n\nlist_projects\n  team=클라우드운영팀\n  limit=5",
        "cases-0-forbidden_tools__lines": "get_asset\n",
        "cases-0-answer_checks__contains": "클라우드운영팀\n 팀장 \n",
        "cases-0-answer_checks__regex": "A-[0-9]{4}",
        "cases-0-alternatives__lines": "search_employee_backup, list_projects  # 백업 경로",
        "cases-0-context__lines": "userId=E-001\ntier=3\nvip=true",
        "cases-0-data__lines": "asset_id=A-1001\n\norder.id=7",
        "thresholds__pass_rate": "0.9",
        "thresholds__forbidden_violations": "0",
    }
    response = admin_client.post(
        f"/admin/evals/evalset/{eval_set.pk}/change/", sent_back(page_of(admin_client, eval_set), **typed)
    )
    assert response.status_code == 302, response.content.decode()[-3000:]

    stored.refresh_from_db()
    assert stored.expected_tools == [
        {"name": "search_employee", "args": {"name": "김하늘"}},
        {"name": "list_projects", "args": {"team": "클라우드운영팀", "limit": 5}},
    ]
    assert stored.forbidden_tools == ["get_asset"]
    assert stored.answer_checks == [{"contains": "클라우드운영팀"}, {"contains": "팀장"}, {"regex": "A-[0-9]{4}"}]
    assert stored.alternatives == [{"tools": ["search_employee_backup", "list_projects"], "note": "백업 경로"}]
    assert stored.context == {"userId": "E-001", "tier": 3, "vip": True}
    assert stored.data == [{"asset_id": "A-1001"}, {"order": {"id": 7}}]  # a path, as the rule editor reads it
    assert EvalSet.objects.get(pk=eval_set.pk).thresholds == {"pass_rate": 0.9, "forbidden_violations": 0}


def test_no_tool_at_all_and_it_does_not_know_are_boxes(admin_client: Client, eval_set: EvalSet) -> None:
    stored = case(eval_set, case_type="no_answer")
    data = sent_back(page_of(admin_client, eval_set))
    data["cases-0-forbidden_tools__none"] = ["1"]
    data["cases-0-answer_checks__dont_know"] = ["1"]
    assert admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data).status_code == 302
    stored.refresh_from_db()
    assert stored.forbidden_tools == ["*"] and stored.answer_checks == [{"dont_know": True}]
    page = page_of(admin_client, eval_set)
    assert 'name="cases-0-forbidden_tools__none" value="1" checked' in page
    assert 'name="cases-0-answer_checks__dont_know" value="1" checked' in page
    assert "도구를 전혀 부르지 않음" in page and "모른다고 답함" in page


def test_a_page_sent_back_unchanged_changes_nothing(admin_client: Client, eval_set: EvalSet) -> None:
    EvalSet.objects.filter(pk=eval_set.pk).update(thresholds={"pass_rate": 0.9, "latency_p95_ms": 2500})
    case(
        eval_set,
        # As the seed import and older pages wrote them: names as objects, checks in another order.
        expected_tools=[{"name": "search_employee"}, {"name": "list_projects", "args": {"team": "A팀", "n": 2}}],
        forbidden_tools=["*"],
        answer_checks=[{"regex": "A-[0-9]{4}"}, {"dont_know": True}, {"contains": "팀"}],
        alternatives=[{"tools": [{"name": "search_employee_backup"}], "note": "백업"}],
        context={"userId": "E-001", "tier": 3, "code": "3"},
        data=[{"asset_id": "A-1001", "count": 2}],
    )
    before = AuditEvent.objects.count()
    page = page_of(admin_client, eval_set)
    assert "search_employee\nlist_projects\n  team=A팀\n  n=2</textarea>" in page
    assert "code=&quot;3&quot;" in page  # text that would read as a number is quoted, so it stays text

    response = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", sent_back(page))

    assert response.status_code == 302, response.content.decode()[-3000:]
    assert AuditEvent.objects.count() == before  # nothing changed, nothing recorded
    stored = EvalCase.objects.get(eval_set=eval_set)
    assert stored.answer_checks == [{"regex": "A-[0-9]{4}"}, {"dont_know": True}, {"contains": "팀"}]
    assert stored.context == {"userId": "E-001", "tier": 3, "code": "3"}


def test_a_value_the_inputs_cannot_show_is_edited_as_json(admin_client: Client, eval_set: EvalSet) -> None:
    nested = [{"note": "두 줄\n메모", "order": {"id": 7}}]  # a line break no line can carry
    stored = case(eval_set, data=nested, answer_checks=[{"contains": "a\nb"}])
    page = page_of(admin_client, eval_set)
    assert 'name="cases-0-data__lines"' not in page and 'name="cases-0-data"' in page
    assert 'name="cases-0-answer_checks__contains"' not in page and 'name="cases-0-answer_checks"' in page
    assert "JSON으로 표시" in page
    before = AuditEvent.objects.count()
    assert admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", sent_back(page)).status_code == 302
    stored.refresh_from_db()
    assert stored.data == nested and AuditEvent.objects.count() == before


def test_lines_that_do_not_read_are_refused_naming_the_line_and_shown_again(
    admin_client: Client, eval_set: EvalSet
) -> None:
    stored = case(eval_set, expected_tools=["search_employee"])
    typed = {
        "cases-0-expected_tools__lines": "  name=김하늘\nsearch_employee",
        "cases-0-context__lines": "userId=E-001\ntier 3",
        "thresholds__recall": "높음",
    }
    page = refused(admin_client, eval_set, **typed)
    assert "1번째 줄: 도구보다 먼저 나온 인자" in page
    assert "2번째 줄: KEY=value 형식으로 쓰세요" in page
    assert "도구 재현율: 숫자여야 합니다" in page
    assert "  name=김하늘\nsearch_employee</textarea>" in page  # as typed, to fix
    stored.refresh_from_db()
    assert stored.expected_tools == ["search_employee"]


def test_the_thresholds_are_one_input_per_score_in_words(admin_client: Client, eval_set: EvalSet) -> None:
    page = page_of(admin_client, eval_set)
    for score in RATE_METRICS + MAX_METRICS:
        assert f'name="thresholds__{score}"' in page, score
    assert "도구 재현율" in page and "최소 (0~1)" in page and "최대" in page
    assert 'name="thresholds"' not in page  # no JSON to write


@pytest.mark.parametrize(
    ("field", "stored"),
    [
        ("expected_tools", [{"name": "search_employee", "args": {"name": " 김하늘"}}]),  # spaces kept
        ("expected_tools", [{"name": "t", "args": {"q": "a\nb"}}]),  # a line break
        ("expected_tools", [{"name": "t", "args": {"a=b": 1}}]),
        ("expected_tools", [{"name": "t", "args": {" k": 1}}]),
        ("expected_tools", ["a=b", "\tfoo"]),
        ("expected_tools", [{"name": "t", "args": {}}]),
        ("expected_tools", [{"name": "t", "args": {"n": "NaN", "big": 123456789012345678901}}]),
        ("forbidden_tools", ["get_asset", "*"]),
        ("forbidden_tools", [" get_asset"]),
        ("forbidden_tools", ["*", "*"]),
        ("forbidden_tools", ["a\rb"]),
        ("alternatives", [{"tools": []}]),
        ("alternatives", [{"tools": [], "note": "되묻기"}]),
        ("alternatives", [{"tools": ["a"], "note": ""}]),
        ("alternatives", [{"tools": ["a"], "note": " n "}]),
        ("context", {"k": "x\u2028y", "n": "NaN", "t": "3", "e": ""}),
        ("answer_checks", [{"contains": "a\u2028b"}]),
        ("data", [{"a": 1}, {"b": "x y", "c": {"d": [1, 2]}}]),
        ("data", [{"order.id": 7}, {"empty": {}}]),  # a key with a dot, an empty object: shown as JSON
    ],
)
def test_any_stored_value_survives_a_page_sent_back_unchanged(
    admin_client: Client, eval_set: EvalSet, field: str, stored: Any
) -> None:
    """Whatever a case holds (written by an import, the API or an older page), opening its set's page and
    saving it unchanged changes nothing: a value the inputs cannot show exactly is shown as JSON."""
    case(eval_set, **{field: stored})
    before = AuditEvent.objects.count()
    response = admin_client.post(
        f"/admin/evals/evalset/{eval_set.pk}/change/", sent_back(page_of(admin_client, eval_set))
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert getattr(EvalCase.objects.get(eval_set=eval_set), field) == stored
    assert AuditEvent.objects.count() == before


def test_nan_stays_text_and_a_key_given_twice_is_refused(admin_client: Client, eval_set: EvalSet) -> None:
    stored = case(eval_set)
    page = page_of(admin_client, eval_set)
    saved = admin_client.post(
        f"/admin/evals/evalset/{eval_set.pk}/change/",
        sent_back(page, **{"cases-0-context__lines": "x=NaN\ny=Infinity"}),
    )
    assert saved.status_code == 302  # was a 500: NaN is no JSON a database stores
    stored.refresh_from_db()
    assert stored.context == {"x": "NaN", "y": "Infinity"}
    twice = refused(admin_client, eval_set, **{"cases-0-context__lines": "tier=1\ntier=2"})
    assert "2번째 줄: tier 키가 두 번 나옵니다" in twice


def test_a_threshold_that_is_no_number_is_shown_again_in_its_input(admin_client: Client, eval_set: EvalSet) -> None:
    typed = {"thresholds__pass_rate": "0.9", "thresholds__recall": "abc", "thresholds__latency_p95_ms": "nan"}
    page = refused(admin_client, eval_set, **typed)
    assert 'name="thresholds__recall" id="thresholds__recall" value="abc"' in page  # the inputs, as typed
    assert 'name="thresholds__pass_rate" id="thresholds__pass_rate" value="0.9"' in page
    assert "도구 재현율: 숫자여야 합니다" in page and "지연 p95 (ms): 숫자여야 합니다" in page
    assert '<textarea name="thresholds"' not in page
    assert EvalSet.objects.get(pk=eval_set.pk).thresholds == {}


def test_a_tool_name_no_server_has_is_refused_naming_the_agents_tools(admin_client: Client, eval_set: EvalSet) -> None:
    stored = case(eval_set, expected_tools=[{"name": "search_employee"}])
    page = page_of(admin_client, eval_set)
    assert "에이전트의 도구: get_asset, list_projects, search_employee, search_employee_backup." in page
    page = refused(
        admin_client,
        eval_set,
        **{
            "cases-0-expected_tools__lines": "search_employe\n  name=김하늘",
            "cases-0-forbidden_tools__lines": "*\ndelete_everything",
            "cases-0-alternatives__lines": "list_project  # 오타",
        },
    )
    for name in ("search_employe", "delete_everything", "list_project"):
        assert f"{name}: 이 이름의 도구를 가진 서버가 없습니다" in page, name
    stored.refresh_from_db()
    assert stored.expected_tools == [{"name": "search_employee"}]


def test_a_refused_regex_marks_and_names_its_own_box_not_the_contains_box(
    admin_client: Client, eval_set: EvalSet
) -> None:
    """The admin's form row marked both answer boxes red when only the regex was refused, and the error did not
    say which box it was in."""
    import re

    stored = case(eval_set, answer_checks=[{"contains": "팀"}])
    typed = {"cases-0-answer_checks__contains": "클라우드운영팀", "cases-0-answer_checks__regex": "A-[0-9"}
    response = admin_client.post(
        f"/admin/evals/evalset/{eval_set.pk}/change/",
        sent_back(page_of(admin_client, eval_set), **typed),
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert response.status_code == 200
    page = response.content.decode()

    def box(kind: str) -> str:
        found = re.search(rf'<textarea name="cases-0-answer_checks__{kind}"[^>]*>', page)
        assert found is not None, kind
        return found.group(0)

    assert 'class="eval-invalid" aria-invalid="true"' in box("regex")
    assert 'aria-describedby="id_cases-0-answer_checks_error"' in box("regex")
    assert "eval-invalid" not in box("contains") and "aria-invalid" not in box("contains")
    assert '<div class="eval-checks eval-checks-marked">' in page  # the row's red is for the marked box alone
    assert "“the answer matches (a regular expression per line)”: A-[0-9: not a valid regular expression:" in page
    assert ">클라우드운영팀</textarea>" in page and ">A-[0-9</textarea>" in page  # both boxes as typed, to fix
    stored.refresh_from_db()
    assert stored.answer_checks == [{"contains": "팀"}]


def test_a_regex_past_the_bound_is_refused_in_its_box_too(admin_client: Client, eval_set: EvalSet) -> None:
    case(eval_set)
    page = refused(admin_client, eval_set, **{"cases-0-answer_checks__regex": "((a{1000}){1000}){1000}"})
    assert ">((a{1000}){1000}){1000}</textarea>" in page
    assert 'placeholder="A-[0-9]{4}" class="eval-invalid" aria-invalid="true"' in page
    assert EvalCase.objects.get(eval_set=eval_set).answer_checks == []


def as_a_browser_sends(data: dict[str, Any]) -> dict[str, Any]:
    """A text area's line breaks as a browser sends them: CRLF (a CR stored reads back as a line break too)."""
    return {
        name: [v.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n") for v in values]
        for name, values in data.items()
    }


def test_texts_of_several_lines_and_spaces_survive_a_page_sent_back_unchanged(
    admin_client: Client, eval_set: EvalSet
) -> None:
    """A case's query and note and a set's description are kept as typed: surrounding spaces were stripped and a
    browser's CRLF stored, each recorded as a change (``config.eval_case.update``, ``config.eval_set.update``)."""
    EvalSet.objects.filter(pk=eval_set.pk).update(description=" 설명 첫 줄\n둘째 줄\n")
    case(eval_set, query="첫 줄\n둘째 줄", note="노트\n")
    case(eval_set, key="q2", query=" 앞뒤 공백 ", note="윈도우에서\r\n가져온 노트")  # CRLF stored by an import
    stored = {c.key: (c.query, c.note) for c in EvalCase.objects.all()}
    before = AuditEvent.objects.count()
    page = page_of(admin_client, eval_set)

    response = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", as_a_browser_sends(sent_back(page)))

    assert response.status_code == 302, response.content.decode()[-3000:]
    assert AuditEvent.objects.count() == before  # nothing changed, nothing recorded
    assert {c.key: (c.query, c.note) for c in EvalCase.objects.all()} == stored
    assert EvalSet.objects.get(pk=eval_set.pk).description == " 설명 첫 줄\n둘째 줄\n"
    # What is typed anew is stored with the line breaks every other path stores: LF.
    typed = as_a_browser_sends(sent_back(page, **{"cases-0-query": "새 질문\n둘째 줄", "description": "새 설명\n"}))
    assert admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", typed).status_code == 302
    assert EvalCase.objects.get(key="q1").query == "새 질문\n둘째 줄"
    assert EvalSet.objects.get(pk=eval_set.pk).description == "새 설명\n"
