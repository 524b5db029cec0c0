"""Secrets stored with a key this process lacks (a restored dump, a key retired too soon): the row still loads.

Before, loading such a row raised, so one server whose env could not be decrypted took down the admin's index, the
server and tool lists, every rule and agent form that offers servers (and, on PostgreSQL, left the server-side
cursor of the select's query open to hang the connection later). Now the row loads with
``mcpregistry.crypto.UnreadableSecrets`` in place of the map: every page shows, the server's and agent's pages say
what is wrong and how to mend it, a save that does not touch the secrets keeps the stored ciphertext, a save that
replaces them needs "clear all", the audit records what could not be named as ``(unreadable)``, and every use of
the values still fails as before (a run: ``config:secret_unreadable``, a submission: 503).
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import translation

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.models import Agent, Approval, Run
from audit.models import AuditEvent
from mcpregistry.admin import unreadable_secrets_text
from mcpregistry.crypto import SecretDecryptionError, UnreadableSecrets
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_delete
from tests.agents.test_agent_settings_round_trip import page_as_posted
from tests.agents.test_poisoned_runs import approval_of, poison_agent, store_foreign
from tests.postgres import manage, migrated_postgres_url, postgres_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

SERVER_PAGE = "/admin/mcpregistry/mcpserver/{}/change/"


def raw(model: type[Any], column: str, pk: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {model._meta.db_table} WHERE {model._meta.pk.column} = %s", [pk])
        return str(cursor.fetchone()[0])


@pytest.fixture
def lost(demo_server: McpServer) -> McpServer:
    """The demo binding, its env and headers stored by another installation's key."""
    store_foreign(McpServer, "env", demo_server.pk, {"INTERNAL_API_KEY": "foreign-000000000000"})
    store_foreign(McpServer, "headers", demo_server.pk, {"X-Api-Key": "foreign-header-0000000"})
    return McpServer.objects.get(pk=demo_server.pk)


def server_posts(client: Client, server: McpServer, **changes: Any) -> Any:
    url = SERVER_PAGE.format(server.pk)
    page = client.get(url)
    assert page.status_code == 200
    return client.post(url, {**page_as_posted(page.content.decode()), **changes})


def last_event(action: str) -> AuditEvent:
    return AuditEvent.objects.filter(action=action).order_by("-id").first()


@pytest.mark.slow
def test_the_row_loads_and_every_use_of_its_values_fails_as_the_load_did(lost: McpServer) -> None:
    assert isinstance(lost.env, UnreadableSecrets) and isinstance(lost.headers, UnreadableSecrets)
    assert not lost.secrets_readable()
    for use in (lambda: lost.secret_values(), lambda: lost.connection_config(), lambda: dict(lost.env)):
        with pytest.raises(SecretDecryptionError):
            use()
    assert "foreign" not in repr(lost.env)


def test_one_binding_that_cannot_be_decrypted_leaves_every_admin_page_readable(
    admin_client: Client, demo_agent: Agent, lost: McpServer
) -> None:
    poison_agent(demo_agent)
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    approval = approval_of(run, status=Approval.Status.PENDING)
    store_foreign(Approval, "exact_args", approval.pk, {"text": "메모"})
    tool = lost.tools.first()
    rule = demo_agent.rules.first()
    admin_client.raise_request_exception = False
    pages = [
        "/admin/",
        "/admin/mcpregistry/mcpserver/",
        "/admin/mcpregistry/mcptool/",
        f"/admin/mcpregistry/mcptool/?server__id__exact={lost.pk}",
        "/admin/agents/agent/",
        "/admin/agents/agent/add/",
        "/admin/agents/deterministicrule/",
        "/admin/agents/deterministicrule/add/",
        "/admin/agents/rule-tester/?agent=company-assistant",
        "/admin/agents/approval/",
        f"/admin/agents/approval/{approval.pk}/change/",
        f"/admin/agents/run/{run.pk}/change/",
        f"/admin/agents/agent/{demo_agent.pk}/history/",
        f"/admin/mcpregistry/mcpserver/{lost.pk}/history/",
        f"/admin/mcpregistry/mcpserver/{lost.pk}/delete/",
        *([f"/admin/mcpregistry/mcptool/{tool.pk}/change/"] if tool else []),
        *([f"/admin/agents/deterministicrule/{rule.pk}/change/"] if rule else []),
    ]
    assert {page: admin_client.get(page).status_code for page in pages} == dict.fromkeys(pages, 200)
    server_page = admin_client.get(SERVER_PAGE.format(lost.pk)).content.decode()
    assert "SECRETS_ENCRYPTION_KEYS" in server_page and "foreign" not in server_page
    agent_page = admin_client.get(f"/admin/agents/agent/{demo_agent.pk}/change/").content.decode()
    assert "SECRETS_ENCRYPTION_KEYS" in agent_page and "sk-foreign" not in agent_page


