"""A secret whose name and value sit apart: in fields of their own (``{"name": "Authorization", "value": …}``), in
a pair (``[["X-Api-Key", …]]``), under a vendor's or a full-width key name, and in the text forms a tool prints
(URL-encoded, XML, command-line options). Each was stored in clear in the audit record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from audit.masking import MASK, clear_registered_secrets, is_secret_key, mask_text, mask_value

SECRET = "zq9Lk2mP0wXr7Tt"


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    clear_registered_secrets()
    yield
    clear_registered_secrets()


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


# --- structures ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"headers": [["X-Api-Key", SECRET]]},  # httpx / requests header list
        {"headers": [("X-Api-Key", SECRET), ("Accept", "application/json")]},  # a list of 2-tuples
        {"headers": (("Authorization", f"Token {SECRET}"),)},
        {"header": ("X-Api-Key", SECRET)},  # one pair
        ("X-Api-Key", SECRET),
        {"headers": [{"name": "Authorization", "value": SECRET}]},  # HAR / OpenAPI
        {"headers": [{"value": SECRET, "name": "X-Api-Key", "comment": ""}]},  # the value first
        {"env": [{"name": "DB_PASSWORD", "value": SECRET}]},  # Kubernetes env
        {"Tags": [{"Key": "api_token", "Value": SECRET}]},  # AWS tags
        {"Parameter": {"Name": "/prod/db/password", "Value": SECRET, "Type": "SecureString"}},  # AWS SSM
        {"properties": [{"name": "spring.datasource.password", "value": SECRET}]},
        {"header": [{"key": "x-api-key", "value": SECRET, "type": "text"}]},  # Postman
        {"fields": [{"field": "client_secret", "val": SECRET}]},
        {"Ocp-Apim-Subscription-Key": SECRET},  # Azure API Management
        {"x-functions-key": SECRET},  # Azure Functions
        {"ｐａｓｓｗｏｒｄ": SECRET},  # full-width: NFKC "password"
        {"headers": [["Ｘ-Ａｐｉ-Ｋｅｙ", SECRET]]},
        {"secrets": [{"name": "ｔｏｋｅｎ", "value": SECRET}]},
    ],
)
def test_a_secret_kept_apart_from_its_name_is_masked(value: Any) -> None:
    masked = mask_value(value)
    assert SECRET not in _dump(masked), masked
    assert MASK in _dump(masked)


def test_only_the_value_of_a_named_secret_is_masked_and_the_shape_kept() -> None:
    value = {
        "headers": [("X-Api-Key", SECRET), ("Accept", "application/json")],
        "har": [{"name": "Authorization", "value": SECRET, "comment": "sent"}, {"name": "Accept", "value": "*/*"}],
        "env": [{"name": "DB_PASSWORD", "value": SECRET}, {"name": "DB_HOST", "value": "db.internal"}],
    }
    assert mask_value(value) == {
        "headers": [("X-Api-Key", MASK), ("Accept", "application/json")],
        "har": [{"name": "Authorization", "value": MASK, "comment": "sent"}, {"name": "Accept", "value": "*/*"}],
        "env": [{"name": "DB_PASSWORD", "value": MASK}, {"name": "DB_HOST", "value": "db.internal"}],
    }


@pytest.mark.parametrize(
    "value",
    [
        {"name": "kim", "value": 3, "key_count": 2, "tokens": 120, "max_tokens": 500},
        {"name": "token_count", "value": 42},
        {"name": "max_tokens", "value": 1000},
        {"key": "primary_key", "value": "id"},
        {"name": "auth.py", "content": "def login(): ..."},  # a file: its name is no header
        {"name": "src/auth/views.py", "content": "def login(): ..."},
        {"name": "Password policy", "content": "Twelve characters at least."},  # a title
        {"name": "DB_PASSWORD", "value": ""},  # empty stays empty
        {"name": "DB_PASSWORD", "value": None},
        {"name": "DB_PASSWORD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},  # no value here
        {"tags": ["auth", "oauth2"]},  # a list under a key is no pair
        {"args": ["--password", "--verbose"]},
        [["author", "kim"], ["tokens", "12"]],
        [("name", "kim"), ("team", "cloud")],
    ],
)
def test_ordinary_names_and_values_stay_visible(value: Any) -> None:
    assert mask_value(value) == value


@pytest.mark.parametrize(
    "key", ["Ocp-Apim-Subscription-Key", "x-functions-key", "ｐａｓｓｗｏｒｄ", "ＡＰＩ＿ＫＥＹ", "storage_key"]
)
def test_vendor_and_full_width_key_names_are_secret(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["subscription", "subscription_id", "function_name", "functions", "ｎａｍｅ", "ｋｅｙ"])
def test_their_neighbours_are_not(key: str) -> None:
    assert not is_secret_key(key)


def test_a_mysql_password_glued_to_its_option_is_masked_in_a_command_line() -> None:
    assert mask_value({"args": ["mysql", "-u", "root", f"-p{SECRET}", "app"]}) == {
        "args": ["mysql", "-u", "root", f"-p{MASK}", "app"]
    }
    assert mask_value({"args": ["docker", "run", "-p8080:80", "app"]}) == {
        "args": ["docker", "run", "-p8080:80", "app"]
    }


# --- text ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"body=user%3Dkim%26password%3D{SECRET}%26next%3D1", f"body=user%3Dkim%26password%3D{MASK}%26next%3D1"),
        (f"q=%7B%22api_key%22%3A%22{SECRET}%22%7D", f"q=%7B%22api_key%22%3A%22{MASK}%22%7D"),
        (f"<password>{SECRET}</password><user>kim</user>", f"<password>{MASK}</password><user>kim</user>"),
        (f"<db:Password type='x'>{SECRET}</db:Password>", f"<db:Password type='x'>{MASK}</db:Password>"),
        (f"deploy --password {SECRET} --verbose", f"deploy --password {MASK} --verbose"),
        (f"cli --api-key '{SECRET}' run", f"cli --api-key '{MASK}' run"),
        (f"mysql -u root -p{SECRET} app", f"mysql -u root -p{MASK} app"),
        (f"sshpass -p {SECRET} ssh host", f"sshpass -p {MASK} ssh host"),
        (f'{{"name": "Authorization", "value": "{SECRET}"}}', f'{{"name": "Authorization", "value": "{MASK}"}}'),
        (f'{{"name": "DB_PASSWORD", "value": "{SECRET}"}}', f'{{"name": "DB_PASSWORD", "value": "{MASK}"}}'),
        (f"[('X-Api-Key', '{SECRET}'), ('Accept', 'json')]", f"[('X-Api-Key', '{MASK}'), ('Accept', 'json')]"),
        (f'[["X-Api-Key", "{SECRET}"]]', f'[["X-Api-Key", "{MASK}"]]'),
    ],
)
def test_a_secret_in_the_text_forms_tools_print_is_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected
    assert mask_text(expected) == expected  # idempotent


@pytest.mark.parametrize(
    "text",
    [
        "Use the --password flag, or --password-stdin instead.",
        "run --token-file /run/token --no-password",
        "ssh -p 2222 host; docker run -p 8080:80 app",
        "mysql -u root -p -h db",  # prompts for it: no value here
        "Reset your password -- then sign in again.",
        "<title>Password reset</title><p>Choose a new password.</p>",
        "Coverage went 100%3D 50%3A nothing",
        "https://example.com/search?q=cloud%3Dsky&page=2",
        '{"name": "kim", "value": "team lead"}',
        "[('Accept', 'json'), ('name', 'kim')]",
        "A tuple (a, b) and a list [1, 2].",
        "비밀번호를 잊으셨나요? -- 관리자에게 문의하세요.",
    ],
)
def test_ordinary_text_around_these_forms_is_left_alone(text: str) -> None:
    assert mask_text(text) == text


# --- the audit record ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        {"headers": [["X-Api-Key", SECRET]]},
        {"headers": [{"name": "Authorization", "value": SECRET}]},
        {"env": [{"name": "DB_PASSWORD", "value": SECRET}]},
        {"Ocp-Apim-Subscription-Key": SECRET},
        {"ｐａｓｓｗｏｒｄ": SECRET},
        {"command": f"mysql -u root -p{SECRET} app"},
    ],
)
def test_the_audit_record_of_a_tool_call_keeps_no_such_secret(args: dict[str, Any]) -> None:
    from audit.services import audit_event_record

    event = audit_event_record(source="agent", tool="http_call", args=args)
    assert SECRET not in _dump(event.args), event.args


def test_masking_a_long_text_of_command_words_stays_linear() -> None:
    """The mysql-password pattern looked ahead to the line's end from every "mysql": 0.34 s for a tool result's
    20,000 characters, 13 s for 120,000."""
    import time

    from audit.masking import mask_text

    started = time.perf_counter()
    mask_text("mysql " * 20_000 + "-p")
    assert time.perf_counter() - started < 1.0  # a generous bound: quadratic took minutes at this size
    assert mask_text("mysql -u root -phunter22 db") == "mysql -u root -p*** db"
