"""The rule editor's live regex check agrees with the server (reviewer's defect 2): it asks the admin's
``regex-check/`` endpoint, which runs the validation the rule form runs on save. The check in JavaScript's RegExp
marked Python-valid patterns invalid (``(?i)…``, ``\\Z``) and a pattern the server refuses valid (``(?<name>…)``).
The browser side is in ``tests/browser/test_rule_editor.py``."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import translation

from agents.models import Agent, DeterministicRule
from tests.agents.test_rule_editor import errors, ledger, rule_post  # noqa: F401 (ledger: a fixture)

pytestmark = pytest.mark.django_db

CHECK = "/admin/agents/deterministicrule/regex-check/"


def check(client: Client, pattern: str) -> dict[str, Any]:
    response = client.get(CHECK, {"regex": pattern})
    assert response.status_code == 200, response.content
    return dict(response.json())


@pytest.mark.parametrize(
    ("pattern", "groups"),
    [
        (r"(?i)^(?P<asset>A-\d{4})\Z", ["asset"]),
        (r"(?P<name>[가-힣]{2,4})\s*님 (?P<team>\w+)", ["name", "team"]),
        ("", []),
    ],
)
def test_what_python_takes_is_valid_with_its_groups_in_order(
    admin_client: Client, pattern: str, groups: list[str]
) -> None:
    assert check(admin_client, pattern) == {"valid": True, "groups": groups}


def test_what_the_server_refuses_is_invalid_in_the_words_the_form_shows_on_save(
    admin_client: Client,
    ledger: Agent,  # noqa: F811
) -> None:
    pattern = "(?<name>[가-힣]{2,4}) 님"
    verdict = check(admin_client, pattern)
    assert verdict == {
        "valid": False,
        "message": "not a valid regular expression: a named group is written (?P<name>…), not (?<name>…) "
        "(at character 2)",
    }
    page = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, when__regex=pattern, params__value__name="x")
    ).content.decode()
    assert html.escape(verdict["message"], quote=False) in errors(page)
    assert not DeterministicRule.objects.exists()


def test_the_verdict_is_in_the_readers_language(admin_client: Client) -> None:
    with translation.override("ko"):
        verdict = admin_client.get(CHECK, {"regex": "(a"}, HTTP_ACCEPT_LANGUAGE="ko").json()
    assert verdict["valid"] is False and verdict["message"].startswith("올바른 정규식이 아닙니다: ")


def test_the_editor_page_names_the_check(admin_client: Client, ledger: Agent) -> None:  # noqa: F811
    page = admin_client.get("/admin/agents/deterministicrule/add/").content.decode()
    assert CHECK in page


def test_only_whoever_may_add_or_change_rules_may_ask(client: Client) -> None:
    viewer = get_user_model().objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deterministicrule"))
    client.force_login(viewer)
    assert client.get(CHECK, {"regex": "a"}).status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename="change_deterministicrule"))
    viewer = get_user_model().objects.get(pk=viewer.pk)  # permissions are cached on the instance
    client.force_login(viewer)
    assert check(client, "a") == {"valid": True, "groups": []}
    client.logout()
    assert client.get(CHECK, {"regex": "a"}).status_code == 302  # to the login page


@pytest.mark.parametrize(
    "pattern", ["(((a{1000}){1000}){1000})", "(a{300}){400}", "(?:a{100000})" * 80, "a{100000}" * 20]
)
def test_nested_counted_repeats_are_refused_before_the_regex_module_unrolls_them(
    admin_client: Client, pattern: str
) -> None:
    # 25 characters took gigabytes to compile (the process was killed, or a MemoryError was a 500).
    assert check(admin_client, pattern) == {
        "valid": False,
        "message": "not a valid regular expression: a repeat count is too large",
    }


def test_counted_repeats_side_by_side_are_fine(admin_client: Client) -> None:
    assert check(admin_client, r"a{1000}b{1000}\d{3}-\d{4}")["valid"] is True