def test_the_server_page_says_so_in_korean(admin_client: Client, lost: McpServer) -> None:
    page = admin_client.get(SERVER_PAGE.format(lost.pk), HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    with translation.override("ko"):
        text = unreadable_secrets_text()
    with translation.override("en"):
        assert text != unreadable_secrets_text() and re.search(r"[가-힣]", text)
    assert text.split("(")[0].strip() in page


def test_a_save_that_leaves_the_secrets_alone_keeps_the_ciphertext_as_stored(
    admin_client: Client, lost: McpServer
) -> None:
    env, headers = raw(McpServer, "env", lost.pk), raw(McpServer, "headers", lost.pk)

    response = server_posts(admin_client, lost, name="사내 데이터 (복구 중)")

    assert response.status_code == 302, response.content.decode()[:3000]
    assert (raw(McpServer, "env", lost.pk), raw(McpServer, "headers", lost.pk)) == (env, headers)
    assert McpServer.objects.get(pk=lost.pk).name == "사내 데이터 (복구 중)"
    assert last_event("config.mcp_server.update").args == {"name": [lost.name, "사내 데이터 (복구 중)"]}


@pytest.mark.parametrize(
    "changes",
    [{"new_env": "INTERNAL_API_KEY=sk-new-000000000000"}, {"new_headers": "X-Api-Key=new-000000000000"}],
    ids=["env", "headers"],
)
def test_a_new_value_beside_values_that_cannot_be_read_asks_to_clear_them(
    admin_client: Client, lost: McpServer, changes: dict[str, str]
) -> None:
    env = raw(McpServer, "env", lost.pk)

    response = server_posts(admin_client, lost, **changes)

    assert response.status_code == 200
    assert response.context["adminform"].form.errors["clear_secrets"] == [unreadable_secrets_text()]
    assert raw(McpServer, "env", lost.pk) == env


def test_clearing_replaces_what_cannot_be_read_and_the_record_says_so(admin_client: Client, lost: McpServer) -> None:
    response = server_posts(
        admin_client,
        lost,
        clear_secrets="on",
        new_env="INTERNAL_API_KEY=sk-new-000000000000",
        env_settings="FAILURE_MODE=none",
    )

    assert response.status_code == 302, response.content.decode()[:3000]
    server = McpServer.objects.get(pk=lost.pk)
    assert server.secrets_readable()
    assert (server.env, server.headers) == ({"FAILURE_MODE": "none", "INTERNAL_API_KEY": "sk-new-000000000000"}, {})
    args = last_event("config.mcp_server.update").args
    assert args["env"] == {"cleared": ["(unreadable)"], "set": ["FAILURE_MODE", "INTERNAL_API_KEY"]}
    assert args["headers"] == {"cleared": ["(unreadable)"]}
    assert "sk-new" not in json.dumps(args)


def test_a_server_that_cannot_be_decrypted_is_deleted_and_the_record_says_what_went(lost: McpServer) -> None:
    mcp_server_delete(server=lost, actor="t", via="tests")

    assert not McpServer.objects.filter(pk=lost.pk).exists()
    args = last_event("config.mcp_server.delete").args
    assert args["env"] == {"cleared": ["(unreadable)"]} and args["headers"] == {"cleared": ["(unreadable)"]}


@pytest.mark.slow
def test_an_agents_key_that_cannot_be_read_is_kept_by_other_edits_and_replaced_by_a_new_one(
    admin_client: Client, demo_agent: Agent
) -> None:
    # A provider that reads a key (the offline model refuses one typed for it).
    Agent.objects.filter(pk=demo_agent.pk).update(
        model_provider="openai_compatible",
        model_id="gpt-4o-mini",
        model_params={"base_url": "https://llm.example.com/v1"},
    )
    poison_agent(demo_agent)
    stored = raw(Agent, "model_secrets", demo_agent.pk)
    url = f"/admin/agents/agent/{demo_agent.pk}/change/"
    posted = page_as_posted(admin_client.get(url).content.decode())

    assert admin_client.post(url, {**posted, "name": "회사 도우미"}).status_code == 302
    assert raw(Agent, "model_secrets", demo_agent.pk) == stored

    posted = page_as_posted(admin_client.get(url).content.decode())
    assert admin_client.post(url, {**posted, "new_model_api_key": "sk-new-0000000000000000"}).status_code == 302
    assert Agent.objects.get(pk=demo_agent.pk).model_secrets == {"api_key": "sk-new-0000000000000000"}
    assert last_event("config.agent.update").args["model_secrets"] == {
        "cleared": ["(unreadable)"],
        "set": ["api_key"],
    }


def test_the_rule_tester_says_what_it_cannot_read(admin_client: Client, demo_agent: Agent, lost: McpServer) -> None:
    admin_client.raise_request_exception = False
    response = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "김하늘 님은 어느 팀 소속인가요?"}
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "SECRETS_ENCRYPTION_KEYS" in page and "foreign" not in page
    assert response.context["trials"] is None


