"""The roles the platform's data migrations make (``auditor``, ``reviewer``: who may read the record, who may
approve) are in the audit record from the first ``migrate``: recorded as created by ``system:migrate``, with
their permissions, once; a group made later through the services is recorded by them, not again at the next
migrate. (The suite's own databases start with an empty record, ``tests/conftest.py``: these tests call the
recording themselves, or migrate fresh databases of their own with it on.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group

from audit.models import AuditEvent
from audit.roles import MIGRATE_ACTOR, groups_record_migrated, groups_record_unrecorded, groups_snapshot
from tests.audit.test_chain import verify
from tests.e2e.harness import manage_in

EVENTS = """
import json
from audit.models import AuditEvent
print(json.dumps([
    [e.action, e.actor, e.result.get("name"), e.result.get("via"), e.args]
    for e in AuditEvent.objects.filter(action__startswith="config.").order_by("seq")
], ensure_ascii=False))
"""
SERVICE_GROUP = (
    "from django.contrib.auth.models import Group; from audit.roles import group_save; "
    "group_save(group=Group(name='운영팀'), actor='admin', via='admin')"
)
# The record printed, then verify_audit run (in one process: Django starts once, not twice).
EVENTS_THEN_VERIFY = EVENTS + "from django.core.management import call_command\ncall_command('verify_audit')\n"


@pytest.mark.django_db
def test_the_groups_migrations_made_are_recorded_once_with_their_permissions() -> None:
    assert set(Group.objects.values_list("name", flat=True)) >= {"auditor", "reviewer"}
    assert not AuditEvent.objects.exists()

    assert groups_record_unrecorded() == 2
    assert groups_record_unrecorded() == 0  # recorded: never again

    events: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
        e.result["name"]: (e.actor, e.args, e.result)
        for e in AuditEvent.objects.filter(action="config.group.create")
        if isinstance(e.args, dict) and isinstance(e.result, dict)
    }
    assert set(events) == {"auditor", "reviewer"}
    for name, (actor, args, result) in events.items():
        assert actor == MIGRATE_ACTOR and result["via"] == "migrate"
        assert args["name"] == [None, name]
    assert "audit.view_auditevent" in events["auditor"][1]["permissions"][1]
    assert "agents.change_approval" in events["reviewer"][1]["permissions"][1]
    assert "audit.view_auditevent" not in events["reviewer"][1]["permissions"][1]
    assert verify().startswith("verified 2 events")


def _printed_record(stdout: str) -> list[Any]:
    """The record as EVENTS printed it (its one line of JSON)."""
    [line] = [line for line in stdout.splitlines() if line.startswith("[")]
    record: list[Any] = json.loads(line)
    return record


@pytest.mark.slow
def test_a_fresh_migrate_records_its_roles_and_a_later_migrate_records_nothing_again(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PLATFORM_AUDIT_MIGRATED_GROUPS")}
    env.update(PLATFORM_VAR_DIR=str(tmp_path), SQLITE_PATH=str(tmp_path / "db.sqlite3"), PYTHONIOENCODING="utf-8")

    manage_in(env, "migrate", "--noinput", "--verbosity", "0")
    # The record read, then a group made through the service (recorded by it), in one process.
    first = _printed_record(manage_in(env, "shell", "-c", EVENTS + SERVICE_GROUP))
    assert sorted((action, actor, name, via) for action, actor, name, via, _ in first) == [
        ("config.group.create", MIGRATE_ACTOR, "auditor", "migrate"),
        ("config.group.create", MIGRATE_ACTOR, "reviewer", "migrate"),
    ]

    manage_in(env, "migrate", "--noinput", "--verbosity", "0")
    printed = manage_in(env, "shell", "-c", EVENTS_THEN_VERIFY)
    after = _printed_record(printed)
    assert after[:2] == first
    assert [(action, actor, name, via) for action, actor, name, via, _ in after[2:]] == [
        ("config.group.create", "admin", "운영팀", "admin")
    ]
    assert "verified 3 events" in printed.strip().splitlines()[-1]


def _events(action: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (e.actor, str(e.result.get("name")), e.args)
        for e in AuditEvent.objects.filter(action=action).order_by("id")
        if isinstance(e.result, dict) and isinstance(e.args, dict)
    ]


@pytest.mark.django_db
def test_a_migration_that_changes_a_roles_permissions_or_removes_it_is_recorded_at_the_end_of_migrate() -> None:
    """What a data migration does to a role (it cannot call the services, and the signals do not see its
    historical models) is found by comparing the groups as the migrate found and left them."""
    from django.contrib.auth.models import Permission
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    assert groups_record_unrecorded() == 2
    before = groups_snapshot()
    auditor = Group.objects.get(name="auditor")
    reviewer = Group.objects.get(name="reviewer")
    granted = Permission.objects.get(content_type__app_label="agents", codename="view_agent")
    # As a data migration writes, with its historical models: no recorder of ours sees them (the live models'
    # link tables, bulk creates and deletes are recorded as they happen, unattributed).
    historical = MigrationLoader(connection).project_state().apps.get_model("auth", "Group")
    links = historical.permissions.through
    links.objects.bulk_create([links(group_id=auditor.pk, permission_id=granted.pk)])
    historical.objects.filter(pk=reviewer.pk).delete()
    historical.objects.bulk_create([historical(name="support")])  # a new role

    assert groups_record_migrated(before) == 3
    assert groups_record_migrated(groups_snapshot()) == 0  # a migrate that changes nothing records nothing
    [(actor, name, args)] = _events("config.group.update")
    assert (actor, name) == (MIGRATE_ACTOR, "auditor")
    was, now = args["permissions"]
    assert set(now) - set(was) == {"agents.view_agent"} and set(was) <= set(now)
    [(actor, name, args)] = _events("config.group.delete")
    assert (actor, name) == (MIGRATE_ACTOR, "reviewer") and args["name"] == ["reviewer", None]
    assert [(actor, name) for actor, name, _ in _events("config.group.create")][-1] == (MIGRATE_ACTOR, "support")
    assert verify().startswith("verified 5 events")


@pytest.mark.django_db
def test_a_permission_recorded_in_another_language_is_no_change() -> None:
    """A group changed by an admin reading Korean is recorded with Korean permission names; a later migrate (in
    English) compares the groups as it found and left them, never with the record's wording."""
    from django.contrib.auth.models import Permission
    from django.utils import translation

    from audit.roles import group_save

    assert groups_record_unrecorded() == 2
    reviewer = Group.objects.get(name="reviewer")
    extra = Permission.objects.get(content_type__app_label="agents", codename="view_agent")
    with translation.override("ko"):
        group_save(group=reviewer, actor="admin", via="admin", permissions=[*reviewer.permissions.all(), extra])
    assert groups_record_migrated(groups_snapshot()) == 0
    assert not AuditEvent.objects.filter(actor=MIGRATE_ACTOR, action="config.group.update").exists()


