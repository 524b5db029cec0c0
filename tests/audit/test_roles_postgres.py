"""On PostgreSQL, a queryset update of users' flags outside a service is recorded whatever its shape: FOR UPDATE
refuses a DISTINCT or the nullable side of an outer join, which the recording must not pass on to the caller.

And two review defects of ``audit/roles.py`` where transactions really overlap: (1) the password page took no
configuration lock, so a change form saved meanwhile wrote the old password hash back, recorded as its admin's
password change; (2) a write of a user or a group outside a service (a queryset update or ``bulk_create``, a save
in a script's transaction) locked the row before the configuration: deadlocked with a service, which was killed."""

from __future__ import annotations

import json

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


# --- review defects 1 and 2 (``test_roles_lock_order.py`` holds their SQLite halves) -------------------------------

INTERLEAVED = r"""
import json, threading, time, uuid
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, transaction
from audit.change_guard import config_write_lock
from audit.models import AuditEvent
from audit.roles import group_save, user_create, user_password_page, user_update
from audit.services import audit_chain_catch_up
User = get_user_model()
tag = uuid.uuid4().hex[:8]
reached, second_done = threading.Event(), threading.Event()

def blocking_another():
    from tests.postgres import blocking_another as waits_on_us  # read live from pg_locks
    return waits_on_us(connection)

def pause():
    '''Where the first writer waits, inside its transaction, until the second has finished or waits for a lock the
    first holds (it cannot go on before the first's transaction ends, however long the first waited), or 3 s.'''
    reached.set()
    deadline = time.monotonic() + 3
    while not second_done.wait(timeout=0.02) and not blocking_another() and time.monotonic() < deadline:
        pass

def interleaved(first, second):
    errors = []
    reached.clear(); second_done.clear()
    def run(fn, done=None):
        try:
            fn()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        finally:
            if done is not None:
                done.set()
            connection.close()
    one = threading.Thread(target=run, args=(first,))
    one.start()
    reached.wait(timeout=30)
    two = threading.Thread(target=run, args=(second, second_done))
    two.start()
    one.join(timeout=60); two.join(timeout=60)
    return errors

def events(action, user):
    audit_chain_catch_up()
    return [[e.actor, e.args] for e in AuditEvent.objects.filter(action=action, result__id=user.pk).order_by("seq")]
"""

PASSWORD_RESET = (
    INTERLEAVED
    + r"""
target = user_create(actor="t", via="tests", username=f"mina-{tag}", password="old-Passw0rd")

def change_form():  # superB's POST: the admin's change form reads the user under the configuration's lock
    with transaction.atomic():
        config_write_lock()
        form_user = User.objects.get(pk=target.pk)
        pause()
        form_user.is_staff = True
        user_update(user=form_user, actor="superB", via="admin")

def password_page():  # superA resets the password meanwhile
    with user_password_page(actor="superA", via="admin"):
        user = User.objects.get(pk=target.pk)
        user.set_password("new-Passw0rd")
        user.save()

errors = interleaved(change_form, password_page)
stored = User.objects.get(pk=target.pk)
print(json.dumps({"errors": errors, "new": stored.check_password("new-Passw0rd"), "staff": stored.is_staff,
                  "updates": events("config.user.update", target),
                  "resets": events("config.user.password_change", target)}))
"""
)

DEADLOCKS = (
    INTERLEAVED
    + r"""
def setup():
    user = user_create(actor="t", via="tests", username=f"pg-dl-{uuid.uuid4().hex[:8]}", password=None)
    return user, group_save(group=Group(name=f"pg-dl-{uuid.uuid4().hex[:8]}"), actor="t", via="tests")

def service(change):  # a service in a transaction that holds the configuration's lock, then writes the row
    def run():
        with transaction.atomic():
            config_write_lock()
            pause()
            change()
    return run

def save_in_transaction(row, field, value):
    def run():
        with transaction.atomic():  # a script's transaction: the save's recorder used to lock last
            fresh = type(row).objects.get(pk=row.pk)
            setattr(fresh, field, value)
            fresh.save()
    return run

found = {}
user, group = setup()
found["update"] = interleaved(
    service(lambda: user_update(user=User.objects.get(pk=user.pk), actor="admin", via="admin", data={"email": "a@b.c"})),
    lambda: User.objects.filter(username=user.username).update(is_staff=True),
)
user, group = setup()
found["bulk_create"] = interleaved(
    service(lambda: user_update(user=User.objects.get(pk=user.pk), actor="admin", via="admin", data={"email": "a@b.c"})),
    lambda: User.objects.bulk_create([User(username=user.username, is_staff=True)], update_conflicts=True,
                                     unique_fields=["username"], update_fields=["is_staff"]),
)
user, group = setup()
found["save"] = interleaved(
    service(lambda: user_update(user=User.objects.get(pk=user.pk), actor="admin", via="admin", data={"email": "a@b.c"})),
    save_in_transaction(user, "is_superuser", True),
)
user, group = setup()
def rename():
    fresh = Group.objects.get(pk=group.pk)
    fresh.name = fresh.name + "-a"
    group_save(group=fresh, actor="admin", via="admin")
found["group save"] = interleaved(service(rename), save_in_transaction(group, "name", group.name + "-b"))
print(json.dumps(found))
"""
)


def _shell(script: str, url: str) -> dict[str, object]:
    done = manage("shell", "-c", script, database_url=url, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_change_form_saved_during_a_password_reset_keeps_the_new_password_on_postgres(
    postgres_url: str,  # noqa: F811
) -> None:
    result = _shell(PASSWORD_RESET, postgres_url)
    assert result["errors"] == []
    # The page waits for the form's lock, then resets: the form wrote the old hash back, and its save was recorded
    # as superB's password change.
    assert (result["new"], result["staff"]) == (True, True)
    assert result["updates"] == [["superB", {"is_staff": [False, True]}]]
    assert result["resets"] == [["superA", {}]]


def test_writes_of_users_and_groups_outside_a_service_never_deadlock_with_a_service_on_postgres(
    postgres_url: str,  # noqa: F811
) -> None:
    found = _shell(DEADLOCKS, postgres_url)
    # Each used to end in "deadlock detected" for the service (an admin's POST: a 500).
    assert found == {"update": [], "bulk_create": [], "save": [], "group save": []}