def test_the_platforms_mcp_endpoint_and_run_query_name_the_problem(
    api_caller: Any, demo_agent: Agent, lost: McpServer
) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    body["params"] = {"name": "ask_company-assistant", "arguments": {"query": "김하늘 님은 어느 팀 소속인가요?"}}
    response = client.post("/mcp/", json.dumps(body), content_type="application/json", HTTP_ACCEPT="application/json")
    answer = response.json()
    assert "error" not in answer, answer  # not -32603 "Internal error."
    assert answer["result"]["isError"] is True
    assert "SECRETS_ENCRYPTION_KEYS" in answer["result"]["content"][0]["text"]
    assert not Run.objects.exists()

    with pytest.raises(CommandError) as refused:
        call_command("run_query", "company-assistant", "김하늘 님은 어느 팀 소속인가요?", stdout=io.StringIO())
    assert "SECRETS_ENCRYPTION_KEYS" in str(refused.value)


def test_feedback_on_a_finished_run_is_recorded_when_a_server_cannot_be_read(
    api_caller: Any, demo_agent: Agent, demo_server: McpServer
) -> None:
    run = Run.objects.create(agent=demo_agent, query="질문", api_key=api_caller.key, status=Run.Status.SUCCEEDED)
    store_foreign(McpServer, "env", demo_server.pk, {"INTERNAL_API_KEY": "foreign-000000000000"})
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    body = json.dumps({"score": 1, "comment": "좋아요"})
    response = client.post(f"/api/v1/runs/{run.id}/feedback", body, content_type="application/json")
    assert response.status_code in (200, 201), response.content
    assert Run.objects.get(pk=run.pk).feedback_comment == "좋아요"


def test_the_agents_card_and_the_directory_show_while_its_runs_fail(
    api_caller: Any, demo_agent: Agent, lost: McpServer
) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    card = client.get("/a2a/company-assistant/.well-known/agent-card.json")
    assert card.status_code == 200, card.content
    assert "search_employee" in {skill["name"] for skill in card.json()["skills"]}
    directory = client.get("/.well-known/agent-card.json")
    assert directory.status_code == 200, directory.content
    body = json.dumps({"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"})
    refused = client.post("/api/v1/runs", body, content_type="application/json")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "config:secret_unreadable"


def test_export_and_import_refuse_naming_the_rows_they_cannot_read(demo_agent: Agent, lost: McpServer) -> None:
    poison_agent(demo_agent)
    with translation.override("en"), pytest.raises(CommandError) as refused:
        call_command("export_config", stdout=io.StringIO())
    assert "server sds-company-data, agent company-assistant" in str(refused.value)
    assert "SECRETS_ENCRYPTION_KEYS" in str(refused.value)

    document = {"servers": [{"mcp_id": lost.mcp_id, "transport": lost.transport, "command": "x"}]}
    with translation.override("en"), pytest.raises(ApplicationError) as refused:
        config_import(document=document, actor="t", via="tests", dry_run=True)
    assert re.search(r"servers\[0\] \(sds-company-data\)[^\n]*SECRETS_ENCRYPTION_KEYS", refused.value.message)