@pytest.mark.django_db
def test_groups_are_not_recreated_once_the_records_start_is_archived(tmp_path: Path) -> None:
    """After ``archive_audit`` a group's creation may lie in the archive: no group is recorded as created again."""
    import io

    from django.core.management import call_command

    assert groups_record_unrecorded() == 2
    call_command(
        "archive_audit", "--older-than-days", "0", "--output", str(tmp_path / "a.jsonl.gz"), stdout=io.StringIO()
    )
    assert not AuditEvent.objects.filter(action="config.group.create").exists()  # in the archive now
    assert groups_record_unrecorded() == 0
    assert groups_record_migrated(groups_snapshot()) == 0


@pytest.mark.django_db
def test_a_groups_permissions_changed_outside_a_service_are_recorded_unattributed() -> None:
    """A shell or a script that grants a group a permission is recorded at once (``system:unattributed``), from
    either side of the relation; a migrate after it finds the record up to date."""
    from django.contrib.auth.models import Permission

    assert groups_record_unrecorded() == 2
    auditor = Group.objects.get(name="auditor")
    view_agent = Permission.objects.get(content_type__app_label="agents", codename="view_agent")
    view_server = Permission.objects.get(content_type__app_label="mcpregistry", codename="view_mcpserver")
    auditor.permissions.add(view_agent)
    view_server.group_set.add(auditor)
    auditor.permissions.remove(view_agent)
    changes = [(actor, name, args["permissions"]) for actor, name, args in _events("config.group.update")]
    assert [(actor, name) for actor, name, _ in changes] == [("system:unattributed", "auditor")] * 3
    added = [set(after) - set(before) for _actor, _name, (before, after) in changes[:2]]
    assert added == [{"agents.view_agent"}, {"mcpregistry.view_mcpserver"}]
    before, after = changes[2][2]
    assert set(before) - set(after) == {"agents.view_agent"}
    assert groups_record_unrecorded() == 0
