"""A NUL character, which no PostgreSQL text or JSON stores, is refused where it comes in, never a 500.

- The admin's list and line fields (a category's keywords, a tool's tags, a server's arguments, a rule's keywords
  and parameters) refuse it at the field, as every plain text field does (Django's "Null characters are not
  allowed."), and refuse the other control characters but tab and line breaks (``mcpregistry/list_fields.py``,
  ``agents/rule_form.py``). SQLite stored them; PostgreSQL's jsonb raised ``DataError``.
- A page's path or query holding one is a 400 page in the reader's language (``agent_platform/query_guard.py``):
  an admin list filtered by it was a 500 on PostgreSQL. The API keeps its JSON ``bad_request``.
- The 400 and 500 pages are the platform's own, in the reader's language, with no details.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
from django.core.validators import ProhibitNullCharactersValidator
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from django.utils import timezone, translation
from django.utils.translation import gettext

from agent_platform import urls as platform_urls
from agents.models import Agent, DeterministicRule
from agents.rule_form import WHEN_LABELS
from mcpregistry.models import McpServer, McpTool, RequestCategory
from mcpregistry.services import request_category_create
from tests.agents.test_rule_form_roundtrip import agent, as_browser_posts, change_url, stored_rule  # noqa: F401
from tests.mcpregistry.test_registry import post_server_form
from tests.postgres import PostgresMissing, manage, private_postgres

# Django's own words for every text field, in Korean ("null 문자는 사용할 수 없습니다. ", a space at its end).
with translation.override("ko"):
    NUL_REFUSED_KO = str(ProhibitNullCharactersValidator.message)


def refusals(response: Any) -> str:
    """The form's errors, each field's joined."""
    errors = response.context["adminform"].form.errors
    return " ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())


# --- 1. list and line fields -----------------------------------------------------------------------------------


@pytest.fixture
def category(db: Any) -> RequestCategory:
    return request_category_create(
        actor="tests", via="tests", data={"department": "IT지원팀", "keywords": ["프린터"], "order": 100}
    )


@pytest.fixture
def tool(db: Any) -> McpTool:
    server = McpServer.objects.create(mcp_id="assets", name="자산", command=sys.executable, args=[])
    return McpTool.objects.create(
        server=server, name="get_asset", input_schema={"type": "object"}, discovered_at=timezone.now()
    )


def post_category(client: Client, category: RequestCategory, keywords: str) -> Any:
    data = {"department": category.department, "keywords": keywords, "order": "100", "enabled": "on"}
    url = f"/admin/mcpregistry/requestcategory/{category.pk}/change/"
    return client.post(url, data, HTTP_ACCEPT_LANGUAGE="ko")


def post_tool(client: Client, tool: McpTool, **fields: str) -> Any:
    data = {
        "enabled": "on",
        "tags": "",
        "example_queries": "",
        "contract-TOTAL_FORMS": "0",
        "contract-INITIAL_FORMS": "0",
    }
    data.update(fields)
    return client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="ko")


@pytest.mark.parametrize("keywords", ["한글\x00", "프린터, 한\x00글", '["한글\\u0000"]'])
def test_a_keyword_with_a_nul_is_refused_at_its_field(
    admin_client: Client, category: RequestCategory, keywords: str
) -> None:
    response = post_category(admin_client, category, keywords)
    assert response.status_code == 200
    assert refusals(response) == f"keywords: {NUL_REFUSED_KO}"
    category.refresh_from_db()
    assert category.keywords == ["프린터"]


def test_a_tag_with_a_nul_or_another_control_character_is_refused(admin_client: Client, tool: McpTool) -> None:
    nul = post_tool(admin_client, tool, tags="자산, 한글\x00")
    assert nul.status_code == 200 and refusals(nul) == f"tags: {NUL_REFUSED_KO}"
    bell = post_tool(admin_client, tool, tags="자산, 벨\x07")
    assert bell.status_code == 200 and list(bell.context["adminform"].form.errors) == ["tags"]
    tool.refresh_from_db()
    assert tool.tags == []


def test_a_line_field_keeps_tab_and_line_breaks_and_refuses_other_control_characters(
    admin_client: Client, tool: McpTool
) -> None:
    accepted = post_tool(admin_client, tool, example_queries='["탭\\t있음", "두\\n줄", "a\\rb"]')
    assert accepted.status_code == 302, refusals(accepted)
    tool.refresh_from_db()
    assert tool.example_queries == ["탭\t있음", "두\n줄", "a\rb"]
    escape = post_tool(admin_client, tool, example_queries="질문\x1b[31m")
    assert escape.status_code == 200 and list(escape.context["adminform"].form.errors) == ["example_queries"]


def test_a_server_argument_with_a_nul_is_refused(admin_client: Client) -> None:
    response = post_server_form(admin_client, None, mcp_id="nul-args", args="-m\nx\x00")
    assert response.status_code == 200
    assert "args" in response.context["adminform"].form.errors
    assert not McpServer.objects.filter(mcp_id="nul-args").exists()


def rule_post(client: Client, rule: DeterministicRule, **changes: str) -> Any:
    posted = as_browser_posts(client.get(change_url(rule)).content.decode())
    posted.update({name: [value] for name, value in changes.items()})
    return client.post(change_url(rule), posted, HTTP_ACCEPT_LANGUAGE="ko")


@pytest.mark.parametrize(
    ("field", "typed", "refused"),
    [
        ("when__any_keywords", "팀\x00", "when"),
        ("when__all_keywords", '["팀\\u0000"]', "when"),
        ("when__context", "tier=a\x00", "when"),
        ("when__regex", "팀\x00장", "when"),
        ("params__value__q", "김\x00", "params"),
        ("params__value__floors", "3F, 4\x00F", "params"),
    ],
)
def test_a_rule_part_with_a_nul_is_refused_naming_it(
    admin_client: Client,
    agent: Agent,  # noqa: F811
    field: str,
    typed: str,
    refused: str,
) -> None:
    rule = stored_rule(agent, when={"any_keywords": ["방"]}, params={"q": "x"})
    response = rule_post(admin_client, rule, **{field: typed})
    assert response.status_code == 200
    part = field.split("__")[-1]
    if refused == "when":  # a condition named by its label on the page (in Korean here), not its JSON key
        with translation.override("ko"):
            part = str(WHEN_LABELS[part])
    assert refusals(response) == f"{refused}: {part}: {NUL_REFUSED_KO}"
    rule.refresh_from_db()
    assert (rule.when, rule.params) == ({"any_keywords": ["방"]}, {"q": "x"})


def test_a_rule_keyword_with_another_control_character_is_refused_but_a_stored_one_saves_as_it_is(
    admin_client: Client,
    agent: Agent,  # noqa: F811
) -> None:
    rule = stored_rule(agent, when={"any_keywords": ["방"]}, params={"q": "x"})
    response = rule_post(admin_client, rule, when__any_keywords="방\x07")
    assert response.status_code == 200 and list(response.context["adminform"].form.errors) == ["when"]

    imported = stored_rule(agent, when={"any_keywords": ["벨\x07"]}, params={"q": "종\x1b"})
    unchanged = rule_post(admin_client, imported)
    assert unchanged.status_code == 302, refusals(unchanged)
    imported.refresh_from_db()
    assert (imported.when, imported.params) == ({"any_keywords": ["벨\x07"]}, {"q": "종\x1b"})


def test_the_rules_json_with_a_nul_is_refused_as_import_config_refuses_it(
    admin_client: Client,
    agent: Agent,  # noqa: F811
) -> None:
    rule = stored_rule(agent, when={"any_keywords": ["방"]}, params={"q": "x"})
    document = {"agent": "desk", "name": "방 찾기", "mcp_id": "rooms", "tool": "rooms", "when": {}, "params": {}}
    document["when"] = {"any_keywords": ["방\x00"]}
    response = rule_post(admin_client, rule, rule_json=json.dumps(document))
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["rule_json"]
    assert "when.any_keywords[0]" in refusals(response)
    rule.refresh_from_db()
    assert rule.when == {"any_keywords": ["방"]}


# --- 2. a NUL in a page's address ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "/admin/audit/auditevent/?mcp_id=a%00b",
        "/admin/audit/auditevent/?actor=%00",
        "/admin/agents/approval/?tool__exact=a%00",
        "/admin/agents/rule-tester/?agent=a%00b",
        "/admin/agents/agentarm/metrics/?agent=%00",
        "/admin/audit/auditevent/?a%00b=1",  # a parameter's name
        "/admin/mcpregistry/mcpserver/a%00b/change/",  # the path
    ],
)
def test_a_nul_in_a_pages_query_is_a_400_page_in_the_readers_language(admin_client: Client, address: str) -> None:
    response = admin_client.get(address, HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 400
    page = response.content.decode()
    assert '<html lang="ko"' in page
    assert "경로와 쿼리에 NUL 문자를 넣을 수 없습니다." in page
    assert response["Content-Type"].startswith("text/html")


def test_a_query_without_a_nul_goes_on(admin_client: Client) -> None:
    assert admin_client.get("/admin/audit/auditevent/?mcp_id=ab").status_code == 200


def test_the_api_keeps_its_own_json_answer_to_a_nul(api_client: Any) -> None:
    response = api_client.get("/api/v1/runs?agent=a%00b", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 400
    assert response.json() == {
        "error": {"code": "bad_request", "message": "경로와 쿼리에 NUL 문자를 넣을 수 없습니다."}
    }


# --- 3. the 400 and 500 pages ---------------------------------------------------------------------------------


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a secret detail 7f3a")


# A URLconf for the test below: the platform's, with a view that raises, and its own error handlers.
urlpatterns = [path("boom/", boom), *platform_urls.urlpatterns]
handler400 = platform_urls.handler400
handler404 = platform_urls.handler404
handler500 = platform_urls.handler500


@override_settings(ROOT_URLCONF="tests.test_nul_input", DEBUG=False)
def test_the_500_page_is_in_the_readers_language_without_details(db: Any) -> None:
    client = Client(raise_request_exception=False, HTTP_ACCEPT_LANGUAGE="ko")
    response = client.get("/boom/")
    assert response.status_code == 500
    page = response.content.decode()
    assert '<html lang="ko"' in page
    assert "<h1>서버 오류 (500)</h1>" in page
    with translation.override("ko"):
        assert (
            gettext(
                "Something went wrong on the server. The error has been logged; try again later, or tell an administrator "
                "if it goes on."
            )
            in page
        )
    assert "7f3a" not in page and "RuntimeError" not in page and "Traceback" not in page


@override_settings(DEBUG=False)
def test_the_400_page_django_answers_a_bad_host_with_is_in_the_readers_language(db: Any) -> None:
    client = Client(HTTP_ACCEPT_LANGUAGE="ko", HTTP_HOST="not-allowed.example")
    response = client.get("/admin/login/")
    assert response.status_code == 400
    page = response.content.decode()
    assert '<html lang="ko"' in page
    with translation.override("ko"):
        assert f"<h1>{gettext('Bad request (400)')}</h1>" in page
        assert gettext("The server could not accept this request. Check the address and try again.") in page
    assert "not-allowed.example" not in page


# --- on PostgreSQL, where these were 500s ------------------------------------------------------------------------

ON_POSTGRES = r"""
import io
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from agents.models import DeterministicRule
from mcpregistry.models import McpTool
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_tool_create, request_category_create
from tests.agents.test_rule_form_roundtrip import as_browser_posts
from tests.mcpregistry.test_registry import post_server_form
from tests.test_nul_input import post_category, post_tool
# This script's own rows, nothing started (no discovery).
call_command("seed_demo", "--no-discover", stdout=io.StringIO())
demo = McpServer.objects.get(mcp_id="sds-company-data")
tool = McpTool.objects.filter(server=demo, name="nul_probe").first() or mcp_tool_create(
    server=demo, name="nul_probe", actor="t", via="tests")
