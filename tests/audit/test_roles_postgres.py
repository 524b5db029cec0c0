"""On PostgreSQL, a queryset update of users' flags outside a service is recorded whatever its shape: FOR UPDATE
refuses a DISTINCT or the nullable side of an outer join, which the recording must not pass on to the caller."""

from __future__ import annotations

import pytest

from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = [pytest.mark.postgres]

UPDATES = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from audit.models import AuditEvent
User = get_user_model()
group = Group.objects.create(name="pg-ops")
user = User.objects.create_user("pg-dana", password="x")
user.groups.add(group)
loner = User.objects.create_user("pg-loner", password="x")
User.objects.filter(groups__name="pg-ops").distinct().update(is_staff=True)
User.objects.filter(groups__isnull=True, username="pg-loner").update(is_superuser=True)
from audit.services import audit_chain_catch_up
audit_chain_catch_up()  # PostgreSQL chains the events after commit
updates = AuditEvent.objects.filter(action="config.user.update", actor="system:unattributed").order_by("seq")
print([e.args for e in updates if set(e.args) & {"is_staff", "is_superuser"}], flush=True)
"""


def test_a_distinct_or_outer_join_update_is_recorded_on_postgres(postgres_url: str) -> None:  # noqa: F811
    done = manage("shell", "-c", UPDATES, database_url=postgres_url, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[{'is_staff': [False, True]}, {'is_superuser': [False, True]}]" in done.stdout, done.stdout
