"""The secrets' keys: the local key file once ``SECRETS_ENCRYPTION_KEYS`` is set, a local key file that holds no
key, a rotation with nothing to do, and the rows named where their secrets cannot be decrypted.

1. Following ``audit.W003`` (set the variable) locked the installation out of every secret stored with the local
   key: the file is now kept as a last key that only decrypts, until ``rotate_secrets`` moves the rows.
2. An emptied ``var/secrets_key`` made every admin page a 500 while ``check`` and ``/readyz`` said nothing, and the
   error named the variable (not set): now ``audit.E003`` and ``/readyz`` name the file, and rows load unreadable.
3. ``rotate_secrets`` rewrote and audited every row on every run.
4. The log line of a refused submission and the rotation's report named no row, or rows by id only.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from agents.configuration import config_export
from agents.models import Agent
from audit.checks import check_secrets_encryption_keys
from audit.models import AuditEvent
from mcpregistry.crypto import SecretDecryptionError
from mcpregistry.models import McpServer
from tests.agents.test_poisoned_runs import store_foreign

pytestmark = pytest.mark.django_db

QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def raw(model: type[Any], column: str, pk: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {model._meta.db_table} WHERE {model._meta.pk.column} = %s", [pk])
        return str(cursor.fetchone()[0])


def make_rows(mcp_id: str = "billing", slug: str = "billing-agent") -> tuple[McpServer, Agent]:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name="청구 서버",
        transport="sse",
        url="https://x.example/sse",
        env={"DB_PASSWORD": "비밀값-7f3a9c0000"},
        headers={"Authorization": "Bearer hdr-91bd2e000000"},
    )
    agent = Agent.objects.create(slug=slug, name="청구", model_secrets={"api_key": "sk-model-4a8b2c9d0e1f"})
    return server, agent


# ---- 1. the local key decrypts until rotate_secrets ------------------------------------------------------------


def test_setting_the_variable_as_w003_says_keeps_the_secrets_and_rotate_secrets_moves_them(
    settings: Any, tmp_path: Path
) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = ""
    settings.VAR_DIR = tmp_path  # a fresh installation: its key made into var/secrets_key
    server, agent = make_rows()
    assert (tmp_path / "secrets_key").exists()
    (warning,) = check_secrets_encryption_keys()

    new = Fernet.generate_key().decode()
    settings.SECRETS_ENCRYPTION_KEYS = new  # as the hint says
    assert McpServer.objects.get(pk=server.pk).env == {"DB_PASSWORD": "비밀값-7f3a9c0000"}
    assert Agent.objects.get(pk=agent.pk).model_secrets == {"api_key": "sk-model-4a8b2c9d0e1f"}
    assert {a["slug"] for a in config_export()["agents"]} >= {"billing-agent"}  # refused before: no key decrypted
    later = Agent.objects.create(slug="later", name="later", model_secrets={"api_key": "sk-later-0000000000"})
    assert Fernet(new.encode()).decrypt(raw(Agent, "model_secrets", later.pk).removeprefix("fernet:").encode())

    out = io.StringIO()
    call_command("rotate_secrets", stdout=out)  # no row left behind: CommandError otherwise
    assert "re-encrypted 2 row(s) with the newest key" in out.getvalue()

    (tmp_path / "secrets_key").unlink()  # the local key retired: the variable's key reads everything
    assert McpServer.objects.get(pk=server.pk).headers == {"Authorization": "Bearer hdr-91bd2e000000"}
    assert Agent.objects.get(pk=agent.pk).model_secrets == {"api_key": "sk-model-4a8b2c9d0e1f"}
    assert Fernet(new.encode()).decrypt(raw(McpServer, "env", server.pk).removeprefix("fernet:").encode())
    assert warning.id == "audit.W003" and "rotate_secrets" in (warning.hint or "")  # what to run after setting it


# ---- 2. a local key file that holds no key ---------------------------------------------------------------------


def test_an_emptied_local_key_file_is_named_and_the_pages_show_the_secrets_unreadable(
    admin_client: Client, client: Client, settings: Any, tmp_path: Path, demo_server: McpServer
) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = ""
    settings.VAR_DIR = tmp_path
    key_file = tmp_path / "secrets_key"
    key_file.write_text("")

    admin_client.raise_request_exception = False
    for page in ("/admin/mcpregistry/mcpserver/", f"/admin/mcpregistry/mcpserver/{demo_server.pk}/change/"):
        assert admin_client.get(page).status_code == 200, page
    server = McpServer.objects.get(pk=demo_server.pk)
    assert not server.secrets_readable()
    with pytest.raises(SecretDecryptionError, match=re.escape(str(key_file))):
        server.connection_config()
    errors = [m for m in run_checks() if m.id == "audit.E003"]
    assert len(errors) == 1 and str(key_file) in errors[0].msg and "SECRETS_ENCRYPTION_KEYS:" not in errors[0].msg
    keys = client.get("/readyz").json()["checks"]["keys"]
    # Named by its name only: anyone reaching the port reads /readyz, and this machine's paths are none of theirs.
    assert keys["ok"] is False and "secrets_key in PLATFORM_VAR_DIR" in keys["error"]
    assert str(tmp_path) not in keys["error"]

    key_file.write_text("not a key")  # with the variable set, a damaged local file is no reason to fail
    settings.SECRETS_ENCRYPTION_KEYS = Fernet.generate_key().decode()
    assert not [m for m in run_checks() if m.id == "audit.E003"]
    server, _agent = make_rows()
    assert McpServer.objects.get(pk=server.pk).env == {"DB_PASSWORD": "비밀값-7f3a9c0000"}


def test_a_servers_page_blames_the_emptied_local_key_file_not_the_variable_nobody_set(
    admin_client: Client, settings: Any, tmp_path: Path
) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = ""
    settings.VAR_DIR = tmp_path / "before"
    server, _agent = make_rows()  # encrypted with the local key made in before/
    settings.VAR_DIR = tmp_path / "after"  # the file emptied, as a restarted process reads it
    key_file = tmp_path / "after" / "secrets_key"
    key_file.parent.mkdir()
    key_file.write_text("")

    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert "holds no Fernet key" in page and str(key_file) in page
    assert "SECRETS_ENCRYPTION_KEYS lacks" not in page

    settings.SECRETS_ENCRYPTION_KEYS = Fernet.generate_key().decode()  # a key set that never encrypted the rows
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert "SECRETS_ENCRYPTION_KEYS lacks" in page and "holds no Fernet key" not in page


# ---- 3. a rotation with nothing to do --------------------------------------------------------------------------


def test_a_second_rotation_rewrites_and_records_nothing(settings: Any) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRETS_ENCRYPTION_KEYS = old
    server, agent = make_rows()
    settings.SECRETS_ENCRYPTION_KEYS = f"{new},{old}"
    first = io.StringIO()
    call_command("rotate_secrets", stdout=first)
    assert "re-encrypted 2 row(s) with the newest key" in first.getvalue()
    stored = [raw(McpServer, "env", server.pk), raw(McpServer, "headers", server.pk)]
    stored.append(raw(Agent, "model_secrets", agent.pk))
    events = AuditEvent.objects.count()

    second = io.StringIO()
    call_command("rotate_secrets", stdout=second)
    assert "nothing to re-encrypt" in second.getvalue() and "re-encrypted 2" not in second.getvalue()
    assert [raw(McpServer, "env", server.pk), raw(McpServer, "headers", server.pk)] == stored[:2]
    assert raw(Agent, "model_secrets", agent.pk) == stored[2]
    assert AuditEvent.objects.count() == events


# ---- 4. the rows named ------------------------------------------------------------------------------------------


def test_the_rotation_names_the_rows_no_key_decrypts_by_their_natural_key(settings: Any) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = Fernet.generate_key().decode()
    server, agent = make_rows(mcp_id="lost-billing", slug="lost-agent")
    store_foreign(McpServer, "env", server.pk, {"DB_PASSWORD": "foreign-000000000000"})
    store_foreign(Agent, "model_secrets", agent.pk, {"api_key": "sk-foreign-000000000000"})
    with pytest.raises(CommandError) as refused:
        call_command("rotate_secrets", stdout=io.StringIO())
    assert f"mcpregistry.mcpserver: {server.pk} (lost-billing)" in str(refused.value)
    assert f"agents.agent: {agent.pk} (lost-agent)" in str(refused.value)


def test_a_refused_submission_logs_the_rows_whose_secrets_cannot_be_decrypted(
    caplog: pytest.LogCaptureFixture, api_caller: Any, demo_agent: Agent, demo_server: McpServer
) -> None:
    store_foreign(McpServer, "env", demo_server.pk, {"INTERNAL_API_KEY": "foreign-000000000000"})
    with caplog.at_level(logging.ERROR, logger="agents.services"), pytest.raises(CommandError):
        call_command("run_query", demo_agent.slug, QUESTION, stdout=io.StringIO())
    (line,) = [r.getMessage() for r in caplog.records if "a run submission was refused" in r.getMessage()]
    assert f"server {demo_server.mcp_id}" in line and "foreign" not in line

    caplog.clear()
    api = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    with caplog.at_level(logging.ERROR, logger="agents.services"):
        body = json.dumps({"agent": demo_agent.slug, "query": QUESTION})
        refused = api.post("/api/v1/runs", body, content_type="application/json")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "config:secret_unreadable"
    assert demo_server.mcp_id not in refused.content.decode()  # the caller's answer stays as it was
    (line,) = [r.getMessage() for r in caplog.records if "a run submission was refused" in r.getMessage()]
    assert f"server {demo_server.mcp_id}" in line