client = Client(SERVER_NAME="localhost", HTTP_ACCEPT_LANGUAGE="ko", raise_request_exception=False)
client.force_login(get_user_model().objects.get(username="admin"))
category = request_category_create(actor="t", via="tests", data={"department": "NUL팀", "keywords": ["프린터"]})
print("RESULT keywords", post_category(client, category, "한글\x00").status_code)
print("RESULT tags", post_tool(client, tool, tags="한글\x00").status_code)
print("RESULT args", post_server_form(client, None, mcp_id="nul-args", args="-m\nx\x00").status_code)
rule = DeterministicRule.objects.filter(agent__slug="company-assistant", server=demo).order_by("pk").first()
url = f"/admin/agents/deterministicrule/{rule.pk}/change/"
for field in ("when__any_keywords", "params__value__" + next(iter(rule.params), "q")):
    posted = {**as_browser_posts(client.get(url).content.decode()), field: ["팀\x00"]}
    print("RESULT", field.split("__")[0], client.post(url, posted).status_code)
for address in ["/admin/audit/auditevent/?mcp_id=a%00b", "/admin/audit/auditevent/?source=%00",
                "/admin/agents/approval/?mcp_id=%00", "/admin/agents/rule-tester/?agent=a%00b",
                "/admin/agents/agentarm/metrics/?agent=%00"]:
    print("RESULT", address, client.get(address).status_code)
"""


@pytest.mark.postgres
def test_a_nul_is_refused_not_a_500_on_postgres() -> None:
    # A cluster of its own: the shared one holds servers whose secrets another module rotated to keys this process
    # lacks (those pages answer too: tests/mcpregistry/test_unreadable_secrets.py), and this script seeds its own.
    try:
        with private_postgres() as database_url:
            migrated = manage("migrate", "--noinput", database_url=database_url)
            assert migrated.returncode == 0, migrated.stderr
            done = manage("shell", "-c", ON_POSTGRES, database_url=database_url, timeout=600)
    except PostgresMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is needed in CI (.ci/run installs it): {exc}")
        pytest.skip(str(exc))
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line.removeprefix("RESULT ") for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert results == [
        "keywords 200",
        "tags 200",
        "args 200",
        "when 200",
        "params 200",
        "/admin/audit/auditevent/?mcp_id=a%00b 400",
        "/admin/audit/auditevent/?source=%00 400",
        "/admin/agents/approval/?mcp_id=%00 400",
        "/admin/agents/rule-tester/?agent=a%00b 400",
        "/admin/agents/agentarm/metrics/?agent=%00 400",
    ], done.stdout[-3000:] + done.stderr[-3000:]
