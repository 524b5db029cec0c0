"""Every change to the configuration is recorded, whoever makes it and by whichever path: one audit event per
change (``config.<entity>.<verb>``) naming the actor and the path, with a masked diff, in the change's own
transaction. The admin pages' own field-level records are in ``test_admin_changes.py``; here each (model ×
path) pair is one case, and the guard that makes a forgotten path fail is tested directly."""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from agents.models import Agent, ApiKey, DeterministicRule
from audit.change_guard import ChangeAudit, NotConfiguration, UnauditedChangeError, change_scope, policy_of
from audit.models import AuditEvent
from audit.roles import AUDITOR_GROUP
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from tests.audit.test_admin_changes import contract_form
from tests.conftest import DEMO_SECRET
from tests.mcpregistry.test_registry import post_server_form

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

LOOKUP_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
TOKEN = "tok-7f3a9c2e51b84d06"


@dataclass
class World:
    server: McpServer
    tool: McpTool
    agent: Agent
    rule: DeterministicRule
    key: ApiKey
    user: Any
    admin_client: Any
    tmp_path: Path


@dataclass
class Case:
    """A change made on one path, and the events it must leave: (action, actor, via, expected args subset)."""

    id: str
    change: Callable[[World], Any]
    expected: list[tuple[str, str, str, dict[str, Any]]]
    extra_check: Callable[[World, list[AuditEvent]], None] | None = field(default=None)


@pytest.fixture
def world(admin_client, tmp_path) -> World:  # type: ignore[no-untyped-def]
    """Configuration made by test code (no events), then changed by the case's path."""
    server = McpServer.objects.create(mcp_id="vault", name="금고", command=sys.executable, env={"TOKEN": TOKEN})
    tool = McpTool.objects.create(
        server=server, name="lookup", input_schema=LOOKUP_SCHEMA, discovered_at=timezone.now()
    )
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}}, risk="write")
    agent = Agent.objects.create(slug="ledger", name="장부")
    agent.servers.set([server])
    rule = DeterministicRule.objects.create(
        agent=agent, name="장부 규칙", server=server, tool_name="lookup", params={"name": "{query}"}
    )
    key = ApiKey.objects.create(name="caller", prefix="apk_abcdefgh", digest="d" * 64)
    user = get_user_model().objects.create_user("dana", "", "pw-Long-enough-1", is_staff=True)
    return World(server, tool, agent, rule, key, user, admin_client, tmp_path)


def import_document(world: World, document: dict[str, Any], *extra: str) -> None:
    path = world.tmp_path / "config.json"
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    call_command("import_config", str(path), *extra, stdout=io.StringIO())


IMPORTED = {
    "servers": [
        {
            "mcp_id": "docs",
            "name": "문서",
            "transport": "streamable_http",
            "url": "http://127.0.0.1:9/mcp",
            "headers": {"Authorization": {"value": "Bearer " + TOKEN}},
        }
    ],
    "contracts": [
        {"mcp_id": "vault", "tool": "lookup", "risk": "read", "args": {"name": {"type": "str", "required": True}}}
    ],
    "agents": [{"slug": "clock", "name": "시계", "servers": ["vault"]}],
    "rules": [{"agent": "clock", "name": "조회", "mcp_id": "vault", "tool": "lookup", "params": {"name": "{query}"}}],
}


def admin_post(world: World, url: str, data: dict[str, Any]) -> None:
    response = world.admin_client.post(url, data)
    errors = re.findall(r'<ul class="errorlist[^>]*>.*?</ul>', response.content.decode(), re.S)
    assert response.status_code == 302, errors or response.content.decode()[:3000]


