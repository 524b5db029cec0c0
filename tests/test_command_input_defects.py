"""Management commands that took what the API, the admin or the login form refuse, and ended in a traceback, a wait
with no end, or a success no one could use:

1. ``run_query --context`` with NaN, Infinity or 1e999 (which its decoder took) failed the JSON column's CHECK: an
   IntegrityError traceback, where the API's parser answers a clear 400. It reads the context by the API's rules now.
2. ``unlock_login`` with a Redis it cannot reach ended in redis's ConnectionError traceback.
3. ``run_query`` queued an empty or blank query, which the API and MCP refuse.
4. ``create_api_key`` kept names the admin refuses (blank, padded, with control characters), and
   ``revoke_api_key``, which strips what it is given, never found a padded one.
5. ``run_query --timeout nan`` and ``run_eval --timeout nan`` waited forever (no time is past NaN).
6. ``create_auditor`` made an auditor with a NUL in the password, who could never sign in.
7. ``verify_audit --workers -3`` verified in one process and ``--chunk-size 0`` one row at a time, unsaid: counts
   below what a command can use are refused now.
8. ``seed_demo`` made a superuser with whatever ``DEMO_ADMIN_PASSWORD`` said, ``admin`` or ``12345678`` included.
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import translation

from agents.models import ApiKey, Run
from agents.services import api_key_create
from audit.logins import LIFT_ACTION
from audit.models import AuditEvent
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: the connection is refused at once.
UNREACHABLE_REDIS = {
    "default": {"BACKEND": "agent_platform.redis_cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
}


def run_query(*arguments: str) -> None:
    call_command("run_query", *arguments, stdout=io.StringIO(), stderr=io.StringIO())


# ---- 1. --context by the API's rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("context", "problem"),
    [
        ('{"score": NaN}', "score: NaN is not a JSON number."),
        ('{"score": Infinity}', "score: Infinity is not a JSON number."),
        ('{"score": -Infinity}', "score: -Infinity is not a JSON number."),
        ('{"score": 1e999}', "score: The number 1e999 is too large."),
        ('{"id": 99999999999999999999}', "id: The integer 99999999999999999999 is out of range."),
        ('{"name": "김\\u0000하늘"}', "name: Text may not contain NUL characters."),
    ],
)
def test_run_query_refuses_a_context_the_api_refuses_and_queues_nothing(context: str, problem: str) -> None:
    make_agent(slug="cli-context", servers=[], with_demo_rules=False)
    with pytest.raises(CommandError) as refused:
        run_query("cli-context", "김하늘 님은 어느 팀인가요?", "--context", context, "--timeout", "0")
    assert str(refused.value) == f"--context is not JSON: {problem}"
    assert not Run.objects.exists()


def test_run_query_says_why_its_context_is_refused_in_the_platforms_language() -> None:
    make_agent(slug="cli-context", servers=[], with_demo_rules=False)
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        run_query("cli-context", "안녕", "--context", '{"score": NaN}', "--timeout", "0")
    assert str(refused.value) == "--context가 JSON이 아님: score: NaN은(는) JSON 숫자가 아닙니다."


def test_run_query_refuses_a_context_nested_deeper_than_the_api_takes() -> None:
    make_agent(slug="cli-context", servers=[], with_demo_rules=False)
    with override_settings(PLATFORM_API_MAX_JSON_DEPTH=3), pytest.raises(CommandError) as refused:
        run_query("cli-context", "안녕", "--context", '{"a": {"b": {"c": {}}}}', "--timeout", "0")
    assert str(refused.value) == "--context is not JSON: JSON nested deeper than 3 levels."
    assert not Run.objects.exists()


def test_run_query_refuses_a_context_whose_bytes_were_no_utf8() -> None:
    # Python keeps a command line's bytes that are no UTF-8 as lone surrogates; no database stores one.
    with pytest.raises(CommandError) as refused:
        run_query("nobody", "안녕", "--context", '{"name": "\udcff"}', "--timeout", "0")
    assert str(refused.value) == "--context is not UTF-8 text"


# ---- 2. unlock_login without its cache -----------------------------------------------------------------------


def test_unlock_login_says_the_cache_cannot_be_reached_and_records_no_lift() -> None:
    with override_settings(CACHES=UNREACHABLE_REDIS), pytest.raises(CommandError) as refused:
        call_command("unlock_login", "admin", stdout=io.StringIO())
    message = str(refused.value)
    assert message.startswith("cannot reach the cache at REDIS_URL (") and "nothing was lifted" in message
    assert not AuditEvent.objects.filter(action=LIFT_ACTION).exists()


# ---- 3. the query ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_run_query_refuses_an_empty_or_blank_query_and_queues_nothing(query: str) -> None:
    make_agent(slug="cli-query", servers=[], with_demo_rules=False)
    with pytest.raises(CommandError) as refused:
        run_query("cli-query", query, "--timeout", "0")
    assert str(refused.value) == "The query is empty."
    assert not Run.objects.exists()


def test_run_query_submits_the_query_stripped_as_the_api_does() -> None:
    make_agent(slug="cli-query", servers=[], with_demo_rules=False)
    with pytest.raises(CommandError):  # no worker runs it within 0 s
        run_query("cli-query", "  김하늘 님은 어느 팀인가요?\n", "--timeout", "0")
    assert Run.objects.get().query == "김하늘 님은 어느 팀인가요?"


# ---- 4. API key names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["   ", "\u3000", "ci\x00key", "ci\x01key", "ci\nkey"])
def test_create_api_key_refuses_a_blank_name_or_one_with_control_characters(name: str) -> None:
    with pytest.raises(CommandError):
        call_command("create_api_key", name, stdout=io.StringIO())
    assert not ApiKey.objects.exists()


def test_create_api_key_stores_the_name_stripped_so_revoke_api_key_finds_it() -> None:
    call_command("create_api_key", " 공백키 ", stdout=io.StringIO())
    assert ApiKey.objects.get().name == "공백키"
    out = io.StringIO()
    call_command("revoke_api_key", " 공백키 ", stdout=out)
    assert ApiKey.objects.get().revoked_at is not None
    assert "(공백키)" in out.getvalue()


@pytest.mark.parametrize("given", [" 공백키 ", "공백키"])
def test_revoke_api_key_finds_a_name_stored_padded(given: str) -> None:
    api_key_create(name=" 공백키 ", actor="test", via="tests")  # as create_api_key stored it before
    call_command("revoke_api_key", given, stdout=io.StringIO())
    assert ApiKey.objects.get().revoked_at is not None


# ---- 5. --timeout --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", ["nan", "inf", "-Infinity", "-1", "soon"])
def test_run_query_refuses_a_timeout_that_is_no_finite_number_of_seconds(timeout: str) -> None:
    # An unknown agent: were the timeout taken, the command would say so at once rather than wait forever.
    with pytest.raises(CommandError, match="--timeout"):
        run_query("nobody", "안녕", "--timeout", timeout)


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "soon"])
def test_run_eval_refuses_a_timeout_that_is_no_finite_number_of_seconds(timeout: str) -> None:
    with pytest.raises(CommandError, match="--timeout"):
        call_command("run_eval", "nobody", "no-set", "--timeout", timeout, stdout=io.StringIO(), stderr=io.StringIO())


def test_a_timeout_of_zero_seconds_is_taken() -> None:
    with pytest.raises(CommandError) as refused:
        run_query("nobody", "안녕", "--timeout", "0")
    assert "--timeout" not in str(refused.value)  # refused for the unknown agent, not the timeout


# ---- 6. the auditor's password -------------------------------------------------------------------------------


@pytest.mark.parametrize("password", ["gooD-pass\x00word-7", "gooD-pass\x01word-7", "gooD-pass\tword-7"])
def test_create_auditor_refuses_a_password_with_control_characters_from_standard_input(password: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command(
            "create_auditor", "jun", "--password-stdin", stdin=io.StringIO(password + "\n"), stdout=io.StringIO()
        )
    assert "control characters" in str(refused.value)
    assert not get_user_model().objects.filter(username="jun").exists()


def test_create_auditor_refuses_a_given_password_with_nul() -> None:
    with pytest.raises(CommandError):
        call_command("create_auditor", "jun", "--password", "gooD-pass\x00word-7", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username="jun").exists()


def test_create_auditor_refuses_a_password_that_was_no_utf8() -> None:
    with pytest.raises(CommandError) as refused:
        call_command("create_auditor", "jun", "--password", "gooD-pass\udcffword-7", stdout=io.StringIO())
    assert str(refused.value) == "the password is not UTF-8 text"
    assert not get_user_model().objects.filter(username="jun").exists()


# ---- 7. counts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "arguments"),
    [
        ("verify_audit", ["--workers", "-3"]),
        ("verify_audit", ["--chunk-size", "0"]),
        ("verify_audit", ["--progress-every", "-1"]),
        ("verify_audit", ["--workers", "two"]),
        ("archive_audit", ["--older-than-days", "365", "--progress-every", "0"]),
        ("run_eval", ["nobody", "no-set", "--workers", "0"]),
        # Past what an integer column holds: it reached the database (SQLite's OverflowError, a window wrapped
        # negative on PostgreSQL), a traceback.
        ("run_eval", ["nobody", "no-set", "--workers", "99999999999999999999"]),
        ("run_eval", ["nobody", "no-set", "--workers", "2147483648"]),
        ("agent_version", ["rollback", "nobody", "99999999999999999999"]),
    ],
)
def test_a_count_below_what_the_command_can_use_is_refused_not_read_as_something_else(
    command: str, arguments: list[str]
) -> None:
    # verify_audit --workers -3 verified in one process, --chunk-size 0 one row at a time: the operator was never
    # told the value was wrong.
    option = next(
        (argument for argument in arguments if argument.startswith("--") and argument != "--older-than-days"),
        "number",  # a positional one: argparse names it
    )
    with pytest.raises(CommandError, match=option):
        call_command(command, *arguments, stdout=io.StringIO(), stderr=io.StringIO())
    assert not AuditEvent.objects.filter(action__startswith="audit.").exists()


def test_a_refused_count_is_explained_in_korean() -> None:
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("verify_audit", "--workers", "-3", stdout=io.StringIO(), stderr=io.StringIO())
    assert "0 이상" in str(refused.value)


# ---- 8. seed_demo's DEMO_ADMIN_PASSWORD -----------------------------------------------------------------------


@pytest.mark.parametrize("password", ["admin", "12345678", "password", "short", "demo\x00admin-2026"])
def test_seed_demo_refuses_a_demo_admin_password_the_password_page_would_refuse_and_keeps_nothing(
    password: str,
) -> None:
    # DEMO_ADMIN_PASSWORD="admin" made a superuser with that password on whatever host ran the demo.
    with override_settings(PLATFORM_DEMO_ADMIN_PASSWORD=password), pytest.raises(CommandError, match="DEMO_ADMIN"):
        call_command("seed_demo", "--no-discover", stdout=io.StringIO(), stderr=io.StringIO())
    assert not get_user_model().objects.exists()
    assert not AuditEvent.objects.exists()


def test_seed_demo_takes_a_strong_demo_admin_password() -> None:
    with override_settings(PLATFORM_DEMO_ADMIN_PASSWORD="Kim-Haneul-2026-demo"):
        call_command("seed_demo", "--no-discover", stdout=io.StringIO(), stderr=io.StringIO())
    assert get_user_model().objects.get(username="admin").check_password("Kim-Haneul-2026-demo")