# --- on PostgreSQL: the select's query used to fail mid-iteration, its server-side cursor left open ----------------

ON_POSTGRES = r"""
import io, json
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from mcpregistry.models import McpServer
call_command("seed_demo", "--no-discover", stdout=io.StringIO())
demo = McpServer.objects.get(mcp_id="sds-company-data")
token = "fernet:" + Fernet(Fernet.generate_key()).encrypt(json.dumps({"K": "foreign-0000000000"}).encode()).decode()
with connection.cursor() as cursor:
    cursor.execute("UPDATE mcpregistry_mcpserver SET env = %s WHERE id = %s", [token, demo.pk])
client = Client(SERVER_NAME="localhost", raise_request_exception=False)
client.force_login(get_user_model().objects.get(username="admin"))
for address in ["/admin/", "/admin/agents/deterministicrule/add/", "/admin/agents/agent/add/",
                "/admin/mcpregistry/mcptool/", f"/admin/mcpregistry/mcpserver/{demo.pk}/change/",
                "/admin/agents/deterministicrule/add/"]:
    print("RESULT", address.replace(str(demo.pk), "ID"), client.get(address).status_code)
import gc; gc.collect()
print("RESULT after", McpServer.objects.count() > 0)
"""


@pytest.mark.postgres
def test_pages_that_list_servers_answer_on_postgres(migrated_postgres_url: str) -> None:  # noqa: F811
    # A database of its own, as a fresh migrate leaves it (seed_demo needs one), in the session's cluster: a cluster
    # and a migrate of its own took most of this test's time. (The fixture fails in CI without PostgreSQL.)
    done = manage("shell", "-c", ON_POSTGRES, database_url=migrated_postgres_url, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line.removeprefix("RESULT ") for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert results == [
        "/admin/ 200",
        "/admin/agents/deterministicrule/add/ 200",
        "/admin/agents/agent/add/ 200",
        "/admin/mcpregistry/mcptool/ 200",
        "/admin/mcpregistry/mcpserver/ID/change/ 200",
        "/admin/agents/deterministicrule/add/ 200",
        "after True",
    ], done.stdout[-3000:] + done.stderr[-3000:]


def test_a_row_without_secrets_stores_none_and_never_asks_for_them_again_after_a_key_is_lost(
    demo_server: McpServer, settings: Any
) -> None:
    """An empty secret map was stored encrypted: with the key lost, the server and agents with no secret at all
    were named among those whose secrets "cannot be decrypted" (export_config refused, pages asked to enter them
    again). Nothing is stored for a map with nothing in it."""
    from cryptography.fernet import Fernet

    from agents.configuration import config_export

    plain = Agent.objects.create(slug="no-secrets", name="비밀 없음")
    assert raw(Agent, "model_secrets", plain.pk) == ""
    McpServer.objects.filter(pk=demo_server.pk).update(env={}, headers={})  # through the field: stored empty
    settings.SECRETS_ENCRYPTION_KEYS = Fernet.generate_key().decode()  # every older key lost
    Agent.objects.exclude(pk=plain.pk).delete()
    McpServer.objects.exclude(pk=demo_server.pk).delete()
    exported = config_export()  # refused before, naming both
    assert {a["slug"] for a in exported["agents"]} == {"no-secrets"}
    assert Agent.objects.get(pk=plain.pk).model_secrets == {}


def test_rotation_stores_an_empty_map_encrypted_before_as_empty(settings: Any) -> None:
    """Rows saved before an empty map was stored empty hold it encrypted: rotate_secrets stores it empty, so that
    retiring the old key leaves no row named unreadable for secrets it never had."""
    from cryptography.fernet import Fernet

    from agents.configuration import config_export
    from mcpregistry.crypto import encrypt_json

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRETS_ENCRYPTION_KEYS = old
    legacy = Agent.objects.create(slug="legacy", name="예전 행")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE agents_agent SET model_secrets = %s WHERE id = %s", [encrypt_json({}), legacy.pk])
    settings.SECRETS_ENCRYPTION_KEYS = f"{new},{old}"
    call_command("rotate_secrets", stdout=io.StringIO())
    settings.SECRETS_ENCRYPTION_KEYS = new  # the old key retired

    assert raw(Agent, "model_secrets", legacy.pk) == ""
    assert {a["slug"] for a in config_export()["agents"]} >= {"legacy"}