def agent_form(world: World, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "slug": "ledger",
        "name": "장부",
        "enabled": "on",
        "mode": "react",
        "system_prompt": "",
        "deterministic_instruction": "x",
        "answer_template": "",
        "model_provider": "offline",
        "model_id": "",
        "model_params": "{}",
        "servers": [world.server.pk],
        "max_iterations": "6",
        "rules-TOTAL_FORMS": "1",
        "rules-INITIAL_FORMS": "1",
        "rules-MIN_NUM_FORMS": "0",
        "rules-MAX_NUM_FORMS": "1000",
        "rules-0-id": str(world.rule.pk),
        "rules-0-agent": str(world.agent.pk),
        "rules-0-order": "100",
        "rules-0-name": "장부 규칙",
        "rules-0-enabled": "on",
        "rules-0-server": str(world.server.pk),
        "rules-0-tool_name": "lookup",
        "rules-0-when": "{}",
        "rules-0-params": json.dumps({"name": "{query}"}),
    }
    data.update(changes)
    return data


def user_form(user: Any, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "date_joined_0": timezone.now().strftime("%Y-%m-%d"),
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": timezone.now().strftime("%Y-%m-%d"),
        "initial-date_joined_1": "00:00:00",
        "groups": [],
        "user_permissions": [],
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


CASES = [
    # ---- the admin's pages ---------------------------------------------------------------------------------
    Case(
        "admin-server-create",
        lambda w: _admin_server_create(w),
        [("config.mcp_server.create", "admin", "admin", {"mcp_id": [None, "new"], "env": {"set": ["TOKEN"]}})],
    ),
    Case(
        "admin-server-secret-change",
        lambda w: _post_server(w, w.server, new_env="TOKEN=other-value-123"),
        [("config.mcp_server.update", "admin", "admin", {"env": {"changed": ["TOKEN"]}})],
    ),
    Case(
        "admin-tool-disable",
        lambda w: admin_post(w, f"/admin/mcpregistry/mcptool/{w.tool.pk}/change/", contract_form(w.tool, enabled=None)),
        [("config.mcp_tool.update", "admin", "admin", {"enabled": [True, False]})],
    ),
    Case(
        "admin-contract-risk",
        lambda w: admin_post(
            w, f"/admin/mcpregistry/mcptool/{w.tool.pk}/change/", contract_form(w.tool, **{"contract-0-risk": "read"})
        ),
        [("config.tool_contract.update", "admin", "admin", {"risk": ["write", "read"]})],
    ),
    Case(
        "admin-agent-and-rule-update",
        lambda w: admin_post(
            w, f"/admin/agents/agent/{w.agent.pk}/change/", agent_form(w, max_iterations="9", **{"rules-0-order": "7"})
        ),
        [
            ("config.agent.update", "admin", "admin", {"max_iterations": [6, 9]}),
            ("config.deterministic_rule.update", "admin", "admin", {"order": [100, 7]}),
        ],
    ),
    Case(
        "admin-rule-delete",
        lambda w: admin_post(w, f"/admin/agents/deterministicrule/{w.rule.pk}/delete/", {"post": "yes"}),
        [("config.deterministic_rule.delete", "admin", "admin", {"name": ["장부 규칙", None]})],
    ),
    Case(
        "admin-agent-delete",
        lambda w: admin_post(w, f"/admin/agents/agent/{w.agent.pk}/delete/", {"post": "yes"}),
        [("config.agent.delete", "admin", "admin", {"slug": ["ledger", None]})],
    ),
    Case(
        "admin-key-revoke-action",
        lambda w: admin_post(w, "/admin/agents/apikey/", {"action": "revoke", "_selected_action": [w.key.pk]}),
        [("config.api_key.revoke", "admin", "admin", {})],
    ),
    Case(
        "admin-user-made-auditor",
        lambda w: _admin_user(w, groups=[Group.objects.get(name=AUDITOR_GROUP).pk]),
        [("config.user.update", "admin", "admin", {"groups": [[], [AUDITOR_GROUP]]})],
    ),
    Case(
        "admin-user-made-superuser",
        lambda w: _admin_user(w, is_superuser="on"),
        [("config.user.update", "admin", "admin", {"is_superuser": [False, True]})],
    ),
    Case(
        "admin-review-approve-action",
        lambda w: _review_then_approve(w),
        [("config.mcp_tool.review_approve", "admin", "admin", {"review_required": [True, False]})],
    ),
    # ---- commands --------------------------------------------------------------------------------------------
    Case(
        "import_config",
        lambda w: import_document(w, IMPORTED),
        [
            (
                "config.mcp_server.create",
                "system:import_config",
                "import_config",
                {"mcp_id": [None, "docs"], "headers": {"set": ["Authorization"]}},
            ),
            ("config.tool_contract.update", "system:import_config", "import_config", {"risk": ["write", "read"]}),
            ("config.agent.create", "system:import_config", "import_config", {"servers": [None, ["vault"]]}),
            ("config.deterministic_rule.create", "system:import_config", "import_config", {"name": [None, "조회"]}),
        ],
    ),
    Case("import_config-dry-run", lambda w: import_document(w, IMPORTED, "--dry-run"), []),
    Case(
        "seed_demo",
        lambda w: call_command("seed_demo", "--no-discover", "--admin-username", "demo-admin", stdout=io.StringIO()),
        [
            ("config.mcp_server.create", "system:seed_demo", "seed_demo", {"mcp_id": [None, "sds-company-data"]}),
            # The shipped local tools and classify_request's table (listed even with --no-discover: no process).
            ("config.mcp_server.create", "system:seed_demo", "seed_demo", {"mcp_id": [None, "local"]}),
            *[("config.request_category.create", "system:seed_demo", "seed_demo", {})] * 4,
            ("config.agent.create", "system:seed_demo", "seed_demo", {"slug": [None, "company-assistant"]}),
            *[("config.deterministic_rule.create", "system:seed_demo", "seed_demo", {})] * 7,
            ("config.user.create", "system:seed_demo", "seed_demo", {"is_superuser": [None, True]}),
            *[
                event
                for tool in ("calculate", "classify_request")
                for event in (
                    ("config.mcp_tool.create", "system:seed_demo", "seed_demo", {"name": [None, tool]}),
                    ("config.tool_contract.create", "system:seed_demo", "seed_demo", {"risk": [None, "write"]}),
                )
            ],
            *[("config.tool_contract.update", "system:seed_demo", "seed_demo", {"risk": ["write", "read"]})] * 2,
        ],
    ),
    Case(
        "rotate_secrets",
        lambda w: rotate_to_a_new_key(),
        [
            (
                "config.mcp_server.rotate_secrets",
                "system:rotate_secrets",
                "rotate_secrets",
                {"env": {"re-encrypted": ["TOKEN"]}},
            )
        ],
    ),
    Case(
        "create_api_key",
        lambda w: call_command("create_api_key", "ci", "--agents", "ledger", stdout=io.StringIO()),
        [
            (
                "config.api_key.create",
                "system:create_api_key",
                "create_api_key",
                {"name": [None, "ci"], "agents": [None, ["ledger"]]},
            )
        ],
    ),
    Case(
        "revoke_api_key",
        lambda w: call_command("revoke_api_key", "apk_abcdefgh", stdout=io.StringIO()),
        [("config.api_key.revoke", "system:revoke_api_key", "revoke_api_key", {})],
    ),
    Case(
        "create_auditor",
        lambda w: call_command("create_auditor", "erin", stdout=io.StringIO(), stderr=io.StringIO()),
        [("config.user.create", "system:create_auditor", "create_auditor", {"groups": [None, [AUDITOR_GROUP]]})],
    ),
    Case(
        "createsuperuser-not-ours",
        lambda w: call_command(
            "createsuperuser", "--noinput", "--username", "root2", "--email", "r@example.com", stdout=io.StringIO()
        ),
        [("config.user.create", "system:unattributed", "django", {"is_superuser": [None, True]})],
    ),
]


def _post_server(world: World, server: McpServer | None, **changes: Any) -> None:
    response = post_server_form(world.admin_client, server, **changes)
    assert response.status_code == 302, response.content.decode()[:3000]


def _admin_server_create(world: World) -> None:
    _post_server(world, None, mcp_id="new", new_env=f"TOKEN={TOKEN}")


def _admin_user(world: World, **changes: Any) -> None:
    admin_post(world, f"/admin/auth/user/{world.user.pk}/change/", user_form(world.user, is_staff="on", **changes))


def _review_then_approve(world: World) -> None:
    McpTool.objects.filter(pk=world.tool.pk).update(enabled=False, review_required=True, previous_description="old")
    admin_post(
        world,
        "/admin/mcpregistry/mcptool/",
        {"action": "approve_reviewed_changes", "_selected_action": [world.tool.pk]},
    )


def rotate_to_a_new_key() -> None:
    """``rotate_secrets`` after a new key was set before the local one, as the deploy check's hint says (with the
    newest key already, a rotation moves and records nothing)."""
    with override_settings(SECRETS_ENCRYPTION_KEYS=Fernet.generate_key().decode()):
        call_command("rotate_secrets", stdout=io.StringIO())


def config_events(after_id: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(id__gt=after_id, action__startswith="config.").order_by("id"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_change_path_leaves_exactly_its_audit_events(world: World, case: Case) -> None:
    mark = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    case.change(world)
    events = config_events(mark)
    got = [(e.action, e.actor, e.result.get("via")) for e in events]
    assert got == [(a, actor, via) for a, actor, via, _args in case.expected]
    for event, (_action, _actor, _via, args) in zip(events, case.expected, strict=True):
        for name, value in args.items():
            assert event.args.get(name) == value, (event.action, event.args)
        assert event.source == "admin" and event.ok
    # No secret value, digest or password hash in any event, whatever the path.
    stored = json.dumps(list(AuditEvent.objects.values("args", "result")), ensure_ascii=False)
    assert TOKEN not in stored and DEMO_SECRET not in stored and "d" * 64 not in stored
    for password in get_user_model().objects.exclude(password="").values_list("password", flat=True):
        assert password.split("$")[-1] not in stored
    # The chain still verifies.
    out = io.StringIO()
    call_command("verify_audit", stdout=out)


def test_an_import_of_n_changes_writes_n_events_and_a_second_import_none(world: World) -> None:
    import_document(world, IMPORTED)
    mark = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    import_document(world, IMPORTED)
    assert config_events(mark) == []


@pytest.mark.slow
def test_discovery_records_tools_added_changed_and_vanished(db: Any) -> None:
    server = McpServer.objects.create(
        mcp_id="probe",
        name="probe",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
    )
    try:
        call_command("mcp_discover", "probe", stdout=io.StringIO())
        added = config_events(0)
        listed = set(McpTool.objects.filter(server=server).values_list("name", flat=True))
        creates = {e.tool for e in added if e.action == "config.mcp_tool.create"}
        assert creates == listed and all(e.actor == "system:mcp_discover" for e in added)
        assert {e.tool for e in added if e.action == "config.tool_contract.create"} == listed
        # The server changes a tool an admin enabled (a rug pull), and one it listed before is gone.
        changed = McpTool.objects.filter(server=server).order_by("name").first()
        McpTool.objects.filter(pk=changed.pk).update(description="old text")
        McpTool.objects.create(server=server, name="gone_tool", discovered_at=timezone.now())
        mark = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
        call_command("mcp_discover", "probe", stdout=io.StringIO())
        drift = {(e.action, e.tool): e.args for e in config_events(mark)}
        update = drift[("config.mcp_tool.update", changed.name)]
        assert update["description"][0] == "old text" and update["review_required"] == [False, True]
        assert drift[("config.mcp_tool.vanish", "gone_tool")] == {"available": [True, False]}
    finally:
        get_default_pool().close("probe")


def test_the_admin_discover_button_records_the_admin_as_the_actor(admin_client: Any) -> None:
    server = McpServer.objects.create(
        mcp_id="probe",
        name="probe",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
    )
    try:
        response = admin_client.post(
            "/admin/mcpregistry/mcpserver/", {"action": "discover_tools", "_selected_action": [server.pk]}
        )
        assert response.status_code == 302
        events = [e for e in config_events(0) if e.mcp_id == "probe"]
        assert events and {(e.actor, e.result["via"]) for e in events} == {("admin", "admin")}
    finally:
        get_default_pool().close("probe")


# ---- the guard: a path that forgets its service fails ------------------------------------------------------------


def test_every_model_of_the_apps_declares_whether_it_is_configuration() -> None:
    undeclared = [
        model._meta.label
        for app in ("agents", "mcpregistry", "audit", "evals")
        for model in apps.get_app_config(app).get_models()
        if not isinstance(policy_of(model), ChangeAudit | NotConfiguration)
    ]
    assert undeclared == [], "declare change_audit = ChangeAudit(...) or NotConfiguration(reason) on these models"
    for label in ("auth.user", "auth.group"):
        assert isinstance(policy_of(apps.get_model(label)), ChangeAudit)


@pytest.fixture
def refusing(settings: Any) -> None:
    settings.PLATFORM_CHANGE_GUARD = "refuse"


@pytest.mark.parametrize(
    "write",
    [
        lambda w: McpServer.objects.create(mcp_id="sneaky", name="x", command=sys.executable),
        lambda w: McpServer.objects.filter(pk=w.server.pk).update(command="/bin/sh"),
        lambda w: ToolContract.objects.filter(tool=w.tool).update(risk="read"),
        lambda w: w.agent.servers.clear(),
        lambda w: w.server.agents.clear(),
        lambda w: DeterministicRule.objects.filter(pk=w.rule.pk).delete(),
        lambda w: w.rule.delete(),
        lambda w: ApiKey.objects.bulk_create([ApiKey(name="x", prefix="apk_x", digest="e" * 64)]),
    ],
    ids=["create", "update", "contract-risk", "m2m", "m2m-reverse", "queryset-delete", "delete", "bulk-create"],
)
def test_a_configuration_write_outside_a_service_is_refused(world: World, refusing: None, write: Callable) -> None:
    with pytest.raises(UnauditedChangeError):
        write(world)


def test_operational_state_is_written_without_a_service(world: World, refusing: None) -> None:
    assert McpServer.objects.filter(pk=world.server.pk).update(health="ok", breaker_failures=2) == 1
    assert ApiKey.objects.filter(pk=world.key.pk).update(last_used_at=timezone.now()) == 1


def test_a_scope_alone_records_nothing_so_only_services_open_one(world: World, refusing: None) -> None:
    # A change scope is what services open; code that opens one writes unrecorded, so the platform's code opens
    # it only in audit.changes' audited_save/audited_delete and the services that record themselves.
    with change_scope(actor="x", via="y"):
        McpServer.objects.filter(pk=world.server.pk).update(name="renamed")
    offenders = []
    for path in Path(settings.BASE_DIR).glob("*/**/*.py"):
        if path.parts[len(Path(settings.BASE_DIR).parts)] in ("tests", ".venv", "bench"):
            continue
        if "change_scope(" in path.read_text(encoding="utf-8"):
            offenders.append(str(path.relative_to(settings.BASE_DIR)))
    assert sorted(offenders) == [
        "agents/services.py",
        "audit/change_guard.py",
        "audit/changes.py",
        "audit/roles.py",
        "mcpregistry/services.py",
    ]


# ---- an auditor finds them ---------------------------------------------------------------------------------------


def test_an_auditor_filters_the_configuration_changes_in_the_admin_and_the_api(
    world: World, auditor_client: Any
) -> None:
    from rest_framework.test import APIClient

    from tests.conftest import AUDITOR_PASSWORD

    import_document(world, IMPORTED)
    call_command("create_api_key", "ci", stdout=io.StringIO())
    changes = AuditEvent.objects.filter(action__startswith="config.")
    assert changes.count() >= 5
    listed = auditor_client.get("/admin/audit/auditevent/?action=config.*").context["cl"].result_list
    assert {e.pk for e in listed} == set(changes.values_list("pk", flat=True))
    keys = auditor_client.get("/admin/audit/auditevent/?action=config.api_key.create").context["cl"].result_list
    assert [e.action for e in keys] == ["config.api_key.create"]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode())
    body = api.get("/api/v1/audit/events?action=config.*&limit=1000").json()
    assert {e["id"] for e in body["results"]} == set(changes.values_list("pk", flat=True))
    assert {e["result"]["via"] for e in body["results"]} >= {"import_config", "create_api_key"}
